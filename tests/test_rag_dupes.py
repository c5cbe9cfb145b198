"""dupes.update decides a small update's duplicates as the full pass over every live chunk would
(chunk.dedupe.near_duplicates after exact keys), on random histories whose signatures share LSH
bands often: chunks are copies of a few prototypes with a few values changed."""

import numpy as np
import pytest

from llmkit.rag.chunk.dedupe import N_PERM, near_duplicates
from llmkit.rag.index import db, dupes


def _full(con, gen, threshold):
    """(kept chunk ids, exact duplicates, near-duplicates) of the full pass over generation gen's chunks."""
    rows = con.execute(f"SELECT c.id, c.dup_key, c.minhash FROM chunks c JOIN docs d ON d.id = c.doc_id "
                       f"WHERE {db.LIVE} ORDER BY c.id", (gen, gen)).fetchall()
    first = [j for j, (i, key, _) in enumerate(rows) if key not in {k for _, k, _ in rows[:j]}]
    sigs = np.array([np.frombuffer(rows[j][2], np.uint32) for j in first], np.uint32).reshape(-1, N_PERM)
    near = near_duplicates(sigs, threshold) >= 0
    kept = [rows[j][0] for j, n in zip(first, near) if not n]
    return kept, len(rows) - len(first), int(near.sum())


@pytest.mark.parametrize("seed", range(6))
def test_small_updates_deduplicate_as_the_full_pass(tmp_path, seed):
    rng = np.random.default_rng(seed)
    threshold = 0.6
    protos = rng.integers(0, 2**32, size=(3, N_PERM), dtype=np.uint32)
    keys = [f"{k:032x}" for k in range(80)]
    con = db.connect(str(tmp_path))
    docs = []

    def add(gen):
        cur = con.execute("INSERT INTO docs (collection, source, path, hash, meta, gen_added) VALUES ('c','s',?,'h','{}',?)",
                          (f"p{len(docs)}", gen))
        for _ in range(rng.integers(1, 4)):
            sig = protos[rng.integers(len(protos))].copy()
            sig[rng.choice(N_PERM, rng.integers(0, 40), replace=False)] = rng.integers(0, 2**32, dtype=np.uint32)
            con.execute("INSERT INTO chunks (doc_id, parent_id, collection, text, text_hash, dup_key, minhash, meta) "
                        "VALUES (?, 0, 'c', 't', 'h', ?, ?, '{}')",
                        (cur.lastrowid, keys[rng.integers(len(keys))], sig.tobytes()))
        docs.append(cur.lastrowid)

    for _ in range(30):
        add(1)
    kept, exact, near = _full(con, 1, threshold)
    assert exact and near  # the history has both kinds
    rows = con.execute("SELECT id, dup_key, minhash FROM chunks ORDER BY id").fetchall()
    gdir = tmp_path / "gen-1"
    gdir.mkdir()
    dupes.write_base(str(gdir), np.array([r[0] for r in rows], np.int64), [r[1] for r in rows],
                     np.array([np.frombuffer(r[2], np.uint32) for r in rows]), threshold, len(rows) - exact)
    kept = np.array(kept, np.int64)
    for gen in range(2, 10):
        for d in rng.choice(docs, rng.integers(0, 4), replace=False).tolist():
            con.execute("UPDATE docs SET gen_removed = ? WHERE id = ? AND gen_removed IS NULL", (gen, d))
        for _ in range(rng.integers(0, 4)):
            add(gen)
        new = tmp_path / f"gen-{gen}"
        new.mkdir()
        drop, take, got_exact, got_near = dupes.update(str(gdir), str(new), con, gen, threshold, kept)
        kept = np.union1d(np.setdiff1d(kept, drop), take)
        want, exact, near = _full(con, gen, threshold)
        assert kept.tolist() == want and (got_exact, got_near) == (exact, near), gen
        gdir = new
