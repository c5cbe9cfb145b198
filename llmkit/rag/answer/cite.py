"""`rag answer`: a question answered from retrieved sources by a local model, citing them.

The prompt numbers the sources ([1] (where) text ...), asks for citations like [1] and for "do not
know" when the sources do not hold the answer; the model writes greedily (repeatable answers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmkit.errors import BadInput

ANSWER_SYSTEM = ("You answer questions using only the numbered sources given. Cite the sources you use like [1]. "
                 "If the sources do not contain the answer, say that you do not know.")


def where(hit) -> str:
    """'path:line (symbol)' for code, 'path § section' for prose."""
    m = hit.meta
    if m.get("line_start"):
        return f"{hit.source}:{m['line_start']}" + (f" ({m['symbol']})" if m.get("symbol") else "")
    return hit.source + (f" § {m['section']}" if m.get("section") else "")


def shown_texts(pipe, hits) -> list[str]:
    """The texts a pipeline's hits stand for: their parent windows when it returns parents."""
    return [h.parent_text if pipe.fusion.parents else h.text for h in hits]


def compress_for(pipe, llm, query: str, texts: list[str], budget: int):
    """`compress.compress` of `texts` with the best token counter at hand (the LLM's, else the
    embedding model's, else BM25 words) and the pipeline's embedder for sentence relevance."""
    from llmkit.rag.answer.compress import compress

    if getattr(llm, "remote", False):
        from llmkit.rag.remote_llm import no_compression

        raise no_compression()
    dense = pipe.opts.mode != "bm25"
    if llm is not None:
        count = llm.count_tokens
    elif dense:
        count = pipe.embedder().count_tokens
    else:
        from llmkit.rag.index.bm25 import tokenize

        count = lambda t: len(tokenize(t))  # noqa: E731
    return compress(query, texts, budget, count, embedder=pipe.embedder() if dense else None, llm=llm)


@dataclass
class Sources:
    question: str
    hits: list
    texts: list[str]
    refs: list[str]
    compressed: object = None  # compress.Compressed when the texts were compressed

    def prompt(self) -> str:
        """The user turn: the numbered sources, then the question."""
        sources = "\n\n".join(f"[{i}] ({ref})\n{t}" for i, (ref, t) in enumerate(zip(self.refs, self.texts), 1))
        return f"Sources:\n\n{sources}\n\nQuestion: {self.question}\nAnswer with citations:"


@dataclass
class Answer:
    question: str
    text: str
    sources: Sources = field(repr=False, default=None)

    def to_dict(self) -> dict:
        return {"question": self.question, "answer": self.text,
                "sources": [{"n": i, **h.to_dict()} for i, h in enumerate(self.sources.hits, 1)]}


def gather_sources(pipe, llm, question: str, compress_to: int = 0) -> Sources:
    """Retrieve the question's sources (compressed to about `compress_to` tokens when given)."""
    res = pipe.run(question)
    if not res.hits:
        raise BadInput("no sources found for the question; loosen the filters or index more documents.")
    texts = shown_texts(pipe, res.hits)
    compressed = None
    if compress_to:
        compressed = compress_for(pipe, llm, question, texts, compress_to)
        texts = compressed.texts
    return Sources(question, res.hits, texts, [where(h) for h in res.hits], compressed)


def answer(llm, sources: Sources, n_predict: int = 256, on_text=None) -> Answer:
    """The model's answer to the sources' question, streamed to `on_text` as it is written."""
    text = llm.complete(sources.prompt(), n_predict, system=ANSWER_SYSTEM, on_text=on_text)
    return Answer(sources.question, text, sources)
