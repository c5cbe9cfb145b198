"""Split section text into chunks.

Recursive splitting (the default). Every position in the text gets a boundary strength:
paragraph (blank line) 4 > line break 3 > sentence end 2 (`. ! ?` followed by space, and the
Chinese marks `。！？；` with or without space) > word 1 (whitespace, or between two CJK
characters). A chunk starting at s ends at the strongest boundary in (s + size/2, s + size],
the furthest one among equals; only when there is none does it cut mid-word at s + size. So a
chunk never ends mid-sentence when a sentence boundary lies in its second half.

Overlap, defined exactly: the next chunk starts at the earliest sentence boundary inside the last
`overlap` characters of the previous chunk; if no sentence boundary lies there, at the earliest
word boundary there. So consecutive chunks of one parent always share at most `overlap`
characters, as much as whole sentences (else whole words) allow — also after a paragraph break,
never across parents (sections). overlap=0 gives disjoint chunks.

Sliding window (`window`): units are words (whitespace-separated) and single CJK characters;
windows of `size` units start every `size - overlap` units, so every consecutive pair shares
exactly `overlap` units; the last window is the one that reaches the end (it may be shorter).

Small-to-big: a section is first cut into parents (recursive, `parent_size`, no overlap); chunks
are cut inside each parent, so a chunk belongs to exactly one parent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from llmkit.errors import BadInput

_PARA = re.compile(r"\n[ \t]*\n\s*")
_LINE = re.compile(r"\n")
_SENT = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+|(?<=[。！？；!?])[」』”’）]*\s*")
_SPACE = re.compile(r"\s+")
_CJK_PAIR = re.compile(r"(?<=[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uac00-\ud7af])(?=[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uac00-\ud7af])")
_UNIT = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uac00-\ud7af]|[^\s\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff\uac00-\ud7af]+")


@dataclass
class Span:
    start: int
    end: int
    text: str


def boundaries(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Sorted boundary positions and their strengths (4 paragraph, 3 line, 2 sentence, 1 word).

    >>> pos, lvl = boundaries("One. Two\\n\\nThree")
    >>> list(zip(pos.tolist(), lvl.tolist()))
    [(5, 2), (9, 3), (10, 4)]
    """
    found: dict[int, int] = {}
    for level, rx in ((1, _SPACE), (1, _CJK_PAIR), (2, _SENT), (3, _LINE), (4, _PARA)):
        for m in rx.finditer(text):
            e = m.end()
            if 0 < e < len(text) and found.get(e, 0) < level:
                found[e] = level
    if not found:
        return np.zeros(0, np.int64), np.zeros(0, np.int8)
    pos = np.fromiter(sorted(found), np.int64, len(found))
    return pos, np.fromiter((found[p] for p in pos.tolist()), np.int8, len(pos))


def recursive_spans(text: str, size: int, overlap: int = 0, starts: np.ndarray | None = None) -> list[Span]:
    """Cut text into chunks of at most `size` characters at the strongest boundaries (module doc).
    With `starts` (the sorted start offsets of the text's model tokens), `size` and `overlap` count
    model tokens instead: a chunk holds at most `size` tokens.

    >>> [s.text for s in recursive_spans("One two. Three four five.", 3, 0, np.array([0, 4, 9, 15, 20]))]
    ['One two.', 'Three four five.']
    """
    if starts is None:
        check_size(size, overlap)
    elif size < 1 or not 0 <= overlap <= size // 2:
        raise BadInput(f"a chunk of {size} tokens cannot overlap by {overlap}; use 0 to half the size.")
    n = len(text)
    pos, lvl = boundaries(text)
    spans: list[Span] = []
    s = _skip_space(text, 0)
    while s < n:
        if starts is None:
            half, limit = s + size // 2, s + size
        else:  # the first character of token size // 2 and of the first token past the size
            i = int(np.searchsorted(starts, s, "left"))
            fill = size // 2
            half = int(starts[i + fill]) if i + fill < len(starts) else n
            limit = int(starts[i + size]) if i + size < len(starts) else n
        if limit >= n:
            e = n
        else:
            lo, hi = np.searchsorted(pos, half, "right"), np.searchsorted(pos, limit, "right")
            if hi > lo:
                window = lvl[lo:hi]
                best = np.flatnonzero(window == window.max())[-1]
                e = int(pos[lo + best])
            else:
                e = limit
        piece = text[s:e]
        if piece.strip():
            a = s + len(piece) - len(piece.lstrip())
            spans.append(Span(a, a + len(piece.strip()), piece.strip()))
        if e >= n:
            break
        if overlap and starts is not None:  # the overlap's first character, counted in tokens
            j = int(np.searchsorted(starts, e, "left"))
            back = int(starts[max(j - overlap, 0)])
            s = _overlap_start(pos, lvl, s, e, e - back)
        else:
            s = _overlap_start(pos, lvl, s, e, overlap) if overlap else e
        s = _skip_space(text, s)
    return spans


