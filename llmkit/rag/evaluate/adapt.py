"""`rag adapt`: fine-tune the index's embedding model on its own corpus, without labels.

1. Pairs from the corpus: the pseudo-queries of `queries.py` (inverse cloze: a sentence and the rest of
   its chunk; headings and their chunks; with `llm_path`, questions a local model writes), each with one
   hard negative mined from the BM25 and dense top-10 of the query (never a chunk of the same parent
   or document, never a near-duplicate of the positive: MinHash Jaccard >= 0.7).
2. Training: sentence-transformers' trainer with MultipleNegativesRankingLoss (in-batch negatives
   plus the mined one; batches without duplicate texts), on the CPU, stopped at `--minutes`.
3. Promotion: a fifth of the pseudo-queries is held out of training; the base and the adapted model
   rank each held-out query's candidate pool (BM25 and base-dense top 30, positive included); the
   adapted model is promoted only if its mean nDCG@10 there is higher. Promotion re-embeds the index
   with it (a new generation; vectors of the old model are not reused). Fine-tuning can also hurt
   (published results show both): then the base stays and the report says so.

The adapted model is an ordinary sentence-transformers directory (`rag index --model DIR`).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from typing import Callable, ContextManager

import numpy as np

from llmkit.errors import BadInput
from llmkit.errors import OptionError
from llmkit.rag.index.reader import Index


@dataclass
class AdaptOptions:
    out_dir: str
    minutes: float = 15.0
    steps: int = 0  # 0: as many as the time allows (one pass over the pairs at most, times --epochs)
    epochs: int = 3  # one pass over the pairs moves a small model too little
    batch_size: int = 32
    lr: float = 2e-5
    pairs: int = 4000  # pseudo-queries made (a fifth held out)
    max_seq_length: int = 128  # training only (the saved model keeps its own)
    seed: int = 0
    mismatch: float = 0.0  # share of query words removed from the positive (see tune.py)
    hard_negatives: bool = False  # add one BM25/dense-mined negative per pair
    promote: bool = True  # re-embed the index with the adapted model when it wins


@dataclass
class AdaptReport:
    pairs: int
    heldout: int
    steps: int
    train_s: float
    base_ndcg: float
    adapted_ndcg: float
    promoted: bool
    reembedded: bool
    model_dir: str
    seconds: float
    decided_by: str = "pseudo"  # the held-out queries that decided promotion: pseudo | judged

    def to_dict(self) -> dict:
        return asdict(self)


def check_output(out_dir: str) -> None:
    """The output must be a new or empty directory whose parent is writable (checked before training)."""
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise BadInput(f"'{out_dir}' already exists and is not empty. Give a new directory for the adapted model.")
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise BadInput(f"cannot write the adapted model to '{out_dir}': '{parent}' is not a writable directory.")


def _negatives(index: Index, queries, emb, progress=None) -> list[int]:
    """One hard negative row per query (-1 when none qualifies)."""
    from llmkit.rag.chunk.dedupe import minhash
    from llmkit.rag.index.catalog import chunk_documents

    vecs = index.vectors()
    qv = emb.queries([q.text for q in queries])
    doc_of = chunk_documents(index.con)
    row_doc = [doc_of.get(int(r), -1) for r in index.rows.tolist()]
    out = []
    for i, q in enumerate(queries):
        if progress and i % 50 == 0:
            progress("mining negatives", i, len(queries))
        bm = [d for d, _ in index.bm25.top_k(index.tok(q.text), 10)]
        dn = np.argsort(-(vecs @ qv[i]))[:10].tolist()
        pos_sig = minhash(index.tok_doc(q.remainder or index.texts([q.row])[0]))
        pick = -1
        for r in [x for pair in zip(bm, dn) for x in pair] + bm[len(dn):] + dn[len(bm):]:
            if r == q.row or row_doc[r] == row_doc[q.row] or index.parent[r] == index.parent[q.row]:
                continue
            if (minhash(index.tok_doc(index.texts([r])[0])) == pos_sig).mean() >= 0.7:
                continue
            pick = r
            break
        out.append(pick)
    return out


def _pool_ndcg(model, index: Index, queries, pools, prompts, unit=None) -> float:
    """Mean nDCG@10 of `model` re-ranking each query's candidate pool (units: parents, or for judged
    queries `unit[row]`, their document keys)."""
    from llmkit.rag.evaluate.metrics import ndcg

    rows = sorted({r for p in pools for r in p})
    texts = index.texts(rows)
    qp, pp = prompts
    dv = model.encode([pp + t for t in texts], batch_size=32, normalize_embeddings=True, convert_to_numpy=True,
                      show_progress_bar=False)
    at = {r: i for i, r in enumerate(rows)}
    qv = model.encode([qp + q.text for q in queries], batch_size=32, normalize_embeddings=True,
                      convert_to_numpy=True, show_progress_bar=False)
    rem = [i for i, q in enumerate(queries) if q.remainder is not None]
    rv = model.encode([pp + queries[i].remainder for i in rem], batch_size=32, normalize_embeddings=True,
                      convert_to_numpy=True, show_progress_bar=False) if rem else None
    rvec = {i: rv[j] for j, i in enumerate(rem)}
    total = 0.0
    for i, (q, pool) in enumerate(zip(queries, pools)):
        s = np.array([float(dv[at[r]] @ qv[i]) if not (r == q.row and i in rvec) else float(rvec[i] @ qv[i])
                      for r in pool])
        s = np.nan_to_num(s, nan=-np.inf)
        order = [pool[j] for j in np.lexsort((np.array(pool), -s))]
        ranked = list(dict.fromkeys(int(index.parent[r]) if unit is None else unit[r] for r in order))
        total += ndcg(ranked, q.relevant)
    return total / max(len(queries), 1)


def adapt(directory: str, opts: AdaptOptions, llm=None, runtime: str = "onnx",
          progress: Callable[[str, int, int], None] | None = None, judged=None,
          trainer_output: Callable[[], ContextManager] | None = None) -> AdaptReport:
    """Fine-tune, compare on held-out pseudo-queries, save, and promote when better (module doc).
    The trainer prints its metrics and model-card progress on the console: `trainer_output()` is the
    context it trains in, where the caller decides what becomes of that (default: left alone)."""
    t0 = time.perf_counter()
    check_output(opts.out_dir)
    from llmkit.rag.embed.models import resolve_model, stored_model
    from llmkit.rag.embed.sbert import load_sentence_transformer
    from llmkit.rag.evaluate.queries import pseudo_queries

    index = Index(directory)
    if index.n == 0:
        raise BadInput(f"index '{directory}' has no chunks. Add documents with llmkit rag index first.")
    m = index.manifest
    base_path = resolve_model(stored_model(m["model"]))
    emb = index.embedder(None, runtime)
    # the model learns to find passages: its pairs and held-out queries are judged per parent chunk
    queries = pseudo_queries(index, opts.pairs, opts.seed, llm, progress, mismatch=opts.mismatch, by_unit=False)
    perm = np.random.default_rng(opts.seed + 11).permutation(len(queries))
    n_hold = max(10, len(queries) // 5)
    hold = [queries[i] for i in sorted(perm[:n_hold])]
    train = [queries[i] for i in sorted(perm[n_hold:])]
    negs = _negatives(index, train, emb, progress) if opts.hard_negatives else [None] * len(train)
    anchors, positives, negatives = _pairs(index, train, negs)
    if len(anchors) < 2 * opts.batch_size:
        raise OptionError("only {n} training pairs could be made; rag adapt needs at least {need}. Index more "
                          "text (or lower {batch_size}).", n=len(anchors), need=2 * opts.batch_size)
    model = load_sentence_transformer(base_path)
    orig_len = model.max_seq_length
    model.max_seq_length = min(orig_len or opts.max_seq_length, opts.max_seq_length)
    prompts = (m.get("query_prompt") or (model.prompts or {}).get("query", ""),
               m.get("passage_prompt") or (model.prompts or {}).get("document", ""))
    steps, train_s = _train(model, anchors, positives, negatives, opts, prompts, progress,
                            trainer_output or contextlib.nullcontext)
    model.max_seq_length = orig_len
    # held-out comparison: candidate pools from BM25 and the base model's vectors; judged queries
    # (relevance per document) decide when given, else the held-out pseudo-queries
    unit = None
    if judged:
        from llmkit.rag.evaluate.queries import document_keys

        hold, unit = judged, document_keys(index)
    pools = _pools(index, emb, hold)
    if progress:
        progress("comparing on held-out queries", 0, 2)
    adapted = _pool_ndcg(model, index, hold, pools, prompts, unit)
    base = _pool_ndcg(load_sentence_transformer(base_path), index, hold, pools, prompts, unit)
    promoted = bool(adapted > base and math.isfinite(adapted))
    _save(model, opts.out_dir)
    reembedded = False
    if promoted and opts.promote:
        from llmkit.rag.index.switch import switch_model

        switch_model(directory, opts.out_dir, runtime, progress)
        reembedded = True
    return AdaptReport(len(anchors), len(hold), steps, train_s, base, adapted, promoted, reembedded,
                       os.path.abspath(opts.out_dir), time.perf_counter() - t0, "judged" if judged else "pseudo")


def _pairs(index: Index, train: list, negs: list) -> tuple[list[str], list[str], list[str]]:
    """(anchors, positives, negatives) to train on: each query, the rest of its chunk (or the chunk),
    and its mined negative when there is one; a query whose mining failed (negative -1) is left out."""
    need = sorted({q.row for q in train} | {n for n in negs if n is not None and n >= 0})
    texts_of = dict(zip(need, index.texts(need)))
    anchors, positives, negatives = [], [], []
    for q, n in zip(train, negs):
        if n is not None and n < 0:
            continue
        anchors.append(q.text)
        positives.append(q.remainder if q.remainder is not None else texts_of[q.row])
        if n is not None:
            negatives.append(texts_of[n])
    return anchors, positives, negatives


def _pools(index: Index, emb, hold: list) -> list[list[int]]:
    """Each held-out query's candidates: BM25's top 30 and the base model's top 30 (and its own chunk)."""
    vecs = index.vectors()
    hq = emb.queries([q.text for q in hold])
    pools = []
    for i, q in enumerate(hold):
        cand = [d for d, _ in index.bm25.top_k(index.tok(q.text), 30)] + np.argsort(-(vecs @ hq[i]))[:30].tolist()
        pools.append(list(dict.fromkeys(cand + ([q.row] if q.row >= 0 else []))))
    return pools


