"""Deduplicating a small update in proportion to the change, with the result of a full pass.

The full pass (`chunk.dedupe.near_duplicates` over every live chunk, in chunk id order) keeps a
chunk unless an earlier one has its duplicate key (an exact duplicate) or, among the chunks left,
the first chunk of one of its 16 LSH band buckets is similar enough (a near-duplicate). So a run
that adds and removes a few chunks can only change the status of: the chunks now first of a key
that a removed or added chunk has (they enter or leave that set), and the chunks sharing a band
bucket with one of those. `update` finds them by lookups and decides each as the full pass would;
every other chunk keeps its status.

The lookups need every live chunk's duplicate key and signature: a base, written by a full pass
and hard-linked into later generations (its chunk ids, keys and signatures, keys sorted and each
band's hashes sorted, for bisection), the base chunks still live (`alive.npy`), and a delta of the
chunks added since (`delta_*.npy`, small). Past DELTA_FRACTION of the base the run makes a full
pass, which writes the next base.

    gen-N/dupes/dupes.json   threshold, live chunks, chunks first of their key
    gen-N/dupes/ids.npy sigs.npy keys.npy key_sorted.npy key_order.npy band_hash.npy band_row.npy  (base)
    gen-N/dupes/alive.npy delta_ids.npy delta_sigs.npy delta_keys.npy
"""

from __future__ import annotations

import json
import os

import numpy as np

from llmkit.io import atomic_write_text
from llmkit.rag.chunk.dedupe import N_PERM
from llmkit.rag.index.segments import DELTA_FRACTION, DELTA_MIN, link

DIR = "dupes"
BANDS = 16  # as chunk.dedupe.near_duplicates bands the signatures
BASE = ("ids", "sigs", "keys", "key_sorted", "key_order", "band_hash", "band_row")


def keys_u64(dup_keys) -> np.ndarray:
    """Duplicate keys (32 hex digits) as (n, 2) uint64."""
    return np.frombuffer(bytes.fromhex("".join(dup_keys)), "<u8").reshape(-1, 2).copy()


def band_hashes(sigs: np.ndarray) -> np.ndarray:
    """(n, BANDS) uint64: a hash of each band of each signature (lookups compare the bands themselves)."""
    x = np.asarray(sigs, np.uint64).reshape(len(sigs), BANDS, -1)
    h = np.zeros(x.shape[:2], np.uint64)
    with np.errstate(over="ignore"):
        for j in range(x.shape[2]):
            h = (h ^ x[:, :, j]) * np.uint64(0x100000001B3)
    return h


def write_base(gdir: str, ids: np.ndarray, dup_keys: list[str], sigs: np.ndarray, threshold: float,
               first: int) -> None:
    """The base of a full pass over every live chunk (`ids` ascending; `first`: how many are first of their key)."""
    out = os.path.join(gdir, DIR)
    os.makedirs(out, exist_ok=True)
    keys = keys_u64(dup_keys) if len(ids) else np.zeros((0, 2), np.uint64)
    order = np.argsort(keys[:, 0], kind="stable")
    h = band_hashes(sigs).T
    band_order = np.argsort(h, axis=1, kind="stable")
    row = np.int32 if len(ids) < 2**31 else np.int64  # positions: half the bytes of chunk ids
    for name, arr in (("ids", ids), ("sigs", sigs), ("keys", keys), ("key_sorted", keys[order, 0]),
                      ("key_order", order.astype(row)), ("band_hash", np.take_along_axis(h, band_order, 1)),
                      ("band_row", band_order.astype(row))):
        np.save(os.path.join(out, f"{name}.npy"), arr)
    _write_state(out, np.ones(len(ids), bool), np.zeros(0, np.int64), np.zeros((0, N_PERM), np.uint32),
                 np.zeros((0, 2), np.uint64), threshold, len(ids), first)


