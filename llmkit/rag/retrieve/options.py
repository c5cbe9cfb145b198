"""What a caller asks of retrieval, and the builder that turns it into a ready `Pipeline`.

A `QueryRequest` bundles the fusion (`FusionRequest`: mode, weights, method, expansion, parents, the
graph list), the restrictions (`FilterOptions`) and the LLM steps (`LLMSteps`: rewriting, sub-queries,
HyDE, re-ranking). Fusion values left as None come from the index's tuned choice (when `tuned`),
else from the built-in default (`settings.py`). Retrieval policy lives here, not in a front end:
asking for the graph list without a weight (none given, none tuned) lets it only re-rank inside the
fused candidates at RRF weight GRAPH_RERANK.

GRAPH_RERANK, measured (benchmarks/rag_quality.py; Cranfield / WordNet->Webster hybrid nDCG@10 vs
without the graph): 0.01 +0.000 / +0.000 (a tie-breaker), 0.02 +0.004 / -0.005, 0.05 +0.006 /
-0.018, 0.25 -0.022 / -0.078. The graph list helps Cranfield a little and hurts the dictionary at
every weight above 0.01, so without a tuned weight it only breaks ties. Before, the flag added the
list at weight 1.0 to whatever fusion was in use; on a tuned score fusion (bm25 0.5 / dense 0.5)
the min-max-normalised graph list then decided the order (a library-science collection: 0.434 ->
0.210).
"""

from __future__ import annotations

from dataclasses import dataclass, field

GRAPH_RERANK = 0.01  # the graph list's RRF weight re-ranking the fused candidates when it has no weight


@dataclass
class FusionRequest:
    """How the retrievers' lists are made and fused (None: tuned, else built-in)."""

    mode: str = "hybrid"  # bm25 | dense | hybrid
    weights: str | None = None  # 'bm25=0.3,dense=0.7[,graph=0.2]'
    method: str | None = None  # rrf | cc
    norm: str | None = None  # minmax | z | dbsf | tmm (cc only)
    rrf_k: int | None = None
    expand: int | None = None  # pseudo-relevance-feedback terms
    parents: bool | None = None  # return parent windows (small-to-big)
    graph: bool | float = False  # use the entity-graph list (a float: its re-ranking weight, for measurements)
    chunks: bool = False  # raw chunk hits instead of one per document
    depth: int = 100  # candidates per retriever before fusion
    tuned: bool = True  # fill what is not given from the index's tuned choice


@dataclass
class FilterOptions:
    """Restrictions applied inside retrieval."""

    filters: tuple[str, ...] = ()  # FIELD=VALUE, FIELD!=V, FIELD>=V, FIELD<V, FIELD~TEXT
    collections: tuple[str, ...] = ()
    route: bool = False  # pick the collection(s) that best match the query
    must: tuple[str, ...] = ()  # words or phrases every hit contains
    auto_must: bool = False  # also require the query's quoted phrases, identifiers and names
    synonyms: str | None = None  # a synonyms file


@dataclass
class LLMSteps:
    """Steps that use a local model or a re-ranker."""

    rewrite: int = 0  # also search N paraphrases of the query
    subqueries: bool = False
    hyde: bool = False
    llm_path: str | None = None  # the local GGUF model (None: LLMKIT_MODEL or the packaged one)
    rerank: str | None = None  # cross-encoder:DIR or llm:MODEL.gguf
    rerank_depth: int = 20


@dataclass
class QueryRequest:
    fusion: FusionRequest = field(default_factory=FusionRequest)
    filters: FilterOptions = field(default_factory=FilterOptions)
    steps: LLMSteps = field(default_factory=LLMSteps)
    model: str | None = None  # embedding model override (must give the index's dimension)
    runtime: str = "onnx"  # embedding runtime for queries


def build_pipeline(index_dir: str, k: int, req: QueryRequest, need_llm: bool = False):
    """(Pipeline, the local LLM or None) for `req` over the index in `index_dir`; the LLM is loaded
    when a step or the caller (`need_llm`) needs it, once, and shared with an llm: re-ranker."""
    from llmkit.rag.index.reader import Index
    from llmkit.rag.retrieve.expand import load_synonyms
    from llmkit.rag.retrieve.pipeline import Pipeline, QueryOptions
    from llmkit.rag.retrieve.settings import fusion_settings, parse_weights

    f, flt, st = req.fusion, req.filters, req.steps
    index = Index(index_dir)
    w = parse_weights(f.weights) if f.weights else None
    settings, source = fusion_settings(index.manifest if f.tuned else {}, method=f.method, k=f.rrf_k, weights=w,
                                       norm=f.norm, expand=f.expand, parents=f.parents)
    graph_rerank = 0.0
    if f.graph and "graph" not in settings["weights"]:  # no tuned or given weight: re-rank only
        graph_rerank = GRAPH_RERANK if f.graph is True else float(f.graph)
        index.graph  # noqa: B018 -- an index without a graph says how to build one
    qo = QueryOptions(mode=f.mode, k=k, weights=settings["weights"], rrf_k=settings["k"], fusion=settings["method"],
                      norm=settings["norm"], depth=max(f.depth, k), filters=list(flt.filters),
                      collections=list(flt.collections), route=flt.route, must=list(flt.must),
                      auto_must=flt.auto_must, synonyms=load_synonyms(flt.synonyms) if flt.synonyms else None,
                      expand=settings["expand"], rewrite=st.rewrite, subqueries=st.subqueries, hyde=st.hyde,
                      parents=settings["parents"], rerank_depth=st.rerank_depth, chunks=f.chunks,
                      graph_rerank=graph_rerank)
    qo.validate()
    qo.source = source
    cache = {}

    def llm_factory(path=None):
        key = path or st.llm_path
        if key not in cache:
            from llmkit.rag.llm import LocalLLM

            cache[key] = LocalLLM(key)
        return cache[key]

    llm = llm_factory() if (st.rewrite or st.subqueries or st.hyde or need_llm) else None
    reranker = None
    if st.rerank:
        from llmkit.rag.retrieve.rerank import make_reranker

        reranker = make_reranker(st.rerank, llm_factory)
    return Pipeline(index, qo, llm=llm, reranker=reranker, model=req.model, runtime=req.runtime), llm
