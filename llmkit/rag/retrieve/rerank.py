"""Re-rankers for the fused candidates: a GGUF cross-encoder run by llama.cpp's rank pooling, a
sentence-transformers CrossEncoder directory, or a local GGUF LLM's pointwise relevance judgement
(log P(yes) - log P(no) for "Does the passage answer the query?").

A GGUF cross-encoder reads each (query, passage) pair as one sequence, laid out as its tokenizer
family does: BERT `[CLS] q [SEP] p [SEP]` with token types 0 then 1, RoBERTa `<s> q </s></s> p </s>`;
the longer of the two is cut first when a pair exceeds the model's length (transformers'
`longest_first`). llama.cpp's BERT graph adds token type 0 to every token, so for a model with a
second token type the pair goes in as input embeddings, token rows plus (type row - type row 0).
"""

from __future__ import annotations

import os
import time

import numpy as np

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
                raise MissingDependency("sentence-transformers", "adapt") from None
            try:
                self.model = CrossEncoder(path, device="cpu")
            except (OSError, ValueError) as e:
                raise BadInput(f"cannot load the cross-encoder '{path}' ({str(e).splitlines()[0]}).") from None

    def score(self, query: str, passages: list[str]) -> list[float]:
        return [float(s) for s in self.model.predict([(query, p) for p in passages], show_progress_bar=False)]


class GgufReranker:
    """A GGUF cross-encoder (rank pooling) scoring (query, passage) pairs in llama.cpp (module doc);
    `seconds` and `pairs` add up what scoring has cost so far."""

    def __init__(self, path: str, threads: int | None = None):
        from llmkit.rag.embed.gguf_runtime import LlamaEncoder, describe

        info = describe(path)
        if info.kind != "re-ranker":
            raise OptionError("'{file}' is an {kind}, not a re-ranker (no rank pooling). Pass it as {model} and a "
                              "cross-encoder GGUF as {rerank}.", file=os.path.basename(path), kind=info.kind)
        self.encoder = enc = LlamaEncoder(info, threads)
        self.bert_pairs = info.tokenizer == "bert"
        lc, v = enc.lc, enc.vocab
        self.start = next(t for t in (lc.llama_vocab_bos(v), lc.llama_vocab_cls(v)) if t >= 0)
        self.sep = next(t for t in (lc.llama_vocab_sep(v), lc.llama_vocab_eos(v)) if t >= 0)
        self.types = _type_rows(info.path) if info.type_count > 1 else None
        self.seconds, self.pairs = 0.0, 0

    def pair(self, query: list[int], passage: list[int]) -> tuple[list[int], list[int]]:
        """Token ids and token types of one pair, cut to the model's length (longest first)."""
        q, p = list(query), list(passage)
        extra = 3 if self.bert_pairs else 4
        while len(q) + len(p) + extra > self.encoder.info.max_seq_length:
            (q if len(q) > len(p) else p).pop()
        if self.bert_pairs:
            return [self.start, *q, self.sep, *p, self.sep], [0] * (len(q) + 2) + [1] * (len(p) + 1)
        ids = [self.start, *q, self.sep, self.sep, *p, self.sep]
        return ids, [0] * len(ids)

    def score(self, query: str, passages: list[str]) -> list[float]:
        t0 = time.perf_counter()
        enc = self.encoder
        qids = enc.tokenize(query.strip())
        pairs = [self.pair(qids, enc.tokenize(p.strip())) for p in passages]
        seqs = [ids for ids, _ in pairs]
        embeds = None
        if self.types is not None and any(any(t) for _, t in pairs):
            embeds = [self.types.inputs(ids, types) for ids, types in pairs]
        out = enc.run(seqs, embeds)
        self.seconds += time.perf_counter() - t0
        self.pairs += len(passages)
        return [float(s) for s in out[:, 0]]


class _TypeRows:
    """A BERT file's token-embedding rows and token-type rows, for input embeddings with types."""

    def __init__(self, tok_info, types: np.ndarray, path: str, data_offset: int):
        self.info, self.path, self.offset = tok_info, path, data_offset
        self.delta = (types - types[0]).astype(np.float32)  # llama.cpp adds type row 0 itself
        self.rows = np.memmap(path, np.uint8, "r", data_offset + tok_info.offset, (tok_info.nbytes,))
        self.row_bytes = tok_info.nbytes // tok_info.n_rows

    def inputs(self, ids: list[int], types: list[int]) -> np.ndarray:
        from llmkit.gguf.reader import TensorInfo
        from llmkit.gguf.dequant import to_f32

        uniq, inv = np.unique(np.asarray(ids, np.int64), return_inverse=True)
        raw = np.concatenate([self.rows[i * self.row_bytes:(i + 1) * self.row_bytes] for i in uniq.tolist()])
        info = TensorInfo(self.info.name, (self.info.shape[0], len(uniq)), self.info.type, 0, len(raw))
        return to_f32(np.ascontiguousarray(raw), info)[inv] + self.delta[np.asarray(types)]


def _type_rows(path: str) -> _TypeRows | None:
    from llmkit.gguf.reader import read_gguf
    from llmkit.gguf.dequant import load_f32

    g = read_gguf(path)
    by = {t.name: t for t in g.tensors}
    if "token_types.weight" not in by or "token_embd.weight" not in by:
        return None
    with open(path, "rb") as f:
        types = load_f32(f, by["token_types.weight"], g.data_offset)
    if len(types) < 2 or np.array_equal(types[1], types[0]):
        return None
    return _TypeRows(by["token_embd.weight"], types, path, g.data_offset)


class LLMReranker:
    def __init__(self, llm, max_chars: int = 1500):
        self.llm, self.max_chars = llm, max_chars

    def score(self, query: str, passages: list[str]) -> list[float]:
        return [self.llm.yes_no(PROMPT.format(query=query, passage=p[:self.max_chars])) for p in passages]


def make_reranker(spec: str, llm_factory):
    """'FILE.gguf' (a cross-encoder GGUF), 'cross-encoder:DIR' or 'llm:MODEL.gguf' (or 'llm' for the
    default local model)."""
    kind, _, arg = spec.partition(":")
    if kind == "cross-encoder" and arg:
        return CrossEncoderReranker(arg)
    if kind == "llm":
        return LLMReranker(llm_factory(arg or None))
    from llmkit.rag.embed.gguf_runtime import is_gguf_path

    if is_gguf_path(spec):
        return GgufReranker(spec)
    raise OptionError("cannot read {rerank} {spec!r}; use a cross-encoder FILE.gguf, cross-encoder:DIR or "
                      "llm:MODEL.gguf.", spec=spec)
