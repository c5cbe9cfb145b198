"""Sentence embeddings with ONNX Runtime and HF `tokenizers`: no torch on the query path.

A sentence-transformers model is exported once (`onnx_export.py`, which needs torch) into a cache
directory keyed by the model's content (`~/.cache/llmkit/embed/<sha256 prefix>/`):

    spec.json          what sentence-transformers does around the transformer: max sequence length,
                       lower-casing, pooling modes, Dense layers, normalisation, prompts
    tokenizer.json     the model's fast tokenizer (truncation and padding set here from spec.json)
    model-fp32.onnx    the transformer, exported with eager attention and fused by onnxruntime's
                       transformer optimizer (attention, skip-LayerNorm, GELU)
    model-int8.onnx    the same graph, dynamically quantized to int8 with per-channel weights
    openvino/          OpenVINO's compiled bf16 graphs (bf16 indexes, `openvino_runtime.py`)
    dense-N.npz        weights of Dense modules, applied in numpy after pooling

This module only reads such a directory; pooling, Dense and normalisation are done in numpy exactly
as sentence-transformers does them, so fp32 vectors match its own to ~1e-7.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from llmkit.errors import BadFileFormat, MissingDependency

SPEC_FORMAT, SPEC_VERSION = "llmkit-embed-onnx", 1
_SKIP_DIRS = {"onnx", "openvino", ".git", ".cache", "__pycache__"}
_SKIP_SUFFIXES = (".onnx", ".md", ".gitattributes")
# texts in one call from which a second, weight-packed session pays for building itself
BULK_TEXTS = 256
TOKENIZE_WINDOW = 4096  # texts tokenized at once: sorting by length within it pads batches little


@dataclass
class Spec:
    """What sentence-transformers does around the transformer, read from the live model at export."""

    dim: int
    max_seq_length: int
    pooling: list[str]
    normalize: bool
    do_lower_case: bool = False
    include_prompt: bool = True
    dense: list[dict] = field(default_factory=list)  # {"file": "dense-0.npz", "activation": "tanh"}
    prompts: dict = field(default_factory=dict)
    input_names: list[str] = field(default_factory=lambda: ["input_ids", "attention_mask"])
    pad_id: int = 0
    pad_token: str = "[PAD]"
    pad_type_id: int = 0
    padding_side: str = "right"
    unk_id: int | None = None
    fused: bool = True
    model_key: str = ""
    format: str = SPEC_FORMAT
    version: int = SPEC_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def load(cls, path: Path) -> "Spec":
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            if d.get("format") != SPEC_FORMAT or d.get("version") != SPEC_VERSION:
                raise ValueError(f"format {d.get('format')!r} version {d.get('version')!r}")
            known = set(cls.__dataclass_fields__)
            return cls(**{k: v for k, v in d.items() if k in known})
        except (OSError, ValueError, TypeError) as e:
            raise BadFileFormat(f"'{path}' is not a usable embedding export ({e}).") from None


# -- the model's content key --------------------------------------------------------------------------

def _model_files(path: str) -> list[tuple[str, os.stat_result]]:
    out = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for n in sorted(names):
            if n.endswith(_SKIP_SUFFIXES) or n.startswith("."):
                continue
            full = os.path.join(root, n)
            try:
                out.append((os.path.relpath(full, path), os.stat(full)))
            except OSError:
                continue
    return out


def model_key(path: str) -> str:
    """sha256 (first 16 hex digits) of the model directory's files (names and bytes; ONNX/OpenVINO
    copies and READMEs left out). Hashing the weights on every query would cost more than the query,
    so the result is memoised by the files' (size, mtime, inode) in the cache: a query pays a few stat calls."""
    from llmkit.io import atomic_write_text

    files = _model_files(path)
    sig = hashlib.sha256(repr([(r, s.st_size, s.st_mtime_ns, s.st_ino) for r, s in files]).encode()).hexdigest()
    memo_path = embed_cache() / "keys.json"
    try:
        memo = json.loads(memo_path.read_text(encoding="utf-8"))
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    hit = memo.get(os.path.abspath(path))
    if isinstance(hit, dict) and hit.get("sig") == sig and isinstance(hit.get("key"), str):
        return hit["key"]
    h = hashlib.sha256()
    for rel, _ in files:
        h.update(rel.encode() + b"\0")
        with open(os.path.join(path, rel), "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        h.update(b"\0")
    key = h.hexdigest()[:16]
    memo[os.path.abspath(path)] = {"sig": sig, "key": key}
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(memo_path, json.dumps(memo, indent=0))
    except OSError:
        pass  # a read-only cache only costs the hash next time
    return key


def embed_cache() -> Path:
    """Where exports live: <llmkit cache>/embed."""
    from llmkit.config import cache_dir

    return cache_dir("embed")


def export_path(key: str) -> Path:
    return embed_cache() / key


# -- pooling and heads, as sentence-transformers computes them --------------------------------------------

def pool(tokens: np.ndarray, mask: np.ndarray, modes: list[str]) -> np.ndarray:
    """Sentence vectors from token embeddings (batch, seq, dim) and the attention mask, one block per
    pooling mode in the given order, as sentence-transformers' Pooling computes them (left padding
    included).

    >>> t = np.array([[[1., 2.], [3., 4.], [9., 9.]]], np.float32); m = np.array([[1, 1, 0]])
    >>> pool(t, m, ["mean"]).tolist(), pool(t, m, ["cls", "max"]).tolist()
    ([[2.0, 3.0]], [[1.0, 2.0, 3.0, 4.0]])
    """
    maskf = mask.astype(np.float32)[:, :, None]
    first = np.argmax(mask, axis=1)  # first non-padding position (left padding)
    rows = np.arange(len(tokens))
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(tokens[rows, first])
        elif mode == "max":
            out.append(np.where(maskf > 0, tokens, np.float32(-np.inf)).max(axis=1))
        elif mode in ("mean", "mean_sqrt_len_tokens", "mean_sqrt_len"):
            s = (tokens * maskf).sum(axis=1)
            n = np.maximum(maskf.sum(axis=1), np.float32(1e-9))
            out.append(s / n if mode == "mean" else s / np.sqrt(n))
        elif mode == "weightedmean":
            w = np.arange(1, tokens.shape[1] + 1, dtype=np.float32)[None, :] - first[:, None].astype(np.float32)
            w = maskf * w[:, :, None]
            out.append((tokens * w).sum(axis=1) / np.maximum(w.sum(axis=1), np.float32(1e-9)))
        elif mode == "lasttoken":
            flipped = mask[:, ::-1]
            idx = np.where(flipped.max(axis=1) == 0, mask.shape[1] - 1, np.argmax(flipped, axis=1))
            out.append(tokens[rows, mask.shape[1] - 1 - idx] * maskf[rows, mask.shape[1] - 1 - idx])
        else:
            raise BadFileFormat(f"unknown pooling mode {mode!r} in the embedding export; rebuild it.")
    return np.concatenate(out, axis=1).astype(np.float32, copy=False)


def _gelu(x: np.ndarray) -> np.ndarray:
    from math import erf

    return (0.5 * x * (1.0 + np.vectorize(erf, otypes=[np.float64])(x / np.sqrt(2.0)))).astype(np.float32)


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": lambda x: x,
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "gelu": _gelu,
}


