"""Sentence embeddings: one interface, three engines.

- `onnx` (default): ONNX Runtime + HF tokenizers over an export cached per model content
  (`onnx_runtime.py`, made by `onnx_export.py`); fp32 matches sentence-transformers' vectors, bf16
  embeds passages through OpenVINO's bf16 products (`openvino_runtime.py`) within rounding of them,
  int8 indexes faster at a small cost in dense quality (docs/design/rag-models.md).
  It imports no torch, so queries answer at shell speed.
- `torch`: sentence-transformers itself (also what the export and fine-tuning use).
- a GGUF file runs on llama.cpp whatever the runtime (`gguf_runtime.py`): pooling from the file, its
  prompts and sequence length when a converted file records them.

Both apply the model's own query/document prompts (sentence-transformers' `prompts`) unless the index
sets explicit ones. Which model a name means is `models.py`'s business.
"""

from __future__ import annotations

import os

import numpy as np

from llmkit.errors import BadFileFormat, BadInput
from llmkit.rag.embed.base import Embedder
from llmkit.rag.embed.models import MIXABLE, RUNTIMES
from llmkit.errors import OptionError

_LOADED: dict = {}  # loaded models and ONNX sessions, one per process


class OnnxEmbedder(Embedder):
    runtime = "onnx"
    batch_size = 16  # batches of similar token length; larger batches were no faster on CPU

    def __init__(self, name=None, precision="fp32", query_prompt="", passage_prompt="", progress=None,
                 threads: int | None = None):
        super().__init__(name, precision, query_prompt, passage_prompt)
        from llmkit.rag.embed.onnx_runtime import OnnxEncoder, model_key

        self.key = model_key(self.path)
        cached = _LOADED.get((self.key, precision, threads))
        if cached is None:
            from llmkit.rag.embed.onnx_export import ensure_export

            graph = "fp32" if precision == "bf16" else precision  # bf16 compiles the fp32 graph
            directory = ensure_export(self.path, self.key, graph, progress=progress)
            try:
                cached = OnnxEncoder(directory, precision, threads)
            except BadFileFormat:  # a damaged cache entry: export again rather than fail
                directory = ensure_export(self.path, self.key, graph, rebuild=True, progress=progress)
                cached = OnnxEncoder(directory, precision, threads)
            _LOADED[(self.key, precision, threads)] = cached
        self.encoder = cached
        self.dim = cached.dim
        self.max_seq_length = cached.spec.max_seq_length
        self.n_special = cached.special_tokens()
        self.unk_id = cached.spec.unk_id
        self._set_prompts(cached.spec.prompts)

    def encode(self, texts, prompt="", progress=None):
        from llmkit.rag.embed.onnx_runtime import normalize

        return normalize(self.encoder.encode(texts, prompt, self.batch_size, progress))

    def expect(self, n):
        self.encoder.session_for(n)

    def token_ids(self, text):
        return self.encoder.token_ids(text)

    def token_starts(self, text):
        return self.encoder.token_starts(text)


class TorchEmbedder(Embedder):
    runtime = "torch"
    batch_size = 64

    def __init__(self, name=None, precision="fp32", query_prompt="", passage_prompt="", progress=None,
                 threads: int | None = None):
        super().__init__(name, precision, query_prompt, passage_prompt)
        if precision not in MIXABLE:
            raise OptionError("the torch runtime embeds in fp32 only; use {runtime} onnx for int8.")
        from llmkit.rag.embed.sbert import load_sentence_transformer

        if self.path not in _LOADED:  # one load per process, however many indexes or queries use it
            _LOADED[self.path] = load_sentence_transformer(self.path)
        self.model = _LOADED[self.path]
        dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(dim())
        self.unk_id = getattr(self.model.tokenizer, "unk_token_id", None)
        self.max_seq_length = int(self.model.max_seq_length)
        self.n_special = len(self.model.tokenizer("")["input_ids"])
        self._set_prompts(dict(getattr(self.model, "prompts", {}) or {}))

    def encode(self, texts, prompt="", progress=None):
        out = np.zeros((len(texts), self.dim), np.float32)
        # sort by length so each batch pads little; results go back to the input order
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for lo in range(0, len(texts), self.batch_size):
            idx = order[lo:lo + self.batch_size]
            out[idx] = self.model.encode([prompt + texts[i] for i in idx], batch_size=self.batch_size,
                                         normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
            if progress:
                progress(min(lo + self.batch_size, len(texts)), len(texts))
        return out

    def token_ids(self, text):
        return self.model.tokenizer(text, add_special_tokens=False)["input_ids"]

    def token_starts(self, text):
        got = self.model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        return np.fromiter((a for a, _ in got), np.int64, len(got))


class GgufEmbedder(Embedder):
    """A GGUF embedder run by llama.cpp (`gguf_runtime.py`); vectors L2-normalised here."""

    runtime = "llama.cpp"

    def __init__(self, name=None, precision="fp32", query_prompt="", passage_prompt="", progress=None,
                 threads: int | None = None):
        super().__init__(name, precision, query_prompt, passage_prompt)
        if precision not in MIXABLE:
            raise OptionError("a GGUF embedder computes at its file's precision; drop {embed_precision} int8 (or "
                              "quantize the GGUF file instead).")
        from llmkit.rag.embed.gguf_runtime import LlamaEncoder, describe_embedder

        info = describe_embedder(self.path)
        key = ("gguf", self.path, os.path.getmtime(self.path), threads)
        if key not in _LOADED:
            _LOADED[key] = LlamaEncoder(info, threads)
        self.encoder = _LOADED[key]
        self.dim = info.dim
        self.max_seq_length = info.max_seq_length
        self.n_special = len(self.encoder.head) + len(self.encoder.tail)
        self.unk_id = self.encoder.unk_id
        self._set_prompts(info.prompts)

    def encode(self, texts, prompt="", progress=None):
        from llmkit.rag.embed.onnx_runtime import normalize

        if not texts:
            return np.zeros((0, self.dim), np.float32)
        # sentence-transformers strips each text before tokenizing
        seqs = [self.encoder.encode_text(prompt + t.strip()) for t in texts]
        return normalize(self.encoder.run(seqs, progress=progress))

    def token_ids(self, text):
        return self.encoder.tokenize(text)

    def token_starts(self, text):
        return self.encoder.token_starts(text)


def load_embedder(name: str | None = None, runtime: str = "onnx", precision: str = "fp32", query_prompt: str = "",
                  passage_prompt: str = "", progress=None, threads: int | None = None) -> Embedder:
    """The embedding model `name` (None: packaged MiniLM; a .gguf file: llama.cpp; an http(s) URL: an
    OpenAI-compatible endpoint) on `runtime` at `precision`."""
    if runtime not in RUNTIMES:
        raise BadInput(f"unknown embedding runtime {runtime!r}; use onnx or torch.")
    from llmkit.rag.endpoint import is_endpoint

    if is_endpoint(name):  # an OpenAI-compatible server computes the vectors, whatever the runtime
        from llmkit.rag.embed.openai_endpoint import EndpointEmbedder

        return EndpointEmbedder(name, precision, query_prompt, passage_prompt, progress, threads)
    from llmkit.rag.embed.gguf_runtime import is_gguf_path

    if is_gguf_path(name):
        if runtime == "torch":
            raise OptionError("a GGUF embedder runs on llama.cpp; drop {runtime} torch.")
        return GgufEmbedder(name, precision, query_prompt, passage_prompt, progress, threads)
    cls = OnnxEmbedder if runtime == "onnx" else TorchEmbedder
    return cls(name, precision, query_prompt, passage_prompt, progress, threads)
