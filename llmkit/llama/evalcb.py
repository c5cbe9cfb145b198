"""Watching and changing llama.cpp's tensors while it evaluates (the scheduler's eval callback).

llama.cpp calls `cb_eval(tensor, ask=True)` for each node of the compute graph; a callback that answers
True splits the graph there and is called again (`ask=False`) once the node is computed, with its data
in host memory on the CPU backend. Reading a node's inputs is how llama-imatrix collects activations;
adding to a node's output changes everything computed after it, which is how a budget's probes
inject a tensor's rounding error (quant.budget.probe) without writing a model file.

Also here: contexts that decode several sequences in one batch (`Decoder`), with or without a callback.
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

from llmkit.errors import BadInput
from llmkit.llama import runtime


class GgmlTensor(ctypes.Structure):
    """ggml.h's struct ggml_tensor (the fields the eval callback reads)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]

    def weight_name(self) -> str:
        """The tensor's name up to the first space (llama.cpp appends " (view)" and the like)."""
        return self.name.decode("utf-8", "replace").split(" ")[0]


def op_ids(*names: bytes) -> tuple[int, ...]:
    """ggml's operation numbers for these names (they change between ggml versions)."""
    llama_cpp = runtime.load_llama_cpp()
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    for cand in sorted(glob.glob(os.path.join(libdir, "libggml-base*"))) + sorted(glob.glob(os.path.join(libdir, "libggml*"))):
        try:
            lib = ctypes.CDLL(cand)
            fn = lib.ggml_op_name
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_int]
        found: dict[bytes, int] = {}
        for i in range(200):  # stop at the last name wanted: past GGML_OP_COUNT the table is not ours to read
            found.setdefault(fn(i), i)
            if all(n in found for n in names):
                return tuple(found[n] for n in names)
        break
    raise BadInput(f"cannot find ggml's {', '.join(n.decode() for n in names)} operations in llama-cpp-python's libraries.")


def strided(addr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype) -> np.ndarray:
    """A numpy view of ggml tensor memory (host buffer) with ggml's byte strides (writable)."""
    span = sum((n - 1) * st for n, st in zip(shape, strides)) + np.dtype(dtype).itemsize
    buf = (ctypes.c_char * span).from_address(addr)
    return np.ndarray(shape, dtype=dtype, buffer=buf, strides=strides)


def rows_of(t: GgmlTensor) -> np.ndarray:
    """A float32 node's data as (tokens, ne0) rows (a writable view; ne0 contiguous)."""
    return strided(t.data, (t.ne[1] * t.ne[2] * t.ne[3], t.ne[0]), (t.nb[1], 4), np.float32)


class Decoder:
    """A llama.cpp context on an open model that evaluates up to `n_seq` sequences of together at most
    `n_ctx` tokens in one batch, with an optional eval callback (`callback(tensor_ptr, ask) -> bool`)."""

    def __init__(self, llm, n_ctx: int, n_seq: int, threads: int | None = None, callback=None):
        self.llama_cpp = runtime.load_llama_cpp()
        self.llm, self.n_ctx, self.n_seq = llm, n_ctx, n_seq
        self.n_vocab = llm.n_vocab()
        lc = self.llama_cpp
        self._error: BaseException | None = None

        def guarded(t, ask, _user):  # ctypes would print an exception and carry on: keep it for decode()
            if self._error is not None:
                return False
            try:
                return bool(callback(t, ask))
            except BaseException as e:  # noqa: BLE001 - re-raised by decode()
                self._error = e
                return False

        # the ctypes callback object must live as long as the context
        self._cb = lc.ggml_backend_sched_eval_callback(guarded) if callback else None
        cp = lc.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = threads or runtime.default_threads()
        if self._cb is not None:
            cp.cb_eval, cp.cb_eval_user_data = self._cb, None
        self.ctx = lc.llama_init_from_model(llm.model, cp)
        if not self.ctx:
            raise BadInput("llama.cpp could not create a context for this model.")

    def decode(self, items: list[tuple[int, int, int, bool]], fetch: bool = True) -> np.ndarray | None:
        """Evaluate (token, position, sequence, wants_logits) items in one batch; returns the float32
        logits of the items that want them, in order (None if none does, or without `fetch`). An
        exception raised inside the eval callback is raised here."""
        lc = self.llama_cpp
        b = lc.llama_batch_init(len(items), 0, 1)
        try:
            for i, (tok, pos, seq, want) in enumerate(items):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, want
                b.seq_id[i][0] = seq
            b.n_tokens = len(items)
            rc = lc.llama_decode(self.ctx, b)
        finally:
            lc.llama_batch_free(b)
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        if rc != 0:
            raise BadInput("llama.cpp failed to evaluate a batch of tokens.")
        n = sum(1 for it in items if it[3])
        if not n or not fetch:
            return None
        return np.ctypeslib.as_array(lc.llama_get_logits(self.ctx), shape=(n, self.n_vocab)).copy()

    def evaluate(self, seqs: list[list[int]]) -> np.ndarray:
        """Logits of every position of these sequences (evaluated side by side from an empty cache):
        (sum of lengths, n_vocab) float32, sequences one after another."""
        self.clear()
        return self.decode([(tok, j, s, True) for s, seq in enumerate(seqs) for j, tok in enumerate(seq)])

    def clear(self) -> None:
        self.llama_cpp.llama_memory_clear(self.llama_cpp.llama_get_memory(self.ctx), True)

    def close(self) -> None:
        if self.ctx:
            self.llama_cpp.llama_free(self.ctx)
            self.ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
