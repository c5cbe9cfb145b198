"""A model switch (`rag adapt`): every chunk of the current generation embedded again with another
model and published as the next generation; chunks, BM25 and metadata stay as they are."""

from __future__ import annotations

import os
import time

import numpy as np

from llmkit.errors import BadInput
from llmkit.rag.embed.models import EmbedOptions
from llmkit.rag.index import db
from llmkit.rag.index.build import IndexOptions, IndexReport, StoreOptions
from llmkit.rag.index.manifest import read_manifest, writer_lock


def switch_model(directory: str, model: str, runtime: str = "onnx", progress=None) -> IndexReport:
    """Re-embed every chunk of the current generation with another model (the one `rag adapt`
    trained) and publish it as the next generation; chunks, BM25 and metadata stay as they are."""
    from llmkit.rag.embed.models import resolve_model
    from llmkit.rag.index.publish import publish

    t0 = time.perf_counter()
    path = resolve_model(model)
    with writer_lock(directory):
        manifest = read_manifest(directory)
        gen = manifest["generation"] + 1
        report = IndexReport(generation=gen)
        try:
            current = set(np.load(os.path.join(directory, f"gen-{manifest['generation']}", "rows.npy")).tolist())
        except (OSError, ValueError) as e:
            raise BadInput(f"index '{directory}' is damaged ({e}). Rebuild it with llmkit rag index.") from None
        manifest.update(model=path, dim=None, embed_runtime=runtime)
        con = db.connect(directory)
        try:
            db.rollback_unfinished(con, manifest["generation"])
            opts = IndexOptions(embed=EmbedOptions(runtime=runtime),
                                store=StoreOptions(index_type=manifest["index"] or "auto"))
            publish(directory, con, manifest, gen, opts, report, progress, keep_ids=current)
        finally:
            con.close()
    report.total_s = time.perf_counter() - t0
    return report
