"""What a caller asks of retrieval, declared once: `QueryOptions` (the number of hits, the mode, the
fusion, the restrictions in `FilterOptions`, the LLM steps in `LLMSteps`, the embedding override),
checked by `QueryOptions.validate` and passed whole to the `Pipeline` (`pipeline.build_pipeline`).

`Fusion` is how the retrievers' lists are fused, in the one shape a caller gives it, `rag tune`
chooses it and the manifest stores it. A field left None is not given: `resolve_fusion` takes it
from the index's tuned choice (when `tuned`), else from `BUILT_IN`. Asking for the graph list
without a weight for it (none given, none tuned) lets it only re-rank inside the fused candidates,
at RRF weight GRAPH_RERANK (docs/design/rag-defaults.md says why so low).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from llmkit.errors import OptionError
from llmkit.rag.retrieve.fusion import METHODS, NORMS

MODES = ("bm25", "dense", "hybrid")
RETRIEVERS = ("bm25", "dense", "graph")
GRAPH_RERANK = 0.01  # the graph list's RRF weight re-ranking the fused candidates when it has no weight


@dataclass(frozen=True)
class Fusion:
    """How the retrievers' lists are fused (None: not given)."""

    method: str | None = None  # rrf | cc (a weighted sum of normalised scores)
    rrf_k: int | None = None  # k in w / (k + rank)
    weights: dict | None = None  # {'bm25': W, 'dense': W[, 'graph': W]}
    norm: str | None = None  # minmax | z | dbsf | tmm (cc only)
    expand: int | None = None  # pseudo-relevance-feedback terms added to the BM25 query
    parents: bool | None = None  # fuse and return parent windows (small-to-big)

    def given(self) -> dict:
        """The fields that are set."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def over(self, other: Fusion) -> Fusion:
        """These values where given, `other`'s elsewhere."""
        return replace(other, **self.given())

    def to_dict(self) -> dict:
        return self.given()

    @classmethod
    def from_dict(cls, d: dict | None) -> Fusion:
        """The fusion stored in a manifest (its other keys, such as `tuned`, are not fusion settings)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in names})

    def validate(self) -> None:
        if self.method is not None and self.method not in METHODS:
            raise OptionError("unknown fusion {value!r} for {method}; use rrf or cc.", value=self.method)
        if self.norm is not None and self.norm not in NORMS:
            raise OptionError("unknown score normalisation {value!r} for {norm}; use {names}.", value=self.norm,
                              names=", ".join(NORMS))
        if self.rrf_k is not None and self.rrf_k < 0:
            raise OptionError("{rrf_k} must be >= 0, got {value}.", value=self.rrf_k)
        if self.expand is not None and self.expand < 0:
            raise OptionError("{expand} must be >= 0, got {value}.", value=self.expand)
        for name, w in (self.weights or {}).items():
            if name not in RETRIEVERS or w < 0:
                raise OptionError("bad weight {name}={w}; use {weights} bm25=W,dense=W[,graph=W] with W >= 0.",
                                  name=name, w=w)


BUILT_IN = Fusion(method="rrf", rrf_k=60, weights={"bm25": 1.0, "dense": 1.0}, norm="minmax", expand=0,
                  parents=False)


@dataclass(frozen=True)
class FilterOptions:
    """Restrictions applied inside retrieval."""

    filters: tuple[str, ...] = ()  # FIELD=VALUE, FIELD!=V, FIELD>=V, FIELD<V, FIELD~TEXT
    collections: tuple[str, ...] = ()
    route: bool = False  # pick the collection(s) that best match the query
    must: tuple[str, ...] = ()  # words or phrases every hit contains
    auto_must: bool = False  # also require the query's quoted phrases, identifiers and names
    synonyms: str | None = None  # a synonyms file


@dataclass(frozen=True)
class LLMSteps:
    """Steps that use a local model or a re-ranker."""

    rewrite: int = 0  # also search N paraphrases of the query
    subqueries: bool = False
    hyde: bool = False
    llm_path: str | None = None  # the local GGUF model (None: LLMKIT_MODEL or the packaged one)
    rerank: str | None = None  # cross-encoder:DIR or llm:MODEL.gguf
    rerank_depth: int = 20

    @property
    def need_llm(self) -> bool:
        return bool(self.rewrite or self.subqueries or self.hyde)


@dataclass(frozen=True)
class QueryOptions:
    """One query pipeline's options (`rag query`, `rag answer`, `rag eval` configurations, `rag serve`)."""

    k: int = 10  # hits returned
    mode: str = "hybrid"  # bm25 | dense | hybrid
    fusion: Fusion = field(default_factory=Fusion)  # given values; the rest tuned (when `tuned`) or built in
    tuned: bool = True  # fill what `fusion` does not give from the index's tuned choice
    graph: bool | float = False  # the entity-graph list (a float: its re-ranking weight, for measurements)
    chunks: bool = False  # raw chunk hits instead of one hit per document (code: per definition)
    depth: int = 100  # candidates per retriever before fusion (at least k)
    filters: FilterOptions = field(default_factory=FilterOptions)
    steps: LLMSteps = field(default_factory=LLMSteps)
    model: str | None = None  # embedding model override (must give the index's dimension)
    runtime: str = "onnx"  # embedding runtime for queries

    def validate(self) -> None:
        """Every check on the options alone (the index's own are the pipeline's)."""
        if self.mode not in MODES:
            raise OptionError("unknown {mode} {value!r}; use bm25, dense or hybrid.", value=self.mode)
        if self.k < 1 or self.depth < 1:
            raise OptionError("{k} and {depth} must be positive (got {k_value}, {depth_value}).", k_value=self.k,
                              depth_value=self.depth)
        self.fusion.validate()
        st = self.steps
        if st.rewrite < 0 or st.rerank_depth < 1:
            raise OptionError("{rewrite} must be >= 0 and {rerank_depth} >= 1 (got {r}, {d}).", r=st.rewrite,
                              d=st.rerank_depth)
        if st.hyde and self.mode == "bm25":
            raise OptionError("{hyde} embeds a hypothetical answer; use it with {mode} dense or hybrid.")
        if self.graph is not True and self.graph is not False and self.graph < 0:
            raise OptionError("the graph list's weight must be >= 0, got {value}.", value=self.graph)

    @property
    def candidates(self) -> int:
        """Candidates taken from each retriever: `depth`, and never fewer than the hits asked for."""
        return max(self.depth, self.k)


