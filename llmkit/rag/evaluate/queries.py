"""Queries to measure retrieval with: judged ones (relevance per document key), pseudo-queries made
from the corpus itself (inverse cloze with term mismatch, headings, or questions a local model
writes; `tune.py` says why), and multi-hop test sets for the entity graph."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from llmkit.errors import BadInput
from llmkit.errors import OptionError
from llmkit.rag.index.catalog import chunk_records, judged_ids
from llmkit.rag.index.graph import entities
from llmkit.rag.index.reader import Index
from llmkit.rag.retrieve.hits import document_key

MIN_CHUNKS = 30  # fewer usable chunks cannot make a meaningful set of pseudo-queries
MISMATCH = 0.7  # share of a pseudo-query's words removed from its answer (tune.py says why)
_SENT_SPLIT = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+|(?<=[。！？；])\s*|\n\s*\n")


@dataclass
class Query:
    text: str
    relevant: dict  # unit -> grade (parents for pseudo-queries, document keys for judged ones)
    row: int = -1  # the chunk a pseudo-query was made from
    remainder: str | None = None  # that chunk's text without the query sentence
    kind: str = "judged"


def sentences(text: str) -> list[str]:
    """The sentences of a text (Latin and CJK end marks, blank lines) as pseudo-queries use them."""
    return [s.strip() for s in _SENT_SPLIT.split(text) if s and s.strip()]


def _words(s: str) -> int:
    return len(re.findall(r"\w+", s))


def pseudo_queries(index: Index, n: int = 400, seed: int = 0, llm=None,
                   progress: Callable[[str, int, int], None] | None = None, mismatch: float = MISMATCH,
                   by_unit: bool = True) -> list[Query]:
    """Inverse-cloze (and heading / LLM) queries made from a seeded sample of the index's chunks;
    each query word is removed from the matched rest of its chunk with probability `mismatch`.

    The answer is the unit results are ranked as: the chunk's document (code: its definition) in an
    index that ranks documents (`by_unit`), else its parent. A sentence that also sits in another chunk of the
    same document (an overlap) is never the query: that chunk would give the answer away verbatim
    and the tuner would learn to trust BM25."""
    rows_meta = chunk_records(index.con)
    live = {int(r): i for i, r in enumerate(index.rows.tolist())}
    by_row = {live[cid]: (pid, did, text, meta) for cid, pid, did, text, meta in rows_meta if cid in live}
    usable = sorted(r for r, (_, _, text, _) in by_row.items()
                    if len(text) >= 200 and sum(1 for s in sentences(text) if 5 <= _words(s) <= 40) >= 1
                    and len(sentences(text)) >= 2)
    if len(usable) < MIN_CHUNKS:
        raise OptionError("rag tune needs at least {min} chunks of 200+ characters with two or more sentences to "
                          "make pseudo-queries; this index has {n}. Index more text, or pass judged queries with "
                          "{queries} and {qrels}.", min=MIN_CHUNKS, n=len(usable))
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(usable), size=min(n, len(usable)), replace=False)
    parent_of_row = index.unit if by_unit and index.unit is not None else index.parent
    sections = _headings(by_row, parent_of_row)
    siblings: dict[int, list[int]] = {}
    if by_unit and index.unit is not None:
        for r in by_row:
            siblings.setdefault(int(parent_of_row[r]), []).append(r)
    out: list[Query] = []
    for i, j in enumerate(picked.tolist()):
        if progress:
            progress("pseudo-queries", i, len(picked))
        row = usable[j]
        pid, did, text, meta = by_row[row]
        target = {int(parent_of_row[row]): 1}
        if llm is not None:
            q = llm.complete("Write one short search question that the following passage answers. "
                             f"Output only the question.\n\nPassage: {text[:1500]}", 48).strip().split("\n")[0]
            if q:
                out.append(Query(q, target, row, None, "llm"))
                continue
        m = json.loads(meta)
        heads = [(k, str(m.get(k) or "").strip()) for k in ("section", "title")]
        heads = [(k, h) for k, h in heads if 2 <= _words(h) <= 15 and h.lower() not in text.lower()]
        if heads and rng.random() < 0.3:
            k, h = heads[0]
            units = sections.get((did, k, h.lower()), set())
            if 0 < len(units) <= 5:  # a heading over many parents is too vague to judge
                out.append(Query(h, {u: 1 for u in units}, row, None, "heading"))
                continue
        others = [by_row[r2][2] for r2 in siblings.get(int(parent_of_row[row]), ()) if r2 != row]
        cloze = _inverse_cloze(text, others, rng, mismatch)
        if cloze is not None:
            out.append(Query(cloze[0], target, row, cloze[1], "sentence"))
    return out


def _headings(by_row: dict, parent_of_row) -> dict:
    """(document, "section" or "title", heading lower-cased) -> the parents holding it, for heading queries."""
    sections: dict = {}
    for r, (pid, did, _, meta) in by_row.items():
        m = json.loads(meta)
        for key in ("section", "title"):
            h = str(m.get(key) or "").strip()
            if h:
                sections.setdefault((did, key, h.lower()), set()).add(int(parent_of_row[r]))
    return sections


def _inverse_cloze(text: str, others: list[str], rng, mismatch: float) -> tuple[str, str] | None:
    """(a sentence of `text` as the query, the rest of the text with each of the query's words dropped
    with probability `mismatch`), or None when every sentence of the right length also sits in one of
    the `others` texts (overlapping chunks of the same unit)."""
    cands = [s for s in sentences(text) if 5 <= _words(s) <= 40]
    cands = [s for s in cands if not any(s in t for t in others)]
    if not cands:
        return None
    s = cands[int(rng.integers(len(cands)))]
    rest = text.replace(s, " ", 1)
    if mismatch > 0:
        words = sorted({w.lower() for w in re.findall(r"\w+", s)})
        drop = {w for w in words if rng.random() < mismatch}
        rest = re.sub(r"\w+", lambda m: "" if m.group().lower() in drop else m.group(), rest)
    return s, rest


def judged_queries(index: Index, queries: list[tuple[str, str]], qrels: dict) -> list[Query]:
    """Judged queries whose documents are in the index (relevance per document key)."""
    keys = set(document_keys(index))
    named = {d for rel in qrels.values() for d in rel}
    if not named & keys:
        sample_q = ", ".join(sorted(named)[:3])
        sample_i = ", ".join(sorted(keys)[:3])
        raise BadInput(f"the qrels name no document of this index (qrels: {sample_q} ...; index: {sample_i} ...). "
                       "Use the ids of the indexed documents (a JSONL record's id field, else the file path).")
    out = [Query(text, qrels[qid]) for qid, text in queries if qid in qrels]
    if len(out) < 10:
        raise BadInput(f"only {len(out)} of the queries have judgments; rag tune needs at least 10.")
    return out


def judged_from_files(index: Index, queries_file: str, qrels_file: str) -> list[Query]:
    """`judged_queries` of a queries file and a TREC qrels file."""
    from llmkit.rag.evaluate.datasets import load_qrels, load_queries

    return judged_queries(index, load_queries(queries_file), load_qrels(qrels_file))


def document_keys(index: Index) -> list[str]:
    """Per row, the judged document id (a JSONL record's id, else its source path)."""
    got: dict[int, str] = {}
    for cid, source, doc_id in judged_ids(index.con):
        got[cid] = document_key(doc_id, source)
    return [got.get(int(r), "") for r in index.rows.tolist()]


def bridge_queries(index, n: int = 100, seed: int = 0) -> list[tuple[str, int, int]]:
    """A multi-hop test set from the corpus itself: (query, row B, row A) where chunks A and B share a
    bridge entity that no other chunk has, and the query is a sentence of A naming one of A's own rare
    entities (not the bridge, nothing of B's entities). Only the graph links the query to B."""
    g = index.graph
    inv = {i: e for e, i in g.vocab.items()}
    by_col, by_row = g.m.tocsc(), g.m.tocsr()
    rng = np.random.default_rng(seed)
    bridges = [int(e) for e in np.flatnonzero(g.df == 2)]
    rng.shuffle(bridges)
    out = []
    for s in bridges:
        rows = by_col[:, s].nonzero()[0].tolist()
        if len(rows) != 2 or index.parent[rows[0]] == index.parent[rows[1]]:
            continue
        a, b = rows if rng.random() < 0.5 else rows[::-1]
        ents_b = set(by_row[b].indices.tolist())
        for sent in sentences(index.texts([a])[0]):
            own = [e for e in entities(sent) if e in g.vocab and g.vocab[e] not in ents_b and g.df[g.vocab[e]] <= 5]
            if own and inv[s] not in sent.lower() and 6 <= len(sent.split()) <= 40:
                out.append((sent, int(b), int(a)))
                break
        if len(out) >= n:
            break
    return out