def _train(model, anchors, positives, negatives, opts: AdaptOptions, prompts, progress,
           trainer_output) -> tuple[int, float]:
    """MultipleNegativesRankingLoss over (anchor, positive, negative), stopped at the time budget."""
    import tempfile

    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers
    from transformers import TrainerCallback

    budget = opts.minutes * 60
    t0 = time.perf_counter()

    class Budget(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if progress:
                progress("training", state.global_step, state.max_steps)
            if time.perf_counter() - t0 > budget:
                control.should_training_stop = True

    import logging
    import warnings

    cols = {"anchor": anchors, "positive": positives}
    if negatives:
        cols["negative"] = negatives
    ds = Dataset.from_dict(cols)
    qp, pp = prompts
    with tempfile.TemporaryDirectory(prefix="llmkit-adapt-") as tmp, trainer_output(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("transformers", "sentence_transformers", "datasets", "accelerate"):
            logging.getLogger(name).setLevel(logging.ERROR)
        args = SentenceTransformerTrainingArguments(
            output_dir=tmp, num_train_epochs=opts.epochs, max_steps=opts.steps or -1,
            per_device_train_batch_size=opts.batch_size, learning_rate=opts.lr, warmup_steps=0.1,
            batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", report_to="none", seed=opts.seed,
            use_cpu=True, disable_tqdm=True, logging_strategy="no", dataloader_num_workers=0,
            prompts={k: (qp if k == "anchor" else pp) for k in cols} if (qp or pp) else None)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds,
                                             loss=losses.MultipleNegativesRankingLoss(model), callbacks=[Budget()])
        state = trainer.train()
    return int(state.global_step), time.perf_counter() - t0


def _save(model, out_dir: str) -> None:
    """Save the model into a scratch directory beside `out_dir`, then rename it into place."""
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(out_dir))}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save(tmp)
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # checked empty before training
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
