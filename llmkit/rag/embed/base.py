"""The embedder interface every runtime implements (ONNX Runtime, OpenVINO, torch, llama.cpp, an
OpenAI-compatible endpoint): passages and queries in, L2-normalised float32 vectors out."""

from __future__ import annotations

from typing import Callable

import numpy as np

from llmkit.rag.embed.models import DEFAULT_MODEL, check_precision, resolve_model


class Embedder:
    """Encode passages and queries into L2-normalised float32 vectors (inner product = cosine)."""

    runtime = ""
    batch_size = 32

    def __init__(self, name: str | None, precision: str, query_prompt: str, passage_prompt: str):
        check_precision(precision)
        self.name = name or DEFAULT_MODEL
        self.path = resolve_model(name)
        self.precision = precision
        self._explicit = (query_prompt, passage_prompt)
        self.dim = 0

    def _set_prompts(self, prompts: dict) -> None:
        q, p = self._explicit
        self.query_prompt = q or prompts.get("query", "")
        self.passage_prompt = p or prompts.get("document", prompts.get("passage", ""))

    def encode(self, texts: list[str], prompt: str = "", progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        raise NotImplementedError

    def expect(self, n: int) -> None:
        """Say that about n passages are coming in several calls (an engine may prepare for bulk work)."""

    def passages(self, texts: list[str], progress=None) -> np.ndarray:
        return self.encode(texts, self.passage_prompt, progress)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self.encode(texts, self.query_prompt)

    def token_ids(self, text: str) -> list[int]:
        raise NotImplementedError

    def unknown_share(self, text: str) -> float:
        """Share of the text's word pieces the tokenizer maps to [UNK] (e.g. Chinese for MiniLM)."""
        ids = self.token_ids(text)
        if self.unk_id is None or not ids:
            return 0.0
        return sum(1 for i in ids if i == self.unk_id) / len(ids)

    def count_tokens(self, text: str) -> int:
        return len(self.token_ids(text))

    def token_starts(self, text: str) -> np.ndarray:
        """Start offsets (characters) of the text's word pieces."""
        raise NotImplementedError

    @property
    def window(self) -> int:
        """Word pieces of a passage the model reads: its maximum sequence length less the special
        tokens and the passage prompt (256 - 2 for all-MiniLM-L6-v2). Longer text is cut off."""
        prompt = len(self.token_ids(self.passage_prompt)) if self.passage_prompt else 0
        return self.max_seq_length - self.n_special - prompt
