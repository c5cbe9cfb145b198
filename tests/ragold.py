"""Index layouts older llmkit versions wrote, made from an index this version built, for the tests
that open them (format migration, indexes extended as they were built).

Format 1 changed its layout three times without changing its version; each era below is what
that era's `rag index` left on disk:

- `v1`: the last format-1 layout: every setting present, `stem` beside `analysis`, the tuned
  fusion's RRF constant under `k`.
- `v1-chunks`: before BM25 analyses and document ranking: no `analysis` (plain words), no
  `ranking` and no `unit.npy` (hits are chunks), collections without a chunking `unit`.
- `v1-words`: before identifiers were split for BM25: as `v1-chunks`, no `bm25_idents`, and the
  BM25 terms of the live generation are plain words (rebuilt that way here).
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

ERAS = ("v1", "v1-chunks", "v1-words")


def as_format1(idx: Path, era: str) -> dict:
    """Rewrite the index at `idx` (built by this version with `--analysis plain`, or any analysis for
    `v1`) as `era` left it; the manifest as written."""
    path = idx / "manifest.json"
    m = json.loads(path.read_text())
    m["version"] = 1
    m["stem"] = m["analysis"] == "porter"
    if m.get("fusion") and "rrf_k" in m["fusion"]:
        m["fusion"]["k"] = m["fusion"].pop("rrf_k")
    gen = idx / f"gen-{m['generation']}"
    if era in ("v1-chunks", "v1-words"):
        assert m["analysis"] == "plain", "an era before analyses: build the index with --analysis plain"
        for key in ("analysis", "ranking"):
            m.pop(key)
        for rec in m["collections"].values():
            rec.pop("unit", None)
        (gen / "unit.npy").unlink(missing_ok=True)
    if era == "v1-words":
        m.pop("bm25_idents")
        _rebuild_bm25(idx, gen, idents=False)
    if m.get("store") is None:  # format 1 named a store only when vectors lived in one
        m.pop("store", None)
    path.write_text(json.dumps(m))
    return m


def _rebuild_bm25(idx: Path, gen: Path, idents: bool) -> None:
    import numpy as np

    from llmkit.rag.index.analysis import doc_terms
    from llmkit.rag.index.bm25 import BM25Index

    rows = np.load(gen / "rows.npy").tolist()
    con = sqlite3.connect(idx / "chunks.sqlite")
    text = dict(con.execute(f"SELECT id, text FROM chunks WHERE id IN ({','.join('?' * len(rows))})", rows))
    con.close()
    bm25 = gen / "bm25"
    for name in os.listdir(bm25):
        (bm25 / name).unlink()
    BM25Index.build([doc_terms(text[r], "plain", idents) for r in rows]).save(str(bm25))