def _write_state(out, alive, d_ids, d_sigs, d_keys, threshold, live, first) -> None:
    for name, arr in (("alive", alive), ("delta_ids", d_ids), ("delta_sigs", d_sigs), ("delta_keys", d_keys)):
        np.save(os.path.join(out, f"{name}.npy"), arr)
    atomic_write_text(os.path.join(out, "dupes.json"), json.dumps(
        {"format": "llmkit-dupes", "version": 1, "threshold": threshold, "live": live, "first": first}))


class _State:
    """Every live chunk's key and signature: the base's alive ones and the delta."""

    def __init__(self, src: str):
        with open(os.path.join(src, "dupes.json"), encoding="utf-8") as f:
            self.meta = json.load(f)
        if self.meta.get("version") != 1:
            raise ValueError("dupes version")
        self.src = src
        self.base = {name: np.load(os.path.join(src, f"{name}.npy"), mmap_mode="r") for name in BASE}
        self.alive = np.load(os.path.join(src, "alive.npy"))
        self.d_ids, self.d_sigs, self.d_keys = (np.load(os.path.join(src, f"delta_{n}.npy"))
                                                for n in ("ids", "sigs", "keys"))

    def _base_row(self, i: int) -> int:
        ids = self.base["ids"]
        at = int(np.searchsorted(ids, i))
        return at if at < len(ids) and ids[at] == i else -1

    def info(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(key, signature) of live chunk `i`."""
        at = self._base_row(i)
        if at >= 0 and self.alive[at]:
            return np.asarray(self.base["keys"][at]), np.asarray(self.base["sigs"][at])
        j = int(np.flatnonzero(self.d_ids == i)[0])
        return self.d_keys[j], self.d_sigs[j]

    def with_key(self, key: np.ndarray) -> list[int]:
        """The live chunks with this key, ascending."""
        b = self.base
        lo, hi = np.searchsorted(b["key_sorted"], key[0], "left"), np.searchsorted(b["key_sorted"], key[0], "right")
        rows = np.asarray(b["key_order"][lo:hi])
        rows = rows[self.alive[rows] & (np.asarray(b["keys"][rows, 1]) == key[1])]
        got = np.asarray(b["ids"][np.sort(rows)]).tolist()
        got += self.d_ids[(self.d_keys == key).all(axis=1)].tolist()
        return sorted(got)

    def bucket(self, band: int, sig: np.ndarray) -> list[int]:
        """The live chunks whose signature has this one's band `band`, ascending."""
        b, r = self.base, N_PERM // BANDS
        part = sig[band * r:(band + 1) * r]
        h = band_hashes(sig.reshape(1, -1))[0, band]
        lo, hi = np.searchsorted(b["band_hash"][band], h, "left"), np.searchsorted(b["band_hash"][band], h, "right")
        rows = np.sort(np.asarray(b["band_row"][band, lo:hi]))
        rows = rows[self.alive[rows]]
        rows = rows[(np.asarray(b["sigs"][rows, band * r:(band + 1) * r]) == part).all(axis=1)]
        got = np.asarray(b["ids"][rows]).tolist()
        got += self.d_ids[(self.d_sigs[:, band * r:(band + 1) * r] == part).all(axis=1)].tolist()
        return sorted(got)


def update(prev: str, gdir: str, con, gen: int, threshold: float, kept: np.ndarray):
    """(chunk ids no longer kept, chunk ids newly kept, exact duplicates, near-duplicates) of
    generation `gen` after the previous generation `prev` (whose kept chunk ids are `kept`), with
    gen-N/dupes written; None for a full pass (no state, another threshold, a large change)."""
    try:
        st = _State(os.path.join(prev, DIR))
    except (OSError, ValueError):
        return None
    if st.meta["threshold"] != threshold:
        return None
    gone, added = _changed(con, "d.gen_removed = ?", gen), _changed(con, "d.gen_added = ?", gen)
    # remove and add: the live chunks of generation gen
    at = np.searchsorted(st.base["ids"], gone[0]) if len(gone[0]) else np.zeros(0, np.int64)
    at = np.minimum(at, max(len(st.alive) - 1, 0))
    in_base = (np.asarray(st.base["ids"][at]) == gone[0]) if len(st.alive) else np.zeros(len(at), bool)
    st.alive[at[in_base]] = False
    stay = ~np.isin(st.d_ids, gone[0])
    st.d_ids = np.concatenate([st.d_ids[stay], added[0]])
    st.d_sigs = np.concatenate([st.d_sigs[stay], added[2]])
    st.d_keys = np.concatenate([st.d_keys[stay], added[1]])
    limit = max(DELTA_MIN, DELTA_FRACTION * len(st.alive))
    if len(st.d_ids) > limit or (~st.alive).sum() > limit:
        return None
    # the chunks entering or leaving the first-of-their-key set
    info = {i: (k, s) for part in (gone, added) for i, k, s in zip(part[0].tolist(), part[1], part[2])}
    added_ids = set(added[0].tolist())
    entering, leaving = set(), set()
    for key in np.unique(np.concatenate([gone[1], added[1]]), axis=0):
        now = st.with_key(key)
        was = sorted({i for i in now if i not in added_ids}
                     | {i for i, k in zip(gone[0].tolist(), gone[1]) if (k == key).all()})
        if (was[:1] or [None]) != (now[:1] or [None]):
            leaving.update(was[:1])
            entering.update(now[:1])
    first_of = {}

    def of(i: int):
        if i not in info:
            info[i] = st.info(i)
        return info[i]

    def is_first(i: int) -> bool:
        if i not in first_of:
            first_of[i] = st.with_key(of(i)[0])[0] == i
        return first_of[i]

    def sig(i: int) -> np.ndarray:
        return of(i)[1]

    affected = set(entering)
    for m in leaving | entering:
        for band in range(BANDS):
            affected.update(x for x in st.bucket(band, sig(m)) if is_first(x))
    lost = set(gone[0].tolist()) | leaving
    won = set()
    for i in sorted(affected):
        s = sig(i)
        near = False
        for band in range(BANDS):
            f = next(x for x in st.bucket(band, s) if is_first(x))
            if f != i and (sig(f) == s).mean() >= threshold:
                near = True
                break
        (lost if near else won).add(i)
    lost_ids, won_ids = np.array(sorted(lost), np.int64), np.array(sorted(won), np.int64)
    drop, take = lost_ids[_member(kept, lost_ids)], won_ids[~_member(kept, won_ids)]
    live = st.meta["live"] - len(gone[0]) + len(added[0])
    first = st.meta["first"] - len(leaving) + len(entering)
    out = os.path.join(gdir, DIR)
    os.makedirs(out)
    for name in BASE:
        link(os.path.join(st.src, f"{name}.npy"), os.path.join(out, f"{name}.npy"))
    _write_state(out, st.alive, st.d_ids, st.d_sigs, st.d_keys, threshold, live, first)
    n_kept = len(kept) - len(drop) + len(take)
    return drop, take, live - first, first - n_kept


def _changed(con, where: str, gen: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, keys, signatures) of the chunks of the documents matching `where` (this run's added or removed)."""
    got = con.execute(f"SELECT c.id, c.dup_key, c.minhash FROM chunks c JOIN docs d ON d.id = c.doc_id "
                      f"WHERE {where} ORDER BY c.id", (gen,)).fetchall()
    ids = np.array([r[0] for r in got], np.int64)
    keys = keys_u64([r[1] for r in got]) if got else np.zeros((0, 2), np.uint64)
    sigs = np.array([np.frombuffer(r[2], np.uint32) for r in got], np.uint32).reshape(len(got), N_PERM)
    return ids, keys, sigs


def _member(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Which of `ids` are in the ascending array `sorted_ids` (bisection: the few against the many)."""
    if not len(sorted_ids):
        return np.zeros(len(ids), bool)
    at = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return np.asarray(sorted_ids[at]) == ids
