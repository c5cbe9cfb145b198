"""Duplicate chunks: exact duplicates share a key of their case- and whitespace-normalised text;
near-duplicates are found with MinHash signatures of token 3-shingles and LSH banding."""

from __future__ import annotations

import hashlib
import zlib

import numpy as np

from llmkit.errors import OptionError


def text_key(text: str) -> str:
    """Hash of the case- and whitespace-normalised text: equal keys are exact duplicates."""
    return hashlib.blake2b(" ".join(text.lower().split()).encode("utf-8"), digest_size=16).hexdigest()


N_PERM = 64
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_SEEDS = None  # the hash seeds, made on first use (importing numpy.random is not free)


def _seeds() -> np.ndarray:
    global _SEEDS
    if _SEEDS is None:
        _SEEDS = np.random.default_rng(20241129).integers(1, 2**63, size=N_PERM, dtype=np.uint64) | np.uint64(1)
    return _SEEDS


def minhash(tokens: list[str], shingle: int = 3) -> np.ndarray:
    """MinHash signature (64 x uint32) of the token 3-shingles: equal rows estimate Jaccard similarity."""
    if not tokens:
        return np.zeros(N_PERM, np.uint32)
    h = np.fromiter((zlib.crc32(t.encode("utf-8")) for t in tokens), np.uint64, len(tokens))
    if len(h) >= shingle:
        sh = h[:len(h) - shingle + 1].copy()
        for k in range(1, shingle):
            sh = sh * np.uint64(0x100000001B3) ^ h[k:len(h) - shingle + 1 + k]
    else:
        sh = h
    sh = np.unique(sh)
    with np.errstate(over="ignore"):
        mixed = (sh[None, :] ^ _seeds()[:, None]) * np.uint64(0x9E3779B97F4A7C15)
        mixed ^= mixed >> np.uint64(29)
        mixed *= np.uint64(0xBF58476D1CE4E5B9)
    return (mixed.min(axis=1) >> np.uint64(32)).astype(np.uint32)


def near_duplicates(signatures: np.ndarray, threshold: float = 0.9, bands: int = 16) -> np.ndarray:
    """For each row, the index of an earlier near-duplicate (estimated Jaccard >= threshold), or -1.

    LSH banding: rows that agree on a whole band become candidates, then the full signatures decide.
    """
    n = len(signatures)
    dup = np.full(n, -1, np.int64)
    if n < 2:
        return dup
    r = signatures.shape[1] // bands
    for b in range(bands):
        band = np.ascontiguousarray(signatures[:, b * r:(b + 1) * r]).view(np.dtype((np.void, 4 * r))).ravel()
        order = np.argsort(band, kind="stable")  # equal bands: ascending row order
        sb = band[order]
        is_start = np.concatenate([[True], sb[1:] != sb[:-1]])
        starts = np.flatnonzero(is_start)
        first = order[starts[np.cumsum(is_start) - 1]]  # earliest row of each row's bucket
        later = order[~is_start]
        first = first[~is_start]
        if not len(later):
            continue
        similar = (signatures[first] == signatures[later]).mean(axis=1) >= threshold
        for f, l in zip(first[similar].tolist(), later[similar].tolist()):
            if dup[l] < 0 or f < dup[l]:
                dup[l] = f
    for i in range(n):  # point every duplicate at the first row of its chain
        if dup[i] >= 0 and dup[dup[i]] >= 0:
            dup[i] = dup[dup[i]]
    return dup


def dedupe_setting(value: str) -> tuple[bool, float]:
    """(drop duplicates, near-duplicate threshold) of a dedupe setting: 'off', or the MinHash Jaccard
    similarity from which a chunk is a near-duplicate of an earlier one (exact duplicates always go).

    >>> dedupe_setting("0.8"), dedupe_setting("off")
    ((True, 0.8), (False, 0.9))
    """
    if value.strip().lower() == "off":
        return False, 0.9
    try:
        threshold = float(value)
    except ValueError:
        threshold = float("nan")
    if not 0 < threshold <= 1:
        raise OptionError("{dedupe} takes off or a similarity in (0, 1], not {value!r}.", value=value)
    return True, threshold
