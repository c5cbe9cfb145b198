"""Opening an index directory for a run: the manifest to extend, checked against the run's options
(vectors of another model, other BM25 terms or another vector store are refused), or a new one for
an empty directory."""

from __future__ import annotations

import os
import re

from llmkit.errors import BadInput, OptionError
from llmkit.rag.embed.models import MIXABLE, default_precision
from llmkit.rag.index.manifest import MANIFEST, new_manifest, read_manifest

OWN = re.compile(r"writer\.lock|chunks\.sqlite(-wal|-shm|-journal)?|gen-\d+|\.manifest\.json\..*\.tmp|milvus\.db|\.milvus\.db\.lock|\.milvus\.db\.llmkit\.lock")  # what an index directory holds


def check_compatible(directory: str, m: dict, opts) -> None:
    """Refuse options that would mix incompatible vectors or terms into an existing index."""
    e, st = opts.embed, opts.store
    want = e.model or None
    have = m["model"]
    from llmkit.rag.embed.models import same_model

    if want is not None and not same_model(want, have):
        raise BadInput(f"index '{directory}' was built with the embedding model '{have}'; vectors of "
                       f"'{want}' cannot be mixed into it. Use a new index directory.")
    if (e.query_prompt or e.passage_prompt) and (e.query_prompt, e.passage_prompt) != (
            m["query_prompt"], m["passage_prompt"]):
        raise OptionError("this index was built with other {query_prompt}/{passage_prompt} values; "
                          "use a new index directory to change them.")
    have_an, want_an = m["analysis"], st.analysis
    if want_an and want_an != have_an:
        raise OptionError("this index analyses BM25 terms as {have}, not {want}; BM25 terms cannot be mixed. Use a "
                          "new index directory.", have=have_an, want=want_an)
    have_prec = m["embed_precision"]
    if e.precision and e.precision != have_prec and not {e.precision, have_prec} <= set(MIXABLE):
        raise BadInput(f"index '{directory}' holds {have_prec} embeddings; {e.precision} vectors cannot be "
                       "mixed into it. Use a new index directory.")
    if st.store is not None:
        from llmkit.rag.index.milvus import parse_store

        want_store = parse_store(st.store, directory)
        have_store = m["store"]
        if (want_store or {}).get("uri") != (have_store or {}).get("uri"):
            raise OptionError("index '{directory}' keeps its vectors in {have}, not {want}. Drop {store} to extend "
                              "it, or build a new index directory.", directory=directory,
                              have=(have_store or {}).get("uri", "faiss"), want=st.store)


def open_or_create(directory: str, opts) -> dict:
    """The manifest to extend; a new one for an empty directory, or one holding only what a first run
    killed before its manifest left behind (its rows are rolled back as any unfinished run's)."""
    existing = os.listdir(directory) if os.path.isdir(directory) else []
    if os.path.exists(os.path.join(directory, MANIFEST)) or any(not OWN.fullmatch(n) for n in existing):
        m = read_manifest(directory)
        check_compatible(directory, m, opts)
        from llmkit.rag.endpoint import is_endpoint

        if is_endpoint(opts.embed.model):  # the index's model, served from where the run says
            from llmkit.rag.embed.models import resolve_model

            m["model"] = resolve_model(opts.embed.model)
        if opts.store.keeps_graph and not m["graph"]:
            m["graph"] = True  # enabled now: the chunks already indexed get their entities at publish
        return m
    from llmkit.rag.index.milvus import parse_store

    e = opts.embed
    spec = parse_store(opts.store.store, directory)  # checked before anything is created
    os.makedirs(directory, exist_ok=True)
    from llmkit import config

    model = e.model or config.text("LLMKIT_EMBED_URL")
    if model:
        from llmkit.rag.embed.models import resolve_model

        model = resolve_model(model)
    precision = e.precision or default_precision(model, e.runtime)
    return new_manifest(model=model or "default", embed_precision=precision, embed_runtime=e.runtime,
                        query_prompt=e.query_prompt, passage_prompt=e.passage_prompt,
                        analysis=opts.store.analysis or "english", graph=opts.store.keeps_graph, store=spec)
