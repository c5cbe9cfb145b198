"""RAG quality rows for run.py (not a test): llmkit out of the box vs the naive baseline.

    python benchmarks/run.py --area rag-quality

Runs `benchmarks/rag_quality.py` once as a child (the naive baselines and llmkit's defaults, tuned
default, judged tuning and --graph on Cranfield, WordNet -> Webster and two Python source trees;
see that file for how each side is built and scored) and turns its figures into rows; then
`benchmarks/rag_tune_bench.py` on the Cranfield and dictionary indexes it built (how well
pseudo-query nDCG ranks the tuner's configurations against real nDCG). Quality, not
speed: the figures do not depend on load, only on the data and the packaged model. The vectors are
cached in ~/.cache/llmkit/bench/rag-quality-vectors.npz (keyed by model, prompt and text), so a
rerun embeds only new text and gives the same numbers. Not part of `--quick` (about 40 minutes on
2 cores with an empty cache); `--area rag-quality` runs it.
"""

from __future__ import annotations

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, Cmd, Row, run_once  # noqa: E402

ME = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rag_quality.py")
TUNE_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rag_tune_bench.py")
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "llmkit", "bench", "rag-quality-vectors.npz")
COLLECTIONS = {"cranfield": "Cranfield (1400 abstracts)", "dict": "WordNet -> Webster (6000 entries)",
               "code (found@10)": "Python stdlib tree, found in top 10",
               "code-heldout (found@10)": "held-out stdlib tree, found in top 10"}
METHODS = [("bm25", "bm25", "BM25"), ("dense", "dense", "dense (MiniLM)"), ("rrf 1:1", "rrf 1:1", "RRF 1:1"),
           ("rrf 0.3/0.7", "tuned (auto)", "tuned at index time vs naive RRF 0.3/0.7"),
           (None, "judged tune (held-out)", "judged tuning, scored on the held-out half"),
           (None, "graph idx: rrf 1:1 --graph", "--graph on a graph index (vs the same query without it)"),
           (None, "graph idx: tuned --graph", "--graph on the tuned graph index (vs without it)")]
WITHOUT = {"graph idx: rrf 1:1 --graph": "graph idx: rrf 1:1", "graph idx: tuned --graph": "graph idx: tuned",
           "judged tune (held-out)": "best single (held-out)"}


def slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s.lower()).strip("-").replace("--", "-")


def rows(cfg):
    work = cfg.tmp("rag-quality")
    out = os.path.join(work, "figures.json")
    os.makedirs(os.path.dirname(CACHE), exist_ok=True)
    colls = cfg.pick("cranfield,dict,code,code-heldout", "cranfield,dict,code,code-heldout", "cranfield")
    args = [PY, ME, "-w", work, "-c", colls, "--cache", CACHE, "--json", out] + (["--no-graph"] if cfg.smoke else [])
    cmd = Cmd("rag_quality.py", args)
    run_once(cmd, timeout=3 * 3600)  # raises ChildFailed with its stderr if it fails
    got = json.load(open(out, encoding="utf-8"))
    results, notes = got["results"], got["notes"]
    rows_ = []
    for key, title in COLLECTIONS.items():
        if key not in results:
            continue
        naive, ours = results[key]
        note = notes.get(key, {})
        for n_name, o_name, what in METHODS:
            b = ours.get(o_name)
            if b is None:
                continue
            if n_name is not None:
                a, against = naive.get(n_name), f"naive {n_name}"
            else:  # judged tuning and --graph compare with llmkit's own figure beside them
                a, against = ours.get(WITHOUT[o_name]), WITHOUT[o_name]
            check = f"{note.get('queries', '?')} judged queries, {note.get('units', '?')} naive units"
            if o_name == "tuned (auto)":
                check += f"; index-time tuning: {note.get('fusion', '?')}"
            rows_.append(Row(f"rq-{slug(key.split(' ')[0])}-{slug(o_name)}", f"{title}: {what}",
                             anchor="–" if a is None else f"{against} {a:.4f}", llmkit=f"{b:.4f}",
                             ratio="–" if a is None else f"{b - a:+.4f}", check=check,
                             commands=[cmd.shell()]))
    # how well pseudo-queries rank the tuner's configurations (rag_tune_bench.py, on the same indexes)
    for key, title in (("cranfield", COLLECTIONS["cranfield"]), ("dict", COLLECTIONS["dict"])):
        idx = os.path.join(work, f"{key}-idx")
        if key not in results or not os.path.isdir(idx):
            continue
        log = os.path.join(work, f"tune-bench-{key}.txt")
        tb = Cmd("rag_tune_bench.py", [PY, TUNE_BENCH, os.path.join(work, key), "--index", idx, "--cache", CACHE],
                 stdout=log)
        run_once(tb, timeout=3600)
        text = open(log, encoding="utf-8").read()
        m = re.search(r"over (\d+) configurations: Spearman (-?[\d.]+), Kendall (-?[\d.]+)", text)
        n = re.search(r"^pseudo: (\d+) queries", text, re.M)
        if m:
            rows_.append(Row(f"rq-{key}-tune-rank-corr", f"{title}: rank correlation of pseudo-query nDCG@10 with "
                             f"real nDCG@10 over the tuner's {m.group(1)} configurations",
                             anchor="–", llmkit=f"Spearman {float(m.group(2)):.2f}, Kendall {float(m.group(3)):.2f}",
                             check=f"{n.group(1) if n else '?'} pseudo-queries", commands=[tb.shell()]))
    setup = ["naive side: one unit per document (code: per function), rank-bm25 BM25Okapi on [a-z0-9]+ tokens, "
             "all-MiniLM-L6-v2 through sentence-transformers (exact cosine), RRF k=60 over top-100 lists; "
             "llmkit side: `rag index` with no flags, `rag eval`; both scored by llmkit.rag.evaluate.metrics.ndcg",
             f"vectors cached in {CACHE} (same model, same vectors: the cache changes no figure)",
             "figures are nDCG@10 except the code rows (found in the top 10); the last column is llmkit minus the "
             "anchor column"]
    return "llmkit rag out of the box vs the naive baseline (quality)", setup, rows_
