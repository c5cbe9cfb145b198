"""Prompt compression: fit retrieved passages into a token budget.

1. Sentence selection: every sentence is scored by its relevance to the query (cosine of sentence
   embeddings when an embedder is given, else the share of query words it contains); the best
   sentences are kept, in their original order, until the budget is reached.
2. Token dropping (LLMLingua's idea), when a small language model is given: sentences are first
   selected up to 1.5x the budget, then the tokens the model finds least surprising (lowest
   -log p given the preceding text: the most predictable, least informative) are dropped until
   the budget is met. Query words are never dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from llmkit.errors import OptionError
from llmkit.rag.index.bm25 import tokenize

_SENT = re.compile(r"[^.!?。！？；\n]+(?:[.!?。！？；]+[\"'”’)]*|\n|$)")


@dataclass
class Compressed:
    texts: list[str]
    tokens_before: int
    tokens_after: int

    @property
    def ratio(self) -> float:
        return self.tokens_before / max(self.tokens_after, 1)


def sentences(text: str) -> list[str]:
    """Split text into sentences (Latin and Chinese end marks, line breaks).

    >>> sentences("One here. Two! 三句。")
    ['One here.', 'Two!', '三句。']
    """
    return [s.strip() for s in _SENT.findall(text) if s.strip()]


def compress(query: str, texts: list[str], budget: int, count_tokens, embedder=None, llm=None) -> Compressed:
    """Compress passages to about `budget` tokens (count_tokens measures them)."""
    if budget < 8:
        raise OptionError("{compress_to} {budget} is too small; give at least 8 tokens.", budget=budget)
    before = sum(count_tokens(t) for t in texts)
    if before <= budget:
        return Compressed(list(texts), before, before)
    sents = [(i, s) for i, t in enumerate(texts) for s in sentences(t)]
    if not sents:
        return Compressed(list(texts), before, before)
    sizes = np.array([count_tokens(s) for _, s in sents])
    if embedder is not None:
        q = embedder.queries([query])[0]
        rel = embedder.passages([s for _, s in sents]) @ q
    else:
        qt = set(tokenize(query))
        rel = np.array([len(qt & set(tokenize(s))) / (len(qt) or 1) for _, s in sents])
    # earlier passages ranked higher: a small bonus keeps ties in retrieval order
    rel = rel - 1e-3 * np.array([i for i, _ in sents])
    target = int(budget * 1.5) if llm is not None else budget
    keep, used = set(), 0
    for j in np.argsort(-rel, kind="stable"):
        if used + sizes[j] <= target:
            keep.add(int(j))
            used += int(sizes[j])
    out = [" ".join(s for j, (i, s) in enumerate(sents) if i == k and j in keep) for k in range(len(texts))]
    if llm is not None and sum(count_tokens(t) for t in out) > budget:
        out = _drop_tokens(query, out, budget, llm)
    after = sum(count_tokens(t) for t in out)
    return Compressed(out, before, after)


def _protected(llm, text: str, toks: list[int], qwords: set[str]) -> list[int]:
    """Indices of the tokens that overlap a query word of `text` (a word the model splits into
    several tokens is protected whole, not only a token that happens to be the whole word)."""
    spans = [m.span() for m in re.finditer(r"\w+", text) if set(tokenize(m.group())) & qwords]
    if not spans:
        return []
    ends = [len(llm.detokenize(toks[:i + 1])) for i in range(len(toks))]
    out, start = [], 0
    for i, end in enumerate(ends):
        if any(a < end and start < b for a, b in spans):
            out.append(i)
        start = end
    return out


def _drop_tokens(query: str, texts: list[str], budget: int, llm) -> list[str]:
    qwords = set(tokenize(query))
    per = []
    for t in texts:
        toks, surprisal = llm.surprisal(t) if t else ([], np.zeros(0))
        s = surprisal.copy()
        s[_protected(llm, t, toks, qwords)] = np.inf  # never drop pieces of the query's own words
        per.append((toks, s))
    total = sum(len(t) for t, _ in per)
    drop = total - budget
    if drop <= 0:
        return texts
    allsurp = np.concatenate([s for _, s in per])
    cut = np.sort(allsurp)[drop - 1]
    out, dropped = [], 0
    for toks, s in per:
        kept = []
        for tok, v in zip(toks, s):
            if v <= cut and dropped < drop:
                dropped += 1
                continue
            kept.append(tok)
        out.append(llm.detokenize(kept).strip())
    return out
