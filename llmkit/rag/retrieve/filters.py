"""Restrictions applied inside retrieval: metadata filters (the index's metadata table, read through
`index/catalog.py`), collection masks and required terms (postings for words, the text for phrases), each a
boolean mask over the index's rows (None: no restriction), combined with `both`."""

from __future__ import annotations

import re

import numpy as np

from llmkit.errors import BadInput


_FILTER = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(>=|<=|!=|=|>|<|~)\s*(.*)$")


def parse_filter(expr: str) -> tuple[str, str, str]:
    """'date>=2025-01-01' -> ('date', '>=', '2025-01-01'); '~' is a substring match, '=' takes * globs."""
    m = _FILTER.match(expr)
    if not m:
        raise BadInput(f"cannot read the filter {expr!r}. Write FIELD=VALUE, FIELD!=VALUE, FIELD>=VALUE, "
                       "FIELD<VALUE or FIELD~TEXT (e.g. source=notes/*, 'date>=2025-01-01').")
    return m.group(1), m.group(2), m.group(3).strip().strip("'\"")


_IDENT = re.compile(r"\"([^\"]+)\"|“([^”]+)”|'([^']{3,})'|(\b\w+)\(\)|(\b[A-Za-z]+_\w+\b)|(\b[a-z]+[A-Z]\w*\b)"
                    r"|(\b[A-Z][A-Z0-9]{1,}\b)|(\b(?=\w*\d)(?=\w*[A-Za-z])[\w.-]+\w\b)")
_STOP_CAPS = {"I", "A", "AN", "THE", "OR", "AND", "OF", "IN", "ON", "TO", "IS"}


def detect_required(query: str) -> list[str]:
    """Quoted phrases, identifiers (snake_case, camelCase, f(), ALLCAPS, words with digits) and
    capitalised names after the first word: the terms an answer must contain. `f()` requires the name `f`,
    so a call with arguments or a mention without parentheses counts.

    >>> detect_required('How does "page cache" work with kmalloc() and CONFIG_SLUB in ext4 for Linus Torvalds?')
    ['page cache', 'kmalloc', 'CONFIG_SLUB', 'ext4', 'Linus', 'Torvalds']
    """
    found = []
    for m in _IDENT.finditer(query):
        term = next(g for g in m.groups() if g)
        if term.upper() in _STOP_CAPS and term.isupper():
            continue
        found.append(term)
    spans = [m.span() for m in _IDENT.finditer(query)]
    for m in re.finditer(r"(?<=\S\s)([A-Z][a-z]{2,})\b", query):
        if not any(a <= m.start() < b for a, b in spans) and m.group(1) not in found:
            found.append(m.group(1))
    return found


def filter_mask(index, filters: list[str]) -> np.ndarray | None:
    """Rows whose metadata satisfies every filter (`catalog.filter_ids`: the indexed metadata table)."""
    if not filters:
        return None
    from llmkit.rag.index.catalog import filter_ids

    fields = set(index.manifest.get("fields", []))
    conditions = [parse_filter(expr) for expr in filters]
    for key, _, _ in conditions:
        if key not in fields:
            raise BadInput(f"unknown filter field '{key}'. Fields in this index: {', '.join(sorted(fields))}.")
    ids = filter_ids(index.con, conditions)
    mask = np.zeros(index.n, bool)
    mask[index.rows_of_ids(ids)] = True
    return mask


def collection_mask(index, names: list[str]) -> np.ndarray | None:
    """Rows of these collections (None: no restriction)."""
    if not names:
        return None
    unknown = [c for c in names if c not in index.collections]
    if unknown:
        raise BadInput(f"no collection '{unknown[0]}' in this index. Collections: {', '.join(index.collections) or 'none'}.")
    codes = [index.collections.index(c) for c in names]
    return np.isin(index.collection, codes)


def must_mask(index, terms: list[str]) -> np.ndarray | None:
    """Rows containing every term (single words from the postings; phrases checked in the text)."""
    if not terms:
        return None
    mask = np.ones(index.n, bool)
    for term in terms:
        groups = index.tok_groups(term)  # a word is present when any of its terms is (stem or plain form)
        if not groups:
            continue
        m = np.zeros(index.n, bool)
        cand = None
        for g in set(groups):
            p = np.unique(np.concatenate([index.bm25.postings(t) for t in g]))
            cand = p if cand is None else np.intersect1d(cand, p, assume_unique=True)
        m[cand] = True
        m &= mask
        if len(groups) > 1 or not re.fullmatch(r"[\w]+", term):
            needle = term.lower()
            rows = np.flatnonzero(m)
            for r, text in zip(rows.tolist(), index.texts(rows)):
                if needle not in " ".join(text.lower().split()):
                    m[r] = False
        mask &= m
    return mask


def both(a, b):
    """The intersection of two masks, either of which may be None (no restriction)."""
    if a is None:
        return b
    if b is None:
        return a
    return a & b
