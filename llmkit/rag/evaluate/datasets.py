"""Evaluation data: query files (JSONL, TSV or plain lines), TREC qrels, and the Cranfield collection
(1400 abstracts, 225 queries, graded judgments) converted to those formats."""

from __future__ import annotations

import json
import os
import re

from llmkit.errors import BadInput
from llmkit.bounded import load_json_line


def load_queries(path: str) -> list[tuple[str, str]]:
    """(id, text) pairs from JSONL ({"id", "text"}) or TSV (id<TAB>text) or plain lines (ids 1..n)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln.rstrip("\n") for ln in f]
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read the queries file '{path}' ({e}).") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        out.append(parse_query_line(line, n, path))
    if not out:
        raise BadInput(f"the queries file '{path}' holds no queries.")
    return out


def parse_query_line(line: str, n: int, where: str = "input") -> tuple[str, str]:
    """One query: a JSON object with id/text (or query), 'id<TAB>text', or plain text (id = line number)."""
    s = line.strip()
    if s.startswith("{"):
        try:
            rec = load_json_line(s, f"{where}:{n}")
        except json.JSONDecodeError as e:
            raise BadInput(f"{where}:{n}: invalid JSON ({e.msg}).") from None
        text = rec.get("text", rec.get("query"))
        if not isinstance(text, str) or not text.strip():
            raise BadInput(f"{where}:{n}: the JSON query has no 'text' field.")
        return str(rec.get("id", rec.get("_id", n))), text
    if "\t" in line:
        qid, text = line.split("\t", 1)
        return qid.strip(), text
    return str(n), line


def load_qrels(path: str) -> dict[str, dict[str, int]]:
    """TREC qrels 'qid iter docid rel', or 'qid docid rel' as BEIR's TSV files (their header line is
    skipped): {qid: {docid: grade}}, grades > 0 kept."""
    qrels: dict[str, dict[str, int]] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read the qrels file '{path}' ({e}).") from None
    for n, line in enumerate(lines, 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) not in (3, 4):
            raise BadInput(f"{path}:{n}: expected 'query 0 doc relevance', got {line.strip()!r}.")
        qid, doc, rel = parts[0], parts[-2], parts[-1]
        try:
            grade = int(float(rel))
        except ValueError:
            if not qrels and n == next(i for i, ln in enumerate(lines, 1) if ln.split()):
                continue  # a header such as BEIR's "query-id corpus-id score"
            raise BadInput(f"{path}:{n}: relevance {rel!r} is not a number.") from None
        if grade > 0:
            qrels.setdefault(qid, {})[doc] = grade
    if not qrels:
        raise BadInput(f"the qrels file '{path}' has no positive judgments.")
    return qrels


def _records(text: str) -> list[dict[str, str]]:
    recs = []
    for block in re.split(r"^\.I\s+", text, flags=re.M)[1:]:
        head, _, rest = block.partition("\n")
        fields = {"I": head.strip()}
        for m in re.finditer(r"^\.([A-Z])\s*\n(.*?)(?=^\.[A-Z]\s*$|\Z)", rest, re.M | re.S):
            fields[m.group(1)] = " ".join(m.group(2).split())
        recs.append(fields)
    return recs


def import_cranfield(src: str, out_dir: str) -> dict:
    """cran.all.1400 / cran.qry / cranqrel -> docs.jsonl, queries.jsonl, qrels.txt (TREC).

    Each file may also be gzipped (`cran.all.1400.gz`, as the copy in examples/data/cranfield is).
    Query ids in cranqrel are 1..225 in file order (not the .I numbers). Cleverdon's codes 1 (complete
    answer) .. 4 (minimal interest) become graded relevance 4 .. 1; -1 (not relevant) is dropped.
    """
    import gzip

    from llmkit.io import atomic_write_text

    def read(name):
        path = os.path.join(src, name)
        try:
            if not os.path.exists(path) and os.path.exists(path + ".gz"):
                with gzip.open(path + ".gz", "rt", encoding="utf-8", errors="replace") as f:
                    return f.read()
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except (OSError, EOFError):  # gzip raises EOFError on a truncated file
            raise BadInput(f"'{src}' does not hold a readable Cranfield file {name} (or {name}.gz). Pass the "
                           "directory with cran.all.1400, cran.qry and cranqrel.") from None

    docs = _records(read("cran.all.1400"))
    queries = _records(read("cran.qry"))
    qrel_lines = read("cranqrel").split("\n")
    os.makedirs(out_dir, exist_ok=True)
    atomic_write_text(os.path.join(out_dir, "docs.jsonl"), "".join(
        json.dumps({"id": d["I"], "title": d.get("T", ""), "author": d.get("A", ""),
                    # the abstract (.W) starts with the title already; two records have only a title
                    "text": d.get("W") or d.get("T", "")}) + "\n" for d in docs))
    atomic_write_text(os.path.join(out_dir, "queries.jsonl"), "".join(
        json.dumps({"id": str(i), "text": q.get("W", "")}) + "\n" for i, q in enumerate(queries, 1)))
    qrels = []
    for line in qrel_lines:
        parts = line.split()
        if len(parts) == 3 and parts[2].lstrip("-").isdigit() and 1 <= int(parts[2]) <= 4:
            qrels.append(f"{parts[0]} 0 {parts[1]} {5 - int(parts[2])}\n")
    atomic_write_text(os.path.join(out_dir, "qrels.txt"), "".join(qrels))
    return {"docs": len(docs), "queries": len(queries), "judgments": len(qrels)}