def parse_weights(text: str) -> dict:
    """'bm25=0.3,dense=0.7' -> {'bm25': 0.3, 'dense': 0.7} (a retriever not named keeps weight 1)."""
    out = {"bm25": 1.0, "dense": 1.0}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, val = part.partition("=")
        try:
            out[name.strip()] = float(val)
        except ValueError:
            raise OptionError("cannot read the weight {part!r}; write {weights} bm25=0.3,dense=0.7.", part=part) from None
        if not sep:
            raise OptionError("cannot read the weight {part!r}; write {weights} bm25=0.3,dense=0.7.", part=part)
    return out


def resolve_fusion(opts: QueryOptions, manifest: dict) -> tuple[Fusion, str]:
    """(the fusion to run, where it came from): given values over the index's tuned choice (when
    `opts.tuned`) over the built-in one."""
    tuned = Fusion.from_dict(manifest.get("fusion")) if opts.tuned else Fusion()
    source = "tuned" if tuned.given() else "default"
    if opts.fusion.given():
        source = "flags" if source == "default" else "tuned + flags"
    return opts.fusion.over(tuned.over(BUILT_IN)), source


def parse_config(spec: str, llm_path: str | None = None) -> QueryOptions:
    """'hybrid:bm25=0.3,dense=0.7+expand=10+rerank=cross-encoder:DIR' -> QueryOptions (a `rag eval`
    configuration: MODE[:WEIGHTS] then +PART[=VALUE]...). A named mode is exactly that configuration,
    whatever the index's tuned choice; `tuned` is the index's choice."""
    parts = spec.split("+")
    mode, _, weights = parts[0].partition(":")
    if mode not in (*MODES, "tuned"):
        raise OptionError("{spec!r}: a {config} starts with bm25, dense, hybrid or tuned.", spec=spec)
    fusion = {"weights": parse_weights(weights)} if weights else {}
    top: dict = {}
    flt: dict = {}
    steps: dict = {"llm_path": llm_path}
    for p in parts[1:]:
        name, _, val = p.partition("=")
        if name == "fusion" and val in METHODS:
            fusion["method"] = val
        elif name == "norm" and val:
            fusion["norm"] = val
        elif name == "rrf-k" and val.isdigit():
            fusion["rrf_k"] = int(val)
        elif name in ("expand", "parents"):
            fusion[name] = int(val or 10) if name == "expand" else True
        elif name in ("graph", "chunks"):
            top[name] = (float(val) if val else True) if name == "graph" else True
        elif name in ("route", "auto_must") or (name == "synonyms" and val):
            flt[name] = val if name == "synonyms" else True
        elif name in ("hyde", "subqueries") or (name == "rerank" and val):
            steps[name] = val if name == "rerank" else True
        elif name == "rewrite":
            steps["rewrite"] = int(val or 2)
        else:
            raise OptionError("{spec!r}: unknown part {part!r} of a {config}.", spec=spec, part=p)
    given = Fusion(**fusion)
    return QueryOptions(mode="hybrid" if mode == "tuned" else mode, tuned=mode == "tuned",
                        fusion=given if mode == "tuned" else given.over(BUILT_IN), filters=FilterOptions(**flt),
                        steps=LLMSteps(**steps), **top)
