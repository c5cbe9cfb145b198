"""Loading sentence-transformers models (the torch runtime, the ONNX export and fine-tuning use them).

The Hugging Face libraries read their settings from the environment; `offline_env` sets the ones
llmkit wants (offline, no tokenizer threads, no download bars) only while a model loads, leaving any
value the user set, and restores the environment afterwards.
"""

from __future__ import annotations

import os

from llmkit.errors import BadInput, MissingDependency
from llmkit.config import scoped_env

HUB_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def offline_env(names=tuple(HUB_ENV)):
    """These Hugging Face variables (unless already set) for the block, then removed again."""
    return scoped_env({n: HUB_ENV[n] for n in names})


def load_sentence_transformer(model_path: str):
    """A SentenceTransformer on the CPU from a local directory (errors say what is missing)."""
    with offline_env():
        try:
            import torch  # noqa: F401
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise MissingDependency("sentence-transformers", "rag") from None
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()
        except ImportError:
            pass
        if not os.path.isfile(os.path.join(model_path, "config.json")) and not os.path.isfile(
                os.path.join(model_path, "modules.json")):
            raise BadInput(f"'{model_path}' is not a sentence-transformers model directory (no modules.json or "
                           "config.json). Pass a directory saved by sentence-transformers or a Hugging Face model.")
        try:
            return SentenceTransformer(model_path, device="cpu")
        except Exception as e:  # transformers raises OSError/ValueError/KeyError... on incomplete directories
            raise BadInput(f"cannot load the embedding model '{model_path}' ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}). It needs its config.json, weights and "
                           "tokenizer.") from None