def normalize(v: np.ndarray) -> np.ndarray:
    """L2 normalisation as torch's F.normalize (eps 1e-12)."""
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return (v / np.maximum(n, np.float32(1e-12))).astype(np.float32, copy=False)


# -- the runtime -------------------------------------------------------------------------------------------

class OnnxEncoder:
    """Run an export directory: tokenizer + ONNX session + numpy pooling/heads."""

    def __init__(self, directory: Path, precision: str = "fp32", threads: int | None = None):
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError:
            raise MissingDependency("onnxruntime", "rag") from None
        self.dir = Path(directory)
        self.spec = Spec.load(self.dir / "spec.json")
        # bf16 runs the fp32 graph; only bulk calls multiply in bf16 (session_for)
        self.bf16 = precision == "bf16"
        model = self.dir / f"model-{'fp32' if self.bf16 else precision}.onnx"
        try:
            self.tokenizer = Tokenizer.from_file(str(self.dir / "tokenizer.json"))
            self.model_path, self.threads = model, threads or os.cpu_count() or 1
            # no weight pre-packing: a query session then starts by mapping the weights instead of
            # copying them all (docs/design/rag-models.md); session_for swaps it for bulk embedding
            self.session, self.packed, self.bulk = self._session(prepack=False), False, None
            self.dense = []
            for d in self.spec.dense:
                with np.load(self.dir / d["file"]) as z:
                    self.dense.append((z["weight"].astype(np.float32), z["bias"].astype(np.float32) if "bias" in z else None,
                                       ACTIVATIONS[d["activation"]]))
        except Exception as e:  # a damaged cache of any kind: the caller rebuilds it
            raise BadFileFormat(f"the embedding export in '{self.dir}' is damaged ({type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''}).") from None
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.output = self.session.get_outputs()[0].name
        s = self.spec
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=s.max_seq_length, strategy="longest_first")

    def _session(self, prepack: bool):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        if not prepack:
            opts.add_session_config_entry("session.disable_prepacking", "1")
        return ort.InferenceSession(str(self.model_path), opts, providers=["CPUExecutionProvider"])

    def session_for(self, n_texts: int):
        """The session for a call of n texts: many texts pay for copying the weights into packed
        layouts once, or at bf16 for compiling the graph with OpenVINO (where it is installed), since
        every batch after runs faster (docs/design/rag-models.md)."""
        if n_texts >= BULK_TEXTS and not self.packed:
            from llmkit.rag.embed.openvino_runtime import OpenVinoSession, openvino_installed

            if self.bf16 and openvino_installed():
                try:
                    self.bulk = OpenVinoSession(self.model_path, self.threads, self.dir / "openvino")
                except RuntimeError:  # a graph OpenVINO cannot compile: fp32 on ONNX Runtime instead
                    self.bulk = None
            if self.bulk is None:
                self.session = self._session(prepack=True)  # the mapped one is let go
            self.packed = True
        # queries stay on ONNX Runtime's fp32 session even after a bulk call in the same process
        return self.bulk if n_texts >= BULK_TEXTS and self.bulk is not None else self.session

    @property
    def dim(self) -> int:
        return self.spec.dim

    def _prepare(self, texts: list[str]) -> list[str]:
        # sentence-transformers strips each text, and lower-cases it when the model says so
        texts = [t.strip() for t in texts]
        return [t.lower() for t in texts] if self.spec.do_lower_case else texts

    def encode(self, texts: list[str], prompt: str = "", batch_size: int = 32,
               progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Vectors of texts (prompt prepended), in input order; texts are tokenized TOKENIZE_WINDOW at a
        time (their token lists are the bulk of the memory) and batched by token length within it."""
        s = self.spec
        out = np.zeros((len(texts), s.dim), np.float32)
        if not texts:
            return out
        prompt_len = 0
        if prompt and not s.include_prompt:  # ST drops the prompt's tokens from pooling (not its final [SEP])
            prompt_len = len(self.tokenizer.encode(self._prepare([prompt])[0]).ids) - 1
        session = self.session_for(len(texts))
        done = 0
        for start in range(0, len(texts), TOKENIZE_WINDOW):
            window = texts[start:start + TOKENIZE_WINDOW]
            encs = self.tokenizer.encode_batch(self._prepare([prompt + t for t in window]))
            order = sorted(range(len(window)), key=lambda i: len(encs[i].ids))
            for lo in range(0, len(order), batch_size):
                idx = order[lo:lo + batch_size]
                out[[start + i for i in idx]] = self._run(session, [encs[i] for i in idx], prompt_len)
                done += len(idx)
                if progress:
                    progress(done, len(texts))
        return out

    def _run(self, session, encs, prompt_len: int) -> np.ndarray:
        """Vectors of one batch of tokenized texts."""
        s = self.spec
        width = max(len(e.ids) for e in encs)
        ids = np.full((len(encs), width), s.pad_id, np.int64)
        types = np.full((len(encs), width), s.pad_type_id, np.int64)
        mask = np.zeros((len(encs), width), np.int64)
        for row, e in enumerate(encs):
            n = len(e.ids)
            sl = slice(0, n) if s.padding_side == "right" else slice(width - n, width)
            ids[row, sl], types[row, sl], mask[row, sl] = e.ids, e.type_ids, 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        tokens = session.run([self.output], {k: feeds[k] for k in self.inputs})[0]
        pmask = mask
        if prompt_len:
            pmask = mask.copy()
            pmask[:, :prompt_len] = 0
        v = pool(tokens.astype(np.float32, copy=False), pmask, s.pooling)
        for w, b, act in self.dense:
            v = v @ w.T
            if b is not None:
                v = v + b
            v = act(v).astype(np.float32, copy=False)
        return normalize(v) if s.normalize else v

    def token_starts(self, text: str) -> np.ndarray:
        """Start offsets (characters of `text`) of its word pieces, untruncated, no special tokens."""
        self.tokenizer.no_truncation()
        try:
            enc = self.tokenizer.encode(text.lower() if self.spec.do_lower_case else text, add_special_tokens=False)
        finally:
            self.tokenizer.enable_truncation(max_length=self.spec.max_seq_length, strategy="longest_first")
        return np.fromiter((a for a, _ in enc.offsets), np.int64, len(enc.offsets))

    def special_tokens(self) -> int:
        """Tokens the model adds around every text ([CLS] and [SEP] for BERT)."""
        return len(self.tokenizer.encode("").ids)

    def token_ids(self, text: str) -> list[int]:
        """Word-piece ids of a text without special tokens (untruncated)."""
        self.tokenizer.no_truncation()
        try:
            return self.tokenizer.encode(self._prepare([text])[0], add_special_tokens=False).ids
        finally:
            self.tokenizer.enable_truncation(max_length=self.spec.max_seq_length, strategy="longest_first")
