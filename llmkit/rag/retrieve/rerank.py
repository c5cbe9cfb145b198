"""Re-rankers for the fused candidates: a sentence-transformers CrossEncoder, or a local GGUF model's
pointwise relevance judgement (log P(yes) - log P(no) for "Does the passage answer the query?")."""

from __future__ import annotations

import os

from llmkit.errors import BadInput, MissingDependency
from llmkit.errors import OptionError

PROMPT = ("Query: {query}\n\nPassage: {passage}\n\n"
          "Does the passage contain information that answers the query? Answer yes or no.")


class CrossEncoderReranker:
    def __init__(self, path: str):
        if not os.path.isdir(path):
            raise OptionError("cross-encoder '{path}' is not a local model directory. Pass {rerank} "
                              "cross-encoder:DIR.", path=path)
        from llmkit.rag.embed.sbert import offline_env

        with offline_env(("HF_HUB_OFFLINE",)):
            try:
                from sentence_transformers import CrossEncoder
            except ImportError:
                raise MissingDependency("sentence-transformers", "rag") from None
            try:
                self.model = CrossEncoder(path, device="cpu")
            except (OSError, ValueError) as e:
                raise BadInput(f"cannot load the cross-encoder '{path}' ({str(e).splitlines()[0]}).") from None

    def score(self, query: str, passages: list[str]) -> list[float]:
        return [float(s) for s in self.model.predict([(query, p) for p in passages], show_progress_bar=False)]


class LLMReranker:
    def __init__(self, llm, max_chars: int = 1500):
        self.llm, self.max_chars = llm, max_chars

    def score(self, query: str, passages: list[str]) -> list[float]:
        return [self.llm.yes_no(PROMPT.format(query=query, passage=p[:self.max_chars])) for p in passages]


def make_reranker(spec: str, llm_factory):
    """'cross-encoder:DIR' or 'llm:MODEL.gguf' (or 'llm' for the default local model)."""
    kind, _, arg = spec.partition(":")
    if kind == "cross-encoder" and arg:
        return CrossEncoderReranker(arg)
    if kind == "llm":
        return LLMReranker(llm_factory(arg or None))
    raise OptionError("cannot read {rerank} {spec!r}; use cross-encoder:DIR or llm:MODEL.gguf.", spec=spec)
