"""Retrieval metrics over judged queries: nDCG@10 (linear gains, trec_eval's definition), Recall@k,
MRR and latency per configuration; several chunks of one document count once, at its best rank."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llmkit.errors import BadInput
from llmkit.rag.retrieve.hits import doc_key


def ndcg(ranked: list[str], judged: dict[str, int], k: int = 10) -> float:
    """nDCG@k with linear gains (trec_eval's definition).

    >>> round(ndcg(["a", "x", "b"], {"a": 2, "b": 1}), 4)
    0.9502
    """
    dcg = sum(judged.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(judged.values(), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall(ranked: list[str], judged: dict[str, int], k: int) -> float:
    return len(set(ranked[:k]) & set(judged)) / len(judged) if judged else 0.0


def reciprocal_rank(ranked: list[str], judged: dict[str, int]) -> float:
    return next((1.0 / (i + 1) for i, d in enumerate(ranked) if d in judged), 0.0)


@dataclass
class EvalRow:
    config: str
    queries: int
    ndcg10: float
    recall: float
    mrr: float
    latency_ms: float
    recall_k: int = 100
    recall_curve: dict[int, float] = field(default_factory=dict)  # k -> mean Recall@k, k up to recall_k

    def to_dict(self) -> dict:
        return {"config": self.config, "queries": self.queries, "ndcg@10": round(self.ndcg10, 4),
                f"recall@{self.recall_k}": round(self.recall, 4), "mrr": round(self.mrr, 4),
                "latency_ms": round(self.latency_ms, 2),
                "recall_curve": {str(k): round(v, 4) for k, v in self.recall_curve.items()}}


def curve_ks(recall_k: int) -> list[int]:
    """The cut-offs of a recall curve: 1, 2, 5, 10, 20, 50, ... below `recall_k`, and `recall_k`.

    >>> curve_ks(100), curve_ks(30)
    ([1, 2, 5, 10, 20, 50, 100], [1, 2, 5, 10, 20, 30])
    """
    ks, step = [], 1
    while step < recall_k:
        ks += [k for k in (step, 2 * step, 5 * step) if k < recall_k]
        step *= 10
    return ks + [recall_k]


def evaluate(config: str, run_query, queries: list[tuple[str, str]], qrels: dict, recall_k: int = 100) -> EvalRow:
    """Run every judged query through `run_query(text) -> QueryResult` and average the metrics."""
    judged = [(qid, text) for qid, text in queries if qid in qrels]
    if not judged:
        raise BadInput("none of the queries has relevance judgments (query ids do not match the qrels).")
    tot = {"ndcg": 0.0, "recall": 0.0, "mrr": 0.0, "s": 0.0}
    ks = curve_ks(recall_k)
    curve = dict.fromkeys(ks, 0.0)
    for qid, text in judged:
        res = run_query(text)
        ranked, seen = [], set()
        for h in res.hits:  # several chunks of one document count once, at its best rank
            d = doc_key(h)
            if d not in seen:
                seen.add(d)
                ranked.append(d)
        tot["ndcg"] += ndcg(ranked, qrels[qid])
        tot["recall"] += recall(ranked, qrels[qid], recall_k)
        for k in ks:
            curve[k] += recall(ranked, qrels[qid], k)
        tot["mrr"] += reciprocal_rank(ranked, qrels[qid])
        tot["s"] += res.seconds
    n = len(judged)
    return EvalRow(config, n, tot["ndcg"] / n, tot["recall"] / n, tot["mrr"] / n, 1000 * tot["s"] / n, recall_k,
                   {k: v / n for k, v in curve.items()})


def eval_chart(rows: list[EvalRow]):
    """The chart of `rag eval --plot`: nDCG@10 per configuration beside each one's Recall@k curve."""
    from llmkit.plot import Panel, Series

    ndcg_panel = Panel("nDCG@10 per configuration", "configuration", "nDCG@10",
                       [Series("nDCG@10", [r.config for r in rows], [r.ndcg10 for r in rows], style="bar",
                               notes=[f"{r.ndcg10:.3f}" for r in rows])])
    recall_panel = Panel(f"Recall@k ({rows[0].queries} judged queries)", "k (documents)", "Recall@k",
                         [Series(r.config, list(r.recall_curve), list(r.recall_curve.values())) for r in rows],
                         xlog=True)
    return [ndcg_panel, recall_panel]


DEFAULT_CONFIGS = ("bm25", "dense", "hybrid")


def default_configs(index_dir: str) -> tuple[str, ...]:
    """The configurations evaluated when none are named: the built-in ones, and `tuned` when the index
    has a tuned fusion."""
    from llmkit.rag.index.manifest import read_manifest

    return DEFAULT_CONFIGS + (("tuned",) if read_manifest(index_dir).get("fusion") else ())


def evaluate_configs(index_dir: str, configs, queries: list[tuple[str, str]], qrels: dict, recall_k: int = 100):
    """An EvalRow per (label, QueryOptions) of `configs`, yielded as each is measured (the pipelines
    are built one at a time, so a bad configuration stops the run only when reached)."""
    from dataclasses import replace

    from llmkit.rag.retrieve.pipeline import build_pipeline

    for label, opts in configs:
        k = max(recall_k, 10)
        pipe, _ = build_pipeline(index_dir, replace(opts, k=k, depth=max(opts.depth, k)))
        yield evaluate(label, pipe.run, queries, qrels, recall_k)
