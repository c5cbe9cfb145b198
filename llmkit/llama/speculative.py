"""Speculative decoding's acceptance rule as pure functions (no llama.cpp here).

Rejection sampling (Leviathan et al. 2023; Chen et al. 2023): a draft token x proposed with
probability q(x) is accepted with probability min(1, p(x)/q(x)); at the first rejection the next
token is drawn from normalise(max(0, p - q)); if all K are accepted a bonus token comes from p.
The output is distributed exactly as sampling from p alone. Greedy decoding is the special case
of one-hot p and q: accept while the argmaxes agree.
"""

from __future__ import annotations

import numpy as np

from llmkit.llama.sampling import sample


def verify(draft: list[int], q: list[np.ndarray], p: list[np.ndarray], rng: np.random.Generator) -> tuple[int, int]:
    """Accept a prefix of `draft`; returns (number accepted, the token that follows them).

    `q[i]` is the draft's distribution for draft[i]; `p[i]` the target's at the same position,
    with one extra `p[len(draft)]` for the bonus token.

    >>> rng = np.random.default_rng(0)
    >>> one = lambda i: np.eye(3)[i]
    >>> verify([1, 2], [one(1), one(2)], [one(1), one(0), one(2)], rng)
    (1, 0)
    """
    for i, x in enumerate(draft):
        px, qx = p[i][x], q[i][x]
        if qx <= 0.0 or rng.random() >= min(1.0, px / qx):
            residual = np.maximum(p[i] - q[i], 0.0)
            total = residual.sum()
            return i, sample(residual / total if total > 0 else p[i], rng)
    return len(draft), sample(p[len(draft)], rng)


def verify_greedy(draft: list[int], logits: np.ndarray) -> tuple[int, int]:
    """`verify` for greedy decoding from the target's logits (one row per draft, plus one): accept while
    a draft is the argmax; the same answer as `verify` on one-hot p and q, without building them.

    >>> verify_greedy([2, 0], np.array([[0.0, 1.0, 5.0], [0.0, 3.0, 1.0], [1.0, 0.0, 0.0]]))
    (1, 1)
    """
    best = np.argmax(logits[:len(draft) + 1], axis=1)
    for i, x in enumerate(draft):
        if best[i] != x:
            return i, int(best[i])
    return len(draft), int(best[len(draft)])


def verify_sample_and_match(draft: list[int], p: list[np.ndarray], rng: np.random.Generator) -> tuple[int, int]:
    """The weaker rule (llama-cpp-python's draft hook): sample from p, accept while it equals the draft."""
    for i, x in enumerate(draft):
        t = sample(p[i], rng)
        if t != x:
            return i, t
    return len(draft), sample(p[len(draft)], rng)


def lookup_draft(tokens: list[int], ngram_max: int, k: int, ngram_min: int = 1) -> list[int]:
    """Prompt-lookup drafting: find the latest earlier occurrence of the context's last n-gram
    (longest n first) and propose the tokens that followed it.

    >>> lookup_draft([5, 6, 7, 8, 1, 5, 6], 2, 3)
    [7, 8, 1]
    """
    n_tok = len(tokens)
    for n in range(min(ngram_max, n_tok - 1), ngram_min - 1, -1):
        tail = tokens[n_tok - n:]
        for start in range(n_tok - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                follow = tokens[start + n:start + n + k]
                if follow:
                    return follow
    return []


class NgramIndex:
    """Prompt-lookup drafting in constant time per token: for each n-gram length, the latest start of
    every n-gram that has a token after it, updated as tokens arrive (llama.cpp's ngram-cache idea).
    `draft` proposes exactly what `lookup_draft` does on the same tokens.

    >>> ix = NgramIndex(2)
    >>> ix.draft([5, 6, 7, 8, 1, 5, 6], 3)
    [7, 8, 1]
    """

    def __init__(self, ngram_max: int, ngram_min: int = 1):
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.starts: dict[int, dict[tuple, int]] = {n: {} for n in range(ngram_min, ngram_max + 1)}
        self.n_seen = 0  # the context's first n_seen tokens are indexed

    def reset(self) -> None:
        """Forget everything (the context was cut by a context shift)."""
        self.starts = {n: {} for n in self.starts}
        self.n_seen = 0

    def extend(self, tokens: list[int]) -> None:
        """Index the tokens after those seen; `tokens` must start with them (else call reset first).

        >>> ix = NgramIndex(2)
        >>> ix.extend([5, 6, 5, 6, 7])
        >>> ix.starts[2]
        {(5, 6): 2, (6, 5): 1}
        """
        if self.n_seen > len(tokens):
            self.reset()
        first, end = max(self.n_seen, 1), len(tokens)  # token i follows the n-grams that end at i - 1
        for n, table in self.starts.items():
            lo = max(first, n) - n  # the new n-grams start at lo .. end - n - 1
            if lo < end - n:
                # zip builds the n-gram tuples in C (a whole prompt at once); later starts overwrite earlier ones
                table.update(zip(zip(*(tokens[lo + j:end - n + j] for j in range(n))), range(lo, end - n)))
        self.n_seen = end

    def draft(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the context's last n-gram."""
        self.extend(tokens)
        n_tok = len(tokens)
        for n in range(min(self.ngram_max, n_tok - 1), self.ngram_min - 1, -1):
            start = self.starts[n].get(tuple(tokens[n_tok - n:]))
            if start is not None:
                return list(tokens[start + n:start + n + k])
        return []


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens produced by one verification of k drafts with acceptance rate alpha.

    >>> round(expected_tokens(0.5, 2), 3)
    1.75
    """
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
