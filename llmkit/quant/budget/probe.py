"""How much the model's output cares about each kind of tensor (step 2 of allocate.py).

One evaluation per kind (attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down, output,
token_embd, ...) of a few token sequences — cut from calibration text, or written by the model itself
(calibration/selfgen.py) — compared with the evaluation of the unchanged model. The change is made
inside llama.cpp while it runs: at every matrix multiplication by a tensor of the probed kind, the
eval callback adds dW @ x to the product, dW being the tensor's 4-bit rounding error (Q4_0's rule:
absmax per 32 weights), so the logits are those of the model with that kind rounded and nothing else
(tested against a model file holding the rounded weights). No model file is written. The kind's
sensitivity is the mean KL divergence, unchanged -> probed, over every position but each sequence's
first few, per unit of the kind's added activation-weighted error sum_ij w_j dW_ij^2 (w = the
imatrix's column weights, 1 without one): the measure the candidates' errors are in (measure.py), so
sensitivity x error predicts a KLD.

Probes are cached by model file, imatrix and tokens' origin, so trying several budgets probes once.
Their cost and stability: docs/design/quant-budget.md.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import numpy as np

from llmkit.errors import BadInput
from llmkit.config import cache_dir
from llmkit.io import atomic_write_text
from llmkit.quant.budget.measure import Item

PROBE_SEQS, PROBE_TOKENS = 4, 32  # sequences x tokens per probe evaluation (defaults)
SKIP = 4  # the first positions of each sequence (little context) are not scored
ROWS_PER_STEP = 1 << 22  # weights per slab of rows when computing a tensor's error
EMBED_ROWS = 4096  # a table read only by its rows (token_embd): its error from this many evenly spaced rows


def round_error(w: np.ndarray) -> np.ndarray:
    """Rows (n_rows, n) rounded to 4 bits per weight as Q4_0 rounds them (blocks of 32, scale = the
    signed absmax / -8, levels 0..15) minus the rows: the error a probe adds.

    >>> round_error(np.array([[-8.0, 1.3] + [0.0] * 30], np.float32))[0, :2].tolist()
    [0.0, -0.2999999523162842]
    """
    n = w.shape[1]
    pad = -n % 32
    x = np.pad(w, ((0, 0), (0, pad))) if pad else np.asarray(w, np.float32)
    b = x.reshape(len(x), -1, 32)
    amax = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)
    d = amax / np.float32(-8)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d != 0, np.clip(np.floor(b / d + np.float32(8.5)), 0, 15), 8)
    return ((q - 8) * d - b).reshape(len(x), -1)[:, :n].astype(np.float32)


class _Injector:
    """The eval callback: adds the probed tensors' rounding error to their products, and records
    each tensor's activation-weighted error the first time it is computed."""

    def __init__(self, src: str, imatrix: dict | None):
        from llmkit.gguf.reader import read_gguf
        from llmkit.llama.evalcb import op_ids

        self.g = read_gguf(src)
        self.by = {t.name: t for t in self.g.tensors}
        self.f = open(src, "rb")
        self.imatrix = imatrix or {}
        self.mul_mat, self.get_rows = op_ids(b"MUL_MAT", b"GET_ROWS")
        self.active: frozenset = frozenset()
        self.error: dict[str, float] = {}

    def close(self) -> None:
        self.f.close()

    def _rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        from llmkit.gguf.tensors import read_rows
        from llmkit.quant.formats import to_f32

        t = self.by[name]
        return np.ascontiguousarray(to_f32(*read_rows(self.f, t, self.g.data_offset, rows))).reshape(len(rows), t.shape[0])

    def _weights(self, name: str, ne0: int):
        w = self.imatrix.get(name)
        return np.asarray(w, np.float64) if w is not None and len(w) == ne0 else 1.0

    def __call__(self, t_ptr: int, ask: bool) -> bool:
        from llmkit.llama.evalcb import GgmlTensor, rows_of, strided

        if not self.active:
            return False
        t = GgmlTensor.from_address(t_ptr)
        if t.op not in (self.mul_mat, self.get_rows) or not t.src[0] or not t.src[1]:
            return False
        name = GgmlTensor.from_address(t.src[0]).weight_name()
        if name not in self.active or t.type != 0:
            return False
        if ask:
            return True
        src1 = GgmlTensor.from_address(t.src[1])
        y = rows_of(t)
        info = self.by[name]
        ne0, n_rows = int(info.shape[0]), int(np.prod(info.shape[1:], dtype=np.int64))
        if t.op == self.get_rows:  # an embedding table: the rows of the tokens looked up
            ids = strided(src1.data, (y.shape[0],), (src1.nb[0],), np.int32).astype(np.int64)
            y += round_error(self._rows(name, ids))
            if name not in self.error:
                rows = np.unique(np.linspace(0, n_rows - 1, min(n_rows, EMBED_ROWS)).round().astype(np.int64))
                d = round_error(self._rows(name, rows)).astype(np.float64)
                self.error[name] = float((d * d * self._weights(name, ne0)).sum()) * n_rows / len(rows)
            return True
        if src1.type != 0 or src1.nb[0] != 4 or y.shape[1] != n_rows:
            return True  # not a plain float32 product by the whole matrix: left as it is
        x = np.ascontiguousarray(rows_of(src1))
        w = self._weights(name, ne0)
        step, err = max(1, ROWS_PER_STEP // ne0), 0.0
        for r0 in range(0, n_rows, step):
            d = round_error(self._rows(name, np.arange(r0, min(n_rows, r0 + step))))
            y[:, r0:r0 + len(d)] += x @ d.T
            if name not in self.error:
                d64 = d.astype(np.float64)
                err += float((d64 * d64 * w).sum())
        self.error.setdefault(name, err)
        return True


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def kl_per_position(ref_lp: np.ndarray, lp: np.ndarray) -> np.ndarray:
    """KL(ref || other) of each row of log-probabilities."""
    return (np.exp(ref_lp) * (ref_lp - lp)).sum(axis=1, dtype=np.float64)


def probe_sensitivity(src: str, items: list[Item], imatrix: dict | None = None, text: str | None = None,
                      n_seq: int = PROBE_SEQS, n_tokens: int = PROBE_TOKENS, seed: int = 0, threads: int | None = None,
                      progress: Callable[[int, int, str], None] | None = None) -> dict[str, float]:
    """KLD per unit of added error for each kind of tensor, on `text` (or on text the model writes itself)."""
    from llmkit.llama import runtime
    from llmkit.llama.evalcb import Decoder
    from llmkit.quant.calibration.selfgen import sample_sequences, text_sequences

    if n_seq < 1 or n_tokens <= SKIP + 1:
        raise BadInput(f"probes need at least one sequence of more than {SKIP + 1} tokens (got {n_seq} x {n_tokens}).")
    members: dict[str, set] = {}
    for i in items:
        if i.fixed is None and len(i.shape) == 2:  # 3-D expert tensors run through MUL_MAT_ID: not probed
            members.setdefault(i.kind, set()).add(i.name)
    kinds = sorted(members)
    llm = runtime.open_model(src, runtime.ModelOptions(n_ctx=n_seq * n_tokens, n_batch=n_seq * n_tokens,
                                                       n_threads=threads))
    inject = _Injector(src, imatrix)
    out: dict[str, float] = {}
    try:
        if progress:
            progress(0, len(kinds) + 1, "probe text")
        seqs = (text_sequences(llm, text, n_seq, n_tokens) if text is not None
                else sample_sequences(llm, n_seq, n_tokens, seed, threads))
        scored = np.array([j >= SKIP for s in seqs for j in range(len(s))])
        with Decoder(llm, n_seq * n_tokens, len(seqs), threads, callback=inject) as dec:
            ref = log_softmax(dec.evaluate(seqs))
            for n, kind in enumerate(kinds):
                if progress:
                    progress(n + 1, len(kinds) + 1, f"probe {kind}")
                inject.active = frozenset(members[kind])
                try:
                    lp = log_softmax(dec.evaluate(seqs))
                finally:
                    inject.active = frozenset()
                added = sum(inject.error.get(name, 0.0) for name in members[kind])
                kld = float(kl_per_position(ref, lp)[scored].mean())
                out[kind] = max(kld, 0.0) / added if added > 0 else 0.0
    finally:
        inject.close()
        llm.close()
    # kinds that could not be probed (expert tensors, types the callback cannot change) take the median
    known = [v for v in out.values() if v > 0]
    fill = float(np.median(known)) if known else 1.0
    for i in items:
        if i.fixed is None and out.get(i.kind, 0.0) <= 0:
            out[i.kind] = fill
    return out


PROBE_VERSION = 2


def probe_key(src, imatrix, text, n_seq, n_tokens, seed=0) -> str:
    """Identity of a sensitivity probe: the model file (path, size, mtime), the imatrix's contents,
    the calibration text (or the seed of the model's own text) and the sequences' shape."""
    import hashlib

    h = hashlib.sha256()
    st = os.stat(src)
    h.update(f"{PROBE_VERSION}|{os.path.abspath(src)}|{st.st_size}|{st.st_mtime_ns}|{n_seq}|{n_tokens}|".encode())
    h.update(b"text|" + text.encode("utf-8") if text is not None else f"self|{seed}".encode())
    for name in sorted(imatrix or {}):
        h.update(name.encode())
        h.update(np.ascontiguousarray(imatrix[name], np.float32).tobytes())
    return h.hexdigest()[:32]


def _probe_cache(key: str) -> str:
    return str(cache_dir("quant-probes", key + ".json"))


def cached_probe(key: str) -> dict | None:
    try:
        with open(_probe_cache(key), encoding="utf-8") as f:
            d = json.load(f)
        return {str(k): float(v) for k, v in d.items()}
    except (OSError, ValueError, AttributeError):
        return None


def store_probe(key: str, sens: dict) -> None:
    try:
        os.makedirs(os.path.dirname(_probe_cache(key)), exist_ok=True)
        atomic_write_text(_probe_cache(key), json.dumps(sens))
    except OSError:
        pass  # a cache that cannot be written only costs time
