"""What retrieval returns: `Hit`s (a row, its fused score, its rank in each retriever's list, and
its text, parent text and metadata fetched from the index), and the grouping of ranked lists by
parent used when parents are returned (small-to-big)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Hit:
    row: int
    score: float
    ranks: dict = field(default_factory=dict)
    rerank: float | None = None
    chunk_id: int = 0
    parent_id: int = 0
    source: str = ""
    text: str = ""
    parent_text: str = ""
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"chunk_id": self.chunk_id, "parent_id": self.parent_id, "doc": self.source, "score": round(self.score, 6),
             "ranks": self.ranks, "text": self.text, "parent_text": self.parent_text, "meta": self.meta}
        if self.rerank is not None:
            d["rerank_score"] = round(self.rerank, 6)
        if self.meta.get("line_start"):  # code: where to open it
            d["line"] = self.meta["line_start"]
        return d


def dedupe_to_groups(ids: list[int], group: np.ndarray, scores=None):
    """Map a ranked list of rows to their groups (parents), keeping each group's first (best) rank
    (and its score, when scores are given: then (groups, scores) is returned)."""
    seen, out, out_s = set(), [], []
    for i, d in enumerate(ids):
        g = int(group[d])
        if g not in seen:
            seen.add(g)
            out.append(g)
            if scores is not None:
                out_s.append(scores[i])
    return out if scores is None else (out, out_s)


def fetch(index, hits: list[Hit], with_parent: bool = True) -> list[Hit]:
    """Fill in text, parent text and metadata of hits from the index's SQLite."""
    if not hits:
        return hits
    from llmkit.rag.index.catalog import hit_records

    ids = [int(index.rows[h.row]) for h in hits]
    got = hit_records(index.con, ids)
    for h, cid in zip(hits, ids):
        r = got.get(cid)
        if r is None:
            continue
        h.chunk_id, h.parent_id, h.source, h.text = r[0], r[1], r[2], r[3]
        h.meta = json.loads(r[4])
        h.parent_text = r[5] if with_parent else ""
    return hits


def doc_key(hit: Hit) -> str:
    """The judged document id of a hit: a JSONL record's id, else its source path."""
    return document_key(hit.meta.get("doc_id"), hit.source)


def document_key(doc_id, source: str) -> str:
    """The id a judgment names a document by: a JSONL record's `doc_id`, else the source path."""
    return str(doc_id or source)
