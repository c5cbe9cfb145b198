"""WordPiece: merge the pair with the highest likelihood score, encode by greedy longest match.

score(a, b) = freq(ab) / (freq(a) * freq(b)) — a pair is merged when its parts are more often
together than their own frequencies predict. (HF's WordPieceTrainer ranks by raw pair count like
BPE; this is the score the WordPiece papers and the HF course describe.) Word-internal pieces carry
the '##' continuation prefix.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from llmkit.errors import BadInput
from llmkit.tokenize import pretok
from llmkit.tokenize.pieces import Progress, Trace, Vocab, WordEncoder, check_vocab_size, merge_pair


@dataclass
class WordPieceTrainResult:
    vocab: list[str]
    special_tokens: list[str] = field(default_factory=list)


def train_wordpiece(
    word_counts: dict[str, int],
    vocab_size: int,
    min_frequency: int = 0,
    special_tokens: Iterable[str] = (),
    prefix: str = "##",
    progress: Progress | None = None,
    trace: Trace | None = None,
    trace_top: int = 5,
) -> WordPieceTrainResult:
    """Learn a WordPiece vocabulary from {word: count}.

    Ties in score go to the pair seen first in the corpus (word order, then position in the word),
    the rule of the HF course's reference implementation; the result is deterministic.

    >>> train_wordpiece({"hug": 10, "pug": 5, "pun": 12, "bun": 4, "hugs": 5}, 10).vocab
    ['b', 'h', 'p', '##g', '##n', '##s', '##u', '##gs', 'hu', 'hugs']
    """
    specials = list(dict.fromkeys(special_tokens))
    firsts, rests = set(), set()
    for w in word_counts:
        if w:
            firsts.add(w[0])
            rests.update(w[1:])
    vocab = Vocab(specials + sorted(firsts, key=ord) + [prefix + c for c in sorted(rests, key=ord)])
    check_vocab_size(vocab_size, len(vocab))
    id_to_tok, tok_to_id = vocab.tokens, vocab.ids

    words: list[list[int]] = []
    counts: list[int] = []
    freq: dict[int, int] = defaultdict(int)
    for w, c in word_counts.items():
        if not w:
            continue
        ids = [tok_to_id[w[0]]] + [tok_to_id[prefix + ch] for ch in w[1:]]
        words.append(ids)
        counts.append(c)
        for t in ids:
            freq[t] += c

    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    # pair -> words containing it, as lists (duplicates allowed, removed when used): a list costs
    # a third of a set per pair, and there are ~10^6 pairs on 10 MB of text
    where: dict[tuple[int, int], list[int]] = defaultdict(list)
    pairs_of: dict[int, set[tuple[int, int]]] = defaultdict(set)
    first_seen: dict[tuple[int, int], tuple[int, int]] = {}
    for i, w in enumerate(words):
        c = counts[i]
        for j, p in enumerate(zip(w, w[1:])):
            pair_counts[p] += c
            if not where[p] or where[p][-1] != i:
                where[p].append(i)
            if p not in first_seen:
                first_seen[p] = (i, j)
    for p in pair_counts:
        pairs_of[p[0]].add(p)
        pairs_of[p[1]].add(p)

    def score(p: tuple[int, int]) -> float:
        c = pair_counts[p]
        return c / (freq[p[0]] * freq[p[1]]) if c > 0 else 0.0

    heap = [(-score(p), first_seen[p], p[0], p[1]) for p in pair_counts]
    heapq.heapify(heap)
    total_steps = max(1, vocab_size - len(id_to_tok))
    step = 0
    while len(tok_to_id) < vocab_size and heap:
        negs, order, a, b = heapq.heappop(heap)
        p = (a, b)
        c = pair_counts[p]
        if c <= 0 or c < min_frequency:
            continue
        s = score(p)
        if s != -negs:
            heapq.heappush(heap, (-s, order, a, b))  # stale entry: re-queue with the current score
            continue
        if trace is not None:
            cand = [(s, a, b)]
            for e in heapq.nsmallest(trace_top * 4, heap):
                q = (e[2], e[3])
                if pair_counts[q] > 0 and score(q) == -e[0] and q != p and (-e[0], q[0], q[1]) not in cand:
                    cand.append((-e[0], q[0], q[1]))
            trace({
                "step": step + 1,
                "merge": [id_to_tok[a], id_to_tok[b]],
                "score": s,
                "pair_count": c,
                "top_scores": [[id_to_tok[x], id_to_tok[y], sc] for sc, x, y in cand[:trace_top]],
            })
        tb = id_to_tok[b]
        nid = vocab.add(id_to_tok[a] + (tb[len(prefix):] if tb.startswith(prefix) else tb))
        touched: set[tuple[int, int]] = set()
        for wi in sorted(set(where.pop(p, ()))):
            w = words[wi]
            wc = counts[wi]
            n_before = len(w)
            for q, i in merge_pair(w, a, b, nid, wc, pair_counts):
                where[q].append(wi)
                if q not in first_seen:
                    first_seen[q] = (wi, i)
                pairs_of[q[0]].add(q)
                pairs_of[q[1]].add(q)
                touched.add(q)
            merged = (n_before - len(w)) * wc
            freq[a] -= merged
            freq[b] -= merged
            freq[nid] += merged
        pair_counts[p] = 0
        # scores rise for every pair that shares a part whose frequency just fell
        for t in (a, b):
            if freq[t] > 0:
                live = {q for q in pairs_of[t] if pair_counts[q] > 0}
                pairs_of[t] = live
                touched |= live
        for q in touched:
            if pair_counts[q] > 0:
                heapq.heappush(heap, (-score(q), first_seen[q], q[0], q[1]))
        step += 1
        if progress is not None and step % 64 == 0:
            progress(step, total_steps, "merges")
    if progress is not None:
        progress(step, total_steps, "merges")
    return WordPieceTrainResult(vocab=id_to_tok, special_tokens=specials)


class WordPiece(WordEncoder):
    """Greedy longest-match-first WordPiece encoder with BERT normalization and pre-tokenization."""

    algorithm = "wordpiece"

    def __init__(
        self,
        vocab: dict[str, int],
        unk_token: str = "[UNK]",
        prefix: str = "##",
        max_input_chars_per_word: int = 100,
        lowercase: bool = False,
        bert_normalizer: bool = True,
    ):
        self.vocab = vocab
        self.unk_token = unk_token
        self.prefix = prefix
        self.max_chars = max_input_chars_per_word
        self.lowercase = lowercase
        self.bert_normalizer = bert_normalizer
        self.id_to_token = {i: t for t, i in vocab.items()}
        self.max_len = max((len(t) for t in vocab), default=1)
        self._cache: dict[str, list[int]] = {}

    def pre_tokenize(self, text: str) -> list[str]:
        if self.bert_normalizer:
            text = pretok.bert_normalize(text, self.lowercase)
        elif self.lowercase:
            text = text.lower()
        return pretok.split_bert(text)

    def encode_word(self, word: str) -> list[int]:
        """Greedy longest match from the left; the whole word becomes [UNK] if any part fails.

        >>> WordPiece({"b": 0, "##u": 1, "##gs": 2, "[UNK]": 3}).encode_word("bugs")
        [0, 1, 2]
        """
        vocab = self.vocab
        if len(word) > self.max_chars:
            return [self._unk()]
        out = []
        start = 0
        n = len(word)
        while start < n:
            end = min(n, start + self.max_len)
            found = None
            while end > start:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                i = vocab.get(piece)
                if i is not None:
                    found = i
                    break
                end -= 1
            if found is None:
                return [self._unk()]
            out.append(found)
            start = end
        return out

    def _unk(self) -> int:
        i = self.vocab.get(self.unk_token)
        if i is None:
            raise BadInput(f"a word cannot be covered and the vocabulary has no '{self.unk_token}' token.")
        return i

    def decode(self, ids: list[int]) -> str:
        """Join pieces: '##' pieces attach to the previous one, others get a space."""
        parts: list[str] = []
        for i in ids:
            t = self.id_to_token[i]
            if t.startswith(self.prefix) and parts:
                parts[-1] += t[len(self.prefix):]
            else:
                parts.append(t)
        return " ".join(parts)
