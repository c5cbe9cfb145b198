"""A text at a token budget: `truncate` keeps its head, its tail or both around a marker; `split` cuts it
into pieces of at most N tokens whose concatenation is the text, at line ends where it can, then at
sentence ends, then at token boundaries.

Tokens are counted as `tokenize count` counts them (special tokens not added). The tokens of a joined
text need not be the sum of its parts' (a merge can span the joint), so every result is encoded
again and checked against the budget before it is returned.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from llmkit.errors import OptionError
from llmkit.tokenize.corpus.count import count_texts

BLOCK_CHARS = 1 << 20
# a sentence ends at . ! ? (and their CJK forms) with any closing quotes or brackets, then whitespace
_SENTENCE_END = re.compile(r"[.!?\u3002\uff01\uff1f\u2026]+[\"'\u201d\u2019)\]]*\s+")


def n_tokens(tok, text: str) -> int:
    """Tokens of one text, special tokens not added."""
    return count_texts(tok, [text])[0] if text else 0


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _window(tok, text: str, k: int, from_end: bool) -> tuple[str, list[int]] | None:
    """(the shortest doubling window at the start or end of `text` with more than k tokens, its ids),
    or None when the whole text has at most k tokens."""
    size = min(len(text), max(256, 8 * k))
    while True:
        w = text[len(text) - size:] if from_end else text[:size]
        ids = _ids(tok, w)
        if len(ids) > k:
            return w, ids
        if size == len(text):
            return None
        size = min(len(text), 2 * size)


def head_cut(tok, text: str, k: int) -> int:
    """The length of the longest prefix of `text` with at most k tokens, found at a token boundary
    when the tokenizer decodes its ids back to the text (byte-level BPE), else by bisection."""
    if k <= 0 or not text:
        return 0
    found = _window(tok, text, k, from_end=False)
    if found is None:
        return len(text)
    w, ids = found
    for j in range(k, max(k - 8, 0), -1):  # a cut inside a character decodes to U+FFFD: one token less
        prefix = tok.decode(ids[:j])
        if prefix and w.startswith(prefix) and n_tokens(tok, prefix) <= k:
            return len(prefix)
    lo, hi = 0, len(w)  # n_tokens(w[:lo]) <= k < n_tokens(w[:hi])
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if n_tokens(tok, w[:mid]) <= k:
            lo = mid
        else:
            hi = mid
    return lo


def tail_cut(tok, text: str, k: int) -> int:
    """Where the longest suffix of `text` with at most k tokens starts (see head_cut)."""
    if k <= 0 or not text:
        return len(text)
    found = _window(tok, text, k, from_end=True)
    if found is None:
        return 0
    w, ids = found
    base = len(text) - len(w)
    for j in range(k, max(k - 8, 0), -1):
        suffix = tok.decode(ids[-j:])
        if suffix and w.endswith(suffix) and n_tokens(tok, suffix) <= k:
            return len(text) - len(suffix)
    lo, hi = 0, len(w)  # n_tokens(w[lo:]) > k >= n_tokens(w[hi:])
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if n_tokens(tok, w[mid:]) <= k:
            hi = mid
        else:
            lo = mid
    return base + hi


@dataclass
class Truncated:
    text: str
    tokens: int  # of `text`
    input_tokens: int
    cut: bool  # False when the input fitted and is returned whole

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "input_tokens": self.input_tokens, "cut": self.cut, "text": self.text}


KEEPS = ("head", "tail", "both")


def truncate(tok, text: str, max_tokens: int, keep: str = "head", marker: str = "") -> Truncated:
    """`text` cut to at most `max_tokens` tokens, keeping its head, its tail or both (half each); the
    marker stands where text was removed (after the head, before the tail, or between them) and
    counts toward the budget. A text that fits is returned whole, without the marker."""
    if keep not in KEEPS:
        raise OptionError("{keep} must be head, tail or both, not {value!r}. Pass one of those three.", value=keep)
    total = n_tokens(tok, text)
    if total <= max_tokens:
        return Truncated(text, total, total, False)
    m = n_tokens(tok, marker)
    if m > max_tokens:
        raise OptionError("the {marker} alone takes {m} tokens, more than {max_tokens} {n}. Raise {max_tokens} "
                          "or shorten the {marker}.", m=m, n=max_tokens)
    budget = max_tokens - m
    while True:
        if keep == "head":
            out = text[:head_cut(tok, text, budget)] + marker
        elif keep == "tail":
            out = marker + text[tail_cut(tok, text, budget):]
        else:
            a = head_cut(tok, text, (budget + 1) // 2)
            b = max(a, tail_cut(tok, text, budget // 2))
            out = text[:a] + marker + text[b:]
        n = n_tokens(tok, out)
        if n <= max_tokens or budget == 0:
            return Truncated(out, n, total, True)
        budget = max(0, budget - (n - max_tokens))


def _token_cuts(tok, text: str, max_tokens: int) -> Iterator[tuple[str, int]]:
    """`text` cut at token boundaries into parts of at most max_tokens tokens."""
    # each cut looks at a bounded view: slicing off the rest of a long line every time would be quadratic
    view = max(4096, 64 * max_tokens)
    pos = 0
    while pos < len(text):
        cut = head_cut(tok, text[pos:pos + view], max_tokens)
        if cut == 0:
            raise OptionError("the character {char!r} alone takes more than {max_tokens} {n} tokens. Raise "
                              "{max_tokens}.", char=text[pos], n=max_tokens)
        part = text[pos:pos + cut]
        pos += cut
        yield part, n_tokens(tok, part)


def _units(tok, lines: list[str], max_tokens: int) -> Iterator[tuple[str, int]]:
    """Lines with their tokens; a line over the budget as its sentences, a sentence over it cut at
    token boundaries."""
    for line, n in zip(lines, count_texts(tok, lines)):
        if n <= max_tokens:
            yield line, n
            continue
        cuts = [m.end() for m in _SENTENCE_END.finditer(line) if m.end() < len(line)]
        sentences = [line[a:b] for a, b in zip([0] + cuts, cuts + [len(line)])]
        for s, k in zip(sentences, count_texts(tok, sentences)):
            if k <= max_tokens:
                yield s, k
            else:
                yield from _token_cuts(tok, s, max_tokens)


def _first_piece(tok, units: list[tuple[str, int]], max_tokens: int) -> tuple[str, int, int]:
    """(text, tokens, units used) of the longest run of units from the start that fits the budget,
    counted as one text (each unit alone fits)."""
    j, est = 0, 0
    while j < len(units) and (j == 0 or est + units[j][1] <= max_tokens):
        est += units[j][1]
        j += 1
    while True:
        text = "".join(u for u, _ in units[:j])
        n = n_tokens(tok, text)
        if n <= max_tokens or j == 1:
            return text, n, j
        j -= 1


def split(tok, lines: Iterable[str], max_tokens: int) -> Iterator[tuple[str, int]]:
    """Pieces (text, tokens) of at most `max_tokens` tokens whose concatenation is the input (its lines,
    endings kept); streamed, a block of lines at a time."""
    if max_tokens < 1:
        raise OptionError("{max_tokens} must be at least 1 to split, not {n}. Pass a budget of 1 token or more.",
                          n=max_tokens)

    def blocks() -> Iterator[list[str]]:
        block, size = [], 0
        for line in lines:
            block.append(line)
            size += len(line)
            if size >= BLOCK_CHARS:
                yield block
                block, size = [], 0
        if block:
            yield block

    pending: list[tuple[str, int]] = []
    est = 0
    for block in blocks():
        for unit in _units(tok, block, max_tokens):
            pending.append(unit)
            est += unit[1]
            while est > max_tokens:
                text, n, j = _first_piece(tok, pending, max_tokens)
                yield text, n
                del pending[:j]
                est = sum(k for _, k in pending)
    while pending:
        text, n, j = _first_piece(tok, pending, max_tokens)
        yield text, n
        del pending[:j]
