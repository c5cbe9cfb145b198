"""Query expansion for the BM25 list: synonyms from a file (`term: a, b` one way, `a, b, c` all
equivalent) and pseudo-relevance feedback (RM3-style terms from the top BM25 hits)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from llmkit.errors import BadInput
from llmkit.rag.index.bm25 import tokenize


def load_synonyms(path: str) -> dict[str, list[str]]:
    """Synonym file: `term: syn1, syn2` (one way) or `a, b, c` (all equivalent); '#' comments."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read the synonyms file '{path}' ({e}).") from None
    syn: dict[str, list[str]] = {}
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if ":" in line or "=>" in line:
            head, _, rest = line.replace("=>", ":").partition(":")
            heads, alts = [head.strip()], [a.strip() for a in rest.split(",") if a.strip()]
        else:
            heads = alts = [a.strip() for a in line.split(",") if a.strip()]
        if not heads or not alts:
            raise BadInput(f"{path}:{n}: cannot read {line!r}; write 'term: syn1, syn2' or 'a, b, c'.")
        for h in heads:
            syn.setdefault(h.lower(), []).extend(a for a in alts if a.lower() != h.lower())
    return syn


def prf_terms(index, tokens: list[str], n_terms: int, allowed=None, n_docs: int = 10,
              top=None, texts=None) -> list[tuple[str, float]]:
    """Pseudo-relevance feedback (RM3-style): the terms most probable in the top BM25 hits,
    weighted by each hit's normalised score, that are not in the query and occur in >= 2 chunks.
    `top` [(row, score)] and `texts` replace the index's own ranking and texts (the tuner's
    leave-one-sentence-out runs)."""
    top = top if top is not None else index.bm25.top_k(tokens, n_docs, allowed)
    if not top or n_terms <= 0:
        return []
    weights = np.array([s for _, s in top])
    weights = weights / weights.sum()
    acc: Counter = Counter()
    texts = texts if texts is not None else index.texts([r for r, _ in top])
    for (row, _), w, text in zip(top, weights, texts):
        toks = index.tok_doc(text)
        if not toks:
            continue
        for t, c in Counter(toks).items():
            acc[t] += w * c / len(toks)
    bm = index.bm25
    q = set(tokens)
    out = []
    for t, p in acc.most_common():
        if t in q or bm.doc_freq(t) < 2 or bm.term_idf(t) < 1.0:
            continue
        out.append((t, p * bm.term_idf(t)))
        if len(out) == n_terms:
            break
    return out


def expand_tokens(index, toks: list[str], weights: list[float], n_terms: int, allowed=None,
                  top=None, texts=None) -> tuple[list[str], list[float], list[str]]:
    """The BM25 query with `n_terms` feedback terms added at half the weight of the original words
    (RM3 interpolation): (tokens, weights, added terms)."""
    terms = prf_terms(index, toks, n_terms, allowed, top=top, texts=texts)
    if not terms:
        return toks, weights, []
    best = max(w for _, w in terms)
    return toks + [t for t, _ in terms], weights + [0.5 * w / best for _, w in terms], [t for t, _ in terms]


def expand_synonyms(tokens: list[str], query: str, synonyms: dict, tok=tokenize) -> list[str]:
    """Tokens of the synonyms of query words and phrases (phrases match on the lower-cased query)."""
    extra = []
    low = " ".join(query.lower().split())
    for head, alts in synonyms.items():
        if (" " in head and head in low) or any(t in tokens for t in tok(head)):
            for a in alts:
                extra.extend(t for t in tok(a) if t not in tokens and t not in extra)
    return extra
