"""A sentence-transformers or Hugging Face model directory read without torch: the transformer's
config, what sentence-transformers does around it (pooling, normalisation, sequence length, prompts),
the tokenizer file and the safetensors weights.

Weights are read straight from the safetensors layout (an 8-byte header length, a JSON table of
name -> dtype/shape/byte range, then the raw little-endian data), so neither torch nor the
`safetensors` package is needed.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from llmkit.errors import BadFileFormat, BadInput

_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "I64": "<i8", "I32": "<i4"}
POOLING_FLAGS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                 "max": "pooling_mode_max_tokens", "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                 "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}


def read_json(path: str) -> dict | list | None:
    """A JSON file's content, None where it does not exist; unreadable JSON is a BadFileFormat."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise BadFileFormat(f"'{path}' is not readable JSON ({e}).") from None


@dataclass
class SentenceConfig:
    """What sentence-transformers does around the transformer (defaults: a plain HF model)."""

    pooling: list[str] = field(default_factory=list)  # modes in order ([] for a cross-encoder)
    normalize: bool = False
    dense: list[str] = field(default_factory=list)  # Dense module directories (after pooling)
    others: list[str] = field(default_factory=list)  # modules no converter reproduces
    max_seq_length: int | None = None
    do_lower_case: bool = False
    prompts: dict = field(default_factory=dict)
    include_prompt: bool = True


def read_sentence_config(directory: str) -> SentenceConfig:
    """The sentence-transformers modules of a directory (modules.json and each module's config)."""
    sc = SentenceConfig()
    modules = read_json(os.path.join(directory, "modules.json")) or []
    for m in modules:
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        path = os.path.join(directory, m.get("path", ""))
        if kind == "Transformer":
            continue
        if kind == "Pooling":
            cfg = read_json(os.path.join(path, "config.json")) or {}
            mode = cfg.get("pooling_mode")
            if mode:  # sentence-transformers >= 6: a mode or a list of modes
                sc.pooling = [mode] if isinstance(mode, str) else list(mode)
            else:
                sc.pooling = [name for name, flag in POOLING_FLAGS.items() if cfg.get(flag)]
            sc.include_prompt = bool(cfg.get("include_prompt", True))
        elif kind == "Normalize":
            sc.normalize = True
        elif kind == "Dense":
            sc.dense.append(path)
        else:
            sc.others.append(kind)
    st = read_json(os.path.join(directory, "sentence_bert_config.json")) or {}
    tc = read_json(os.path.join(directory, "tokenizer_config.json")) or {}
    if st.get("max_seq_length"):
        sc.max_seq_length = int(st["max_seq_length"])
    elif modules and isinstance(tc.get("model_max_length"), int) and tc["model_max_length"] < 1 << 20:
        sc.max_seq_length = tc["model_max_length"]  # sentence-transformers >= 6 keeps the limit here
    sc.do_lower_case = bool(st.get("do_lower_case", False))
    cst = read_json(os.path.join(directory, "config_sentence_transformers.json")) or {}
    sc.prompts = {k: v for k, v in (cst.get("prompts") or {}).items() if isinstance(v, str) and v}
    return sc


class Safetensors:
    """The tensors of one or more .safetensors files (read on demand, float32 out)."""

    def __init__(self, paths: list[str]):
        self.where: dict[str, tuple[str, dict, int]] = {}
        for p in paths:
            try:
                with open(p, "rb") as f:
                    raw = f.read(8)
                    if len(raw) != 8:
                        raise ValueError("shorter than its header")
                    (n,) = struct.unpack("<Q", raw)
                    if n > 100 << 20 or n > os.path.getsize(p):
                        raise ValueError(f"header length {n} is absurd")
                    head = json.loads(f.read(n))
            except (OSError, ValueError) as e:
                raise BadFileFormat(f"'{p}' is not a safetensors file ({e}).") from None
            for name, info in head.items():
                if name != "__metadata__":
                    self.where[name] = (p, info, 8 + n)

    def names(self) -> list[str]:
        return list(self.where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.where[name][1]["shape"])

    def get(self, name: str) -> np.ndarray:
        """The tensor as float32 in its stored (numpy) shape."""
        path, info, base = self.where[name]
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise BadFileFormat(f"tensor '{name}' in '{path}' has dtype {info['dtype']}, which the converter "
                                "does not read.")
        a, b = info["data_offsets"]
        with open(path, "rb") as f:
            f.seek(base + a)
            raw = f.read(b - a)
        arr = np.frombuffer(raw, dtype=dtype)
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        if arr.size != int(np.prod(info["shape"], dtype=np.int64)):
            raise BadFileFormat(f"tensor '{name}' in '{path}' is cut short.")
        return arr.astype(np.float32).reshape(info["shape"])


@dataclass
class SourceModel:
    """A model directory: config.json, the sentence-transformers config, tokenizer.json, weights."""

    path: str
    config: dict
    sentence: SentenceConfig
    tokenizer: dict
    tokenizer_config: dict
    weights: Safetensors

    @property
    def architecture(self) -> str:
        return (self.config.get("architectures") or [self.config.get("model_type", "?")])[0]


def open_source(directory: str) -> SourceModel:
    """Read a model directory, refusing what the converter cannot take, with the reason."""
    if not os.path.isdir(directory):
        raise BadInput(f"'{directory}' is not a directory. Pass a sentence-transformers or Hugging Face model "
                       "directory.")
    config = read_json(os.path.join(directory, "config.json"))
    if not isinstance(config, dict):
        raise BadInput(f"'{directory}' has no config.json; it is not a Hugging Face model directory.")
    tok = read_json(os.path.join(directory, "tokenizer.json"))
    if not isinstance(tok, dict):
        raise BadInput(f"'{directory}' has no tokenizer.json (the fast tokenizer file); the converter reads the "
                       "vocabulary from it. Save the model with a fast tokenizer.")
    shards = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    if not shards:
        bins = [n for n in os.listdir(directory) if n.endswith(".bin")]
        hint = " (it has PyTorch .bin weights: re-save them as safetensors)" if bins else ""
        raise BadInput(f"'{directory}' has no .safetensors weights{hint}.")
    return SourceModel(directory, config, read_sentence_config(directory), tok,
                       read_json(os.path.join(directory, "tokenizer_config.json")) or {},
                       Safetensors([os.path.join(directory, n) for n in shards]))
