"""Embed passages on a Ray cluster with Ray Data: `map_batches` over actors that each load the
index's embedding model once (the same runtime, precision and prompts as a local run, so the
vectors equal a local run's up to float tolerance).

`address`: "local" starts a local Ray runtime for this run (a real one: raylet, object store,
worker processes); "auto" or "HOST:PORT" / "ray://HOST:10001" joins an existing cluster, whose
workers need llmkit installed (`pip install llmkit[cluster]` on each node).
"""

from __future__ import annotations

import numpy as np

from llmkit.errors import BadInput, MissingDependency
from llmkit.config import scoped_env
from llmkit.errors import OptionError


def _actor_class(model, runtime, precision, query_prompt, passage_prompt, threads):
    """A Ray Data actor class (one embedding model per worker process); the settings travel with the
    pickled class, not as constructor arguments in the object store."""

    class Embed:
        def __init__(self):
            from llmkit.rag.embed.embedder import load_embedder

            self.emb = load_embedder(model, runtime, precision, query_prompt, passage_prompt, threads=threads)

        def __call__(self, batch: dict) -> dict:
            vecs = self.emb.passages([str(t) for t in batch["text"]])
            return {"i": batch["i"], "vec": np.asarray(vecs, np.float32)}

    return Embed


def embed_on_ray(texts: list[str], model, runtime: str, precision: str, query_prompt: str, passage_prompt: str,
                 address: str = "local", workers: int = 2, batch_size: int = 64, threads_per_worker: int = 1,
                 progress=None) -> tuple[np.ndarray, int]:
    """(vectors in the order of `texts`, dimension)."""
    try:
        import ray
        import ray.data  # noqa: F401  (the Data library is an extra of ray: fail here, not in a worker)
    except ImportError:
        raise MissingDependency("ray[data]", "cluster") from None
    import logging

    for name in ("ray", "ray.data"):  # progress is ours (stderr bar); Ray's INFO lines would bury it
        logging.getLogger(name).setLevel(logging.ERROR)
    # Ray's C++ core logs warnings about its own internals to stderr; keep stderr for our errors
    # (the variable is read by the processes Ray starts, so it is set for this run only)
    with scoped_env({"RAY_BACKEND_LOG_LEVEL": "fatal"}):
        return _embed(ray, texts, model, runtime, precision, query_prompt, passage_prompt, address, workers,
                      batch_size, threads_per_worker, progress)


def _embed(ray, texts, model, runtime, precision, query_prompt, passage_prompt, address, workers, batch_size,
           threads_per_worker, progress) -> tuple[np.ndarray, int]:
    import logging

    started = False
    if not ray.is_initialized():
        try:
            if address in (None, "local"):
                ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
            else:
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise OptionError("cannot reach the Ray cluster at '{address}' ({msg}). Start it with `ray start --head`, "
                              "or pass {ray} without an address for a local one.", address=address,
                              msg=msg[:200]) from None
        started = True
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.verbose_progress = False
        # length-sorted batches pad less (the local embedder sorts the same way)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        ds = ray.data.from_items([{"i": i, "text": texts[i]} for i in order], override_num_blocks=max(1, workers * 4))
        out = ds.map_batches(_actor_class(model, runtime, precision, query_prompt, passage_prompt, threads_per_worker),
                             batch_size=batch_size, concurrency=workers, num_cpus=threads_per_worker,
                             batch_format="numpy")
        vectors, done, dim = None, 0, 0
        for batch in out.iter_batches(batch_size=None, batch_format="numpy"):
            vec = batch["vec"]
            if vectors is None:
                dim = vec.shape[1]
                vectors = np.zeros((len(texts), dim), np.float32)
            vectors[batch["i"]] = vec
            done += len(vec)
            if progress:
                progress(done, len(texts))
        if vectors is None or done != len(texts):
            raise BadInput(f"the Ray cluster returned {done} of {len(texts)} vectors; check the cluster's logs.")
        return vectors, dim
    finally:
        if started:
            ray.shutdown()