def _overlap_start(pos, lvl, s: int, e: int, overlap: int) -> int:
    lo, hi = np.searchsorted(pos, max(e - overlap, s + 1), "left"), np.searchsorted(pos, e, "left")
    if hi <= lo:
        return e
    window = lvl[lo:hi]
    for min_level in (2, 1):
        idx = np.flatnonzero(window >= min_level)
        if len(idx):
            return int(pos[lo + idx[0]])
    return e


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def window_spans(text: str, size: int, overlap: int = 0) -> list[Span]:
    """Fixed windows of `size` words/CJK characters, consecutive windows sharing `overlap` of them.

    >>> [s.text for s in window_spans("a b c d e", 3, 1)]
    ['a b c', 'c d e']
    """
    if size < 1 or not 0 <= overlap < size:
        raise BadInput(f"window chunks need size >= 1 and 0 <= overlap < size (got size {size}, overlap {overlap}).")
    units = [(m.start(), m.end()) for m in _UNIT.finditer(text)]
    spans, step = [], size - overlap
    for i in range(0, max(len(units), 1), step):
        if i >= len(units):
            break
        j = min(i + size, len(units))
        a, b = units[i][0], units[j - 1][1]
        spans.append(Span(a, b, text[a:b]))
        if j == len(units):
            break
    return spans


def check_size(size: int, overlap: int) -> None:
    """Refuse recursive chunk sizes below 20 characters and overlaps above half the size."""
    if size < 20:
        raise BadInput(f"chunk size {size} is too small; use at least 20 characters.")
    if not 0 <= overlap <= size // 2:
        raise BadInput(f"overlap {overlap} must be between 0 and half the chunk size ({size // 2}).")


# -- cleaning ---------------------------------------------------------------------------------------

def normalize_whitespace(text: str) -> str:
    """Unify line endings, drop trailing spaces and control characters, collapse 3+ blank lines.

    >>> normalize_whitespace("a  \\r\\nb\\t\\x0c\\n\\n\\n\\nc")
    'a\\nb\\n\\nc'
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u00a0", " ")
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", text)
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def boilerplate_lines(docs_lines: list[set[str]], min_docs: int = 5, min_share: float = 0.3) -> set[str]:
    """Lines (of >= 8 characters) repeated in at least `min_docs` documents and `min_share` of all:
    headers, footers, navigation and licence banners."""
    if len(docs_lines) < min_docs:
        return set()
    from collections import Counter

    counts = Counter(line for lines in docs_lines for line in lines if len(line) >= 8)
    need = max(min_docs, min_share * len(docs_lines))
    return {line for line, c in counts.items() if c >= need}


def strip_lines(text: str, drop: set[str]) -> str:
    if not drop:
        return text
    return "\n".join(line for line in text.split("\n") if line.strip() not in drop)
