"""The embedding half of publishing: the index's model loaded as it was built, and the journal of
vectors embedded but not yet published (`db.py`): texts the journal does not hold are embedded in
batches, each committed as it finishes, and a generation reads its new vectors back from it."""

from __future__ import annotations

import json
import time

import numpy as np

from llmkit.errors import BadInput
from llmkit.rag.embed.models import stored_model
from llmkit.rag.index import db


def load_index_embedder(manifest, e, progress=None):
    """The index's embedding model, loaded here (`e`: the run's EmbedOptions, for the runtime)."""
    from llmkit.rag.embed.embedder import load_embedder

    return load_embedder(stored_model(manifest["model"]), e.runtime, manifest["embed_precision"],
                         manifest["query_prompt"], manifest["passage_prompt"], progress=progress)


def journal_space(manifest) -> str:
    """The journal's name for the vectors of this index's model: same text, same space, same vector."""
    return json.dumps([manifest["model"], manifest["embed_precision"], manifest["passage_prompt"]])


def embed_missing(con, manifest, opts, items, dim, report, progress) -> int | None:
    """Embed the texts of the (text hash, chunk id) pairs the journal does not hold yet, in batches of
    LLMKIT_INDEX_BATCH chunks, each committed to the journal as it finishes (a killed run keeps
    them); returns the vectors' dimension (None: nothing embedded, none known). Texts are tokenized
    batch by batch, and only one batch of vectors is in memory at a time."""
    from llmkit import config

    space = journal_space(manifest)
    texts = dict(items)  # unique text hashes (a corpus kept without dedupe may repeat a text) -> a chunk id
    held = db.journal_keys(con, space, list(texts))
    report.vectors_resumed = len(held)
    if held and not dim:
        dim = journal_dim(con, manifest, next(iter(held)))
    todo = [k for k in texts if k not in held]
    del held
    if not todo:
        return dim
    e, batch = opts.embed, config.size("LLMKIT_INDEX_BATCH")
    t = time.perf_counter()
    emb = None
    if not e.ray:
        emb = load_index_embedder(manifest, e, progress)
        check_dim(emb.dim, dim)  # before embedding: a wrong model is refused at once
        report.window = emb.window
        emb.expect(len(todo))  # a long run pays for the faster bulk session once
    step = batch if emb is not None else batch * 64  # a Ray round starts its runtime and actors: fewer, larger
    for lo in range(0, len(todo), step):
        keys = todo[lo:lo + step]
        part = list(db.texts_of(con, [texts[k] for k in keys]))
        if emb is not None:
            report.over_window += sum(1 for x in part if emb.count_tokens(x) > emb.window)
            new, got_dim = emb.passages(part), emb.dim
        else:
            from llmkit.rag.embed.ray_embed import embed_on_ray

            model = stored_model(manifest["model"])
            new, got_dim = embed_on_ray(part, model, e.runtime, manifest["embed_precision"], manifest["query_prompt"],
                                        manifest["passage_prompt"], address=e.ray, workers=e.ray_workers,
                                        batch_size=e.ray_batch)
            check_dim(got_dim, dim)  # (Ray: known only from the vectors)
        dim = got_dim
        db.journal_put(con, space, zip(keys, new))
        report.embedded += len(keys)
        if progress:
            progress("embedding (ray)" if emb is None else "embedding", lo + len(keys), len(todo))
    report.embed_s = time.perf_counter() - t
    return dim


def journal_dim(con, manifest, key: str) -> int:
    """The dimension of the journal's vectors (from one of them)."""
    return len(db.journal_get(con, journal_space(manifest), [key])[key]) // 4


def journalled(con, manifest, keys: list[str], dim: int, report) -> np.ndarray:
    """The journal's vectors of these text hashes, in order (noted in the report: the journal lets
    go of them once the generation is live)."""
    report.journalled.extend(keys)
    got = db.journal_get(con, journal_space(manifest), keys)
    return np.frombuffer(b"".join(got[k] for k in keys), "<f4").reshape(len(keys), dim)


def check_dim(got: int, dim: int | None) -> None:
    if dim and got != dim:
        raise BadInput(f"the embedding model gives {got}-d vectors but the index holds {dim}-d ones. "
                       "Use the model the index was built with.")
