"""GPTQ (Frantar et al. 2022): error-compensating rounding into llama.cpp's block formats.

Round-to-nearest quantizes every weight on its own. GPTQ quantizes a matrix column by column (a
column = one input feature) and pushes each column's rounding error onto the columns not yet
quantized, weighted by the inverse Hessian of the layer's squared output error, H = X^T X over
calibration activations X. The output error ||(W - Q) X^T|| is what it minimises, not the weight error.

Into llama.cpp's formats: columns are taken one format block at a time (32 weights for Q4_0, a
256-weight super-block for the K-quants). When a block is reached its scales and mins are fitted to
the *current*, error-updated weights by the format's own scale search (weighted by diag(H), the
imatrix of this very text; `refit=False` fits them once on the original weights instead), the
block's grid of representable values per weight is read off those scales, and the GPTQ loop
rounds each column to its grid. The levels are then packed into standard blocks, so llama.cpp
reads the file like any other; the bytes differ from llama.cpp's by design.

Steps per matrix (the reference algorithm): dead columns (diag 0) zeroed; H shrunk toward its
diagonal (`shrink`, below) and dampened by `damp` x mean(diag H) (raised x10 until H is positive
definite, and reported); U = the upper
Cholesky factor of H^-1; for column c: q = nearest grid value of w_c, err = (w_c - q) / U[c, c],
w_{c+1..} -= err * U[c, c+1..] inside the block (column by column within SUB_BLOCK columns, a matrix
product for the rest of the block: the same sums, grouped), then one matrix product for the columns
after it.

Shrinkage: H + shrink x diag(H). GPTQ moves each column's rounding error into the directions the
calibration activations barely use, which a few thousand tokens of one kind of text estimate worst;
shrinking the off-diagonal part toward the diagonal (whose part, the imatrix, transfers between
texts) keeps a gain on unseen text. Measurements: docs/design/quant-gptq.md.
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

import numpy as np

from llmkit.errors import BadInput
from llmkit.gguf.reader import TensorInfo, read_gguf
from llmkit.gguf.types import tensor_bytes
from llmkit.quant.calibration.hessians import hessian_index, rounding_bytes
from llmkit.quant.formats import get_format, load_f32
from llmkit.quant.formats.numerics import F32

SUPPORTED = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0")
SHRINK = 3.0  # H + SHRINK x diag(H): see the module's docstring
NO_TARGETS = ("no matrix of this model has both a GPTQ type (Q2_K..Q6_K, Q4_0) and a Hessian; check the type and "
              "that the Hessians come from this model.")
SUB_BLOCK = 32  # columns updated one by one before a matrix product carries their error to the rest of a block


# -- levels in and out of the block layouts ---------------------------------------------------------

def levels_of(name: str, b: np.ndarray) -> np.ndarray:
    """The unsigned level of every weight of (nb, type_size) blocks: (nb, block) int32."""
    return np.asarray(_gptq_format(name).unpack_levels(b), np.int32)


def set_levels(name: str, b: np.ndarray, L: np.ndarray) -> np.ndarray:
    """Blocks `b` with their level bits replaced by L (nb, block); scales and mins kept."""
    fmt = _gptq_format(name)
    out = np.array(b, dtype=np.uint8, copy=True)
    fmt.pack_levels(out, np.asarray(L, np.int64).astype(np.uint8))
    return out


def _gptq_format(name: str):
    if name not in SUPPORTED:
        raise BadInput(f"GPTQ writes {', '.join(SUPPORTED)}, not {name}.")
    return get_format(name)


MAX_LEVEL = {"Q4_0": 15, "Q4_K": 15, "Q5_K": 31, "Q6_K": 63, "Q3_K": 7, "Q2_K": 3}


def grid(name: str, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a, b0) per weight of the blocks: level l decodes to a * l + b0 (read off by decoding the
    blocks with every level 0 and every level 1, so it is the format's own fp16/float32 arithmetic)."""
    fmt = get_format(name)
    nb = len(b)
    v0 = fmt.dequantize_blocks(set_levels(name, b, np.zeros((nb, fmt.block), np.int64))).reshape(nb, fmt.block)
    v1 = fmt.dequantize_blocks(set_levels(name, b, np.ones((nb, fmt.block), np.int64))).reshape(nb, fmt.block)
    return (v1 - v0).astype(F32), v0.astype(F32)


# -- the algorithm ------------------------------------------------------------------------------------

def inverse_hessian_factor(H: np.ndarray, damp: float = 0.01,
                           shrink: float = 0.0) -> tuple[np.ndarray, float, np.ndarray]:
    """(U = upper Cholesky factor of (H + shrink diag(H) + lambda I)^-1, the dampening used, dead columns).

    Without forming H^-1: with J the reversal permutation and J H J = L L^T (lower Cholesky),
    H^-1 = (J L^-T J)(J L^-1 J), and J L^-1 J is upper triangular with a positive diagonal, so it is U.
    One Cholesky and one triangular inverse (~2n^3/3 flops) instead of Cholesky, a general inverse, a
    product and a second Cholesky (~4.7n^3). At most two float64 H-sized matrices live at once; a
    retry converts H (float32, often memory-mapped) again."""
    diag = np.diag(H).astype(np.float64)
    dead = diag <= 0
    diag[dead] = 1.0
    mean = float(np.mean(diag))
    lam = damp
    for _ in range(8):
        try:
            Hd = np.array(np.asarray(H)[::-1, ::-1], dtype=np.float64, copy=True)  # J H J
            rdead = dead[::-1]
            Hd[rdead, rdead] = 1.0
            Hd.flat[::len(Hd) + 1] += lam * mean + shrink * diag[::-1]  # without an identity matrix
            L = np.linalg.cholesky(Hd)
            del Hd
            U = _lower_inverse(L)[::-1, ::-1]  # J L^-1 J
            return np.ascontiguousarray(U), lam, dead
        except np.linalg.LinAlgError:
            Hd = L = None
            lam *= 10
    raise BadInput("the Hessian is not positive definite even with strong dampening; give more calibration text.")


def _lower_inverse(L: np.ndarray) -> np.ndarray:
    """L^-1 of a lower-triangular float64 matrix: LAPACK's triangular inverse (dtrtri, n^3/3 flops)
    through scipy where installed, else a general solve (numpy has no triangular inverse)."""
    try:
        from scipy.linalg.lapack import dtrtri
    except ImportError:
        return np.linalg.inv(L)
    inv, info = dtrtri(L, lower=1, overwrite_c=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"triangular inverse failed (info {info})")
    return inv


def quantize_matrix(W: np.ndarray, H: np.ndarray, name: str, damp: float = 0.01, refit: bool = True,
                    importance: np.ndarray | None = None, shrink: float = SHRINK) -> tuple[np.ndarray, float]:
    """GPTQ of one matrix (rows = outputs, columns = the H dimension) into format `name`:
    (uint8 (rows, row_bytes), dampening used)."""
    fmt = _gptq_format(name)
    rows, cols = W.shape
    if H.shape != (cols, cols):
        raise BadInput(f"the Hessian is {H.shape[0]}x{H.shape[1]}, the matrix has {cols} columns.")
    if cols % fmt.block:
        raise BadInput(f"{name} needs rows of a multiple of {fmt.block} weights, got {cols}.")
    U, lam, dead = inverse_hessian_factor(H, damp, shrink)
    W = np.array(W, dtype=np.float64, copy=True)
    W[:, dead] = 0.0
    imp = np.maximum(np.diag(H), 0).astype(F32) if importance is None else np.asarray(importance, F32)
    g = fmt.block
    bpb = fmt.type_size
    out = np.empty((rows, cols // g, bpb), np.uint8)
    fixed = None if refit else fmt.quantize(W.astype(F32), imp).reshape(rows, cols // g, bpb)
    maxl = MAX_LEVEL[name]
    sub = min(g, SUB_BLOCK)
    for j, c0 in enumerate(range(0, cols, g)):
        c1 = c0 + g
        blk = fmt.quantize(W[:, c0:c1].astype(F32), imp[c0:c1]).reshape(rows, bpb) if refit else fixed[:, j]
        a, b0 = grid(name, blk)
        # the block's columns as contiguous rows: a column of the row-major W is strided
        Wt, at, bt = W[:, c0:c1].T.copy(), a.T.astype(np.float64), b0.T.astype(np.float64)
        Lt = np.empty((g, rows), np.int64)
        Et = np.empty((g, rows))
        Ub = U[c0:c1, c0:c1]
        for s0 in range(0, g, sub):  # rank-1 updates inside `sub` columns, one product for the rest
            s1 = s0 + sub
            for i in range(s0, s1):
                w, ai = Wt[i], at[i]
                with np.errstate(divide="ignore", invalid="ignore"):
                    lv = np.where(ai != 0, np.rint((w - bt[i]) / ai), 0)
                lv = np.clip(lv, 0, maxl)
                err = (w - (ai * lv + bt[i])) / Ub[i, i]
                Wt[i + 1:s1] -= np.outer(Ub[i, i + 1:s1], err)
                Lt[i], Et[i] = lv, err
            if s1 < g:
                Wt[s1:] -= Ub[s0:s1, s1:].T @ Et[s0:s1]
        if c1 < cols:
            W[:, c1:] -= Et.T @ U[c0:c1, c1:]
        out[:, j] = set_levels(name, blk, Lt.T)
    return out.reshape(rows, -1), lam


def output_error(W: np.ndarray, Q: np.ndarray, H: np.ndarray, row_weights: np.ndarray | None = None) -> float:
    """tr((W - Q) H (W - Q)^T): the summed squared output error over the calibration activations
    (each row's term times its weight, when given)."""
    D = (np.asarray(W, np.float64) - np.asarray(Q, np.float64))
    per_row = ((D @ np.asarray(H, np.float64)) * D).sum(axis=1)  # a BLAS product, not einsum's loop
    return float(per_row.sum() if row_weights is None else per_row @ row_weights)


# -- whole models ----------------------------------------------------------------------------------------

def _matrix_job(src: str, data_offset: int, t: TensorInfo, new: str, hpath: str, h_offset: int, dim: int,
                damp: float, refit: bool, importance, shrink: float):
    """Worker: read one matrix and its H from disk (memory-mapped), run GPTQ."""
    with open(src, "rb") as f:
        W = load_f32(f, t, data_offset)
    H = np.memmap(hpath, dtype="<f4", mode="r", offset=h_offset, shape=(dim, dim))
    q, lam = quantize_matrix(W, np.asarray(H), new, damp, refit, importance, shrink)
    return t.name, q, lam


def gptq_replacements(src: str, types: dict[str, str], hessian_path: str, imatrix: dict | None = None,
                      damp: float = 0.01, refit: bool = True, threads=None, progress=None,
                      memory: int | None = None, shrink: float = SHRINK, required: bool = True) -> tuple[dict, dict]:
    """GPTQ bytes for every 2-D matrix whose type GPTQ writes and whose H is known:
    ({name: uint8 bytes}, {name: dampening used when it had to be raised}). Up to `threads` matrices
    are rounded at once in worker processes, as many as fit `memory` bytes together (each job's need:
    calibration.hessians.rounding_bytes; one job always runs). With `required`, a file none of whose
    matrices GPTQ can round is an error."""
    g = read_gguf(src)
    hidx = hessian_index(hessian_path)
    jobs, cost = [], []
    for t in _gptq_targets(g, types):
        if t.name not in hidx:
            continue
        new = types[t.name]
        off, dim = hidx[t.name]
        if dim != t.shape[0]:
            raise BadInput(f"the Hessian file's H for '{t.name}' is {dim}x{dim}, the tensor has rows of {t.shape[0]}: "
                           "it belongs to another model.")
        imp = None if imatrix is None or t.name not in imatrix else np.asarray(imatrix[t.name], np.float32)
        jobs.append((src, g.data_offset, t, new, hessian_path, off, dim, damp, refit, imp, shrink))
        cost.append(rounding_bytes(dim, int(t.shape[1])))
    if not jobs and required:
        raise BadInput(NO_TARGETS)
    out, raised = {}, {}
    if not jobs:
        return out, raised
    slots = max(1, threads or os.cpu_count() or 1)
    with ProcessPoolExecutor(min(slots, len(jobs))) as pool:
        running: dict = {}
        nxt = 0
        while nxt < len(jobs) or running:
            # in order, while the next job fits beside the running ones (a big one waits, then runs alone)
            while nxt < len(jobs) and len(running) < slots and (
                    not running or memory is None or sum(running.values()) + cost[nxt] <= memory):
                running[pool.submit(_matrix_job_star, jobs[nxt])] = cost[nxt]
                nxt += 1
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                del running[f]
                name, q, lam = f.result()
                out[name] = q
                if lam > damp:
                    raised[name] = lam
                if progress:
                    progress(len(out), len(jobs), name)
    return out, raised


def _gptq_targets(g, types: dict[str, str]) -> list[TensorInfo]:
    """The matrices of GGUF file `g` that GPTQ rounds under `types`: 2-D blk.* matrices (the ones that
    have Hessians) in a type it writes."""
    return [t for t in g.tensors
            if types.get(t.name) in SUPPORTED and len(t.shape) == 2 and t.name.startswith("blk.")]


def gptq_bytes(src: str, types: dict[str, str]) -> int:
    """Bytes of the matrices GPTQ rounds, in their new types (what gptq_by_groups spills to disk)."""
    return sum(tensor_bytes(types[t.name], t.shape) for t in _gptq_targets(read_gguf(src), types))


def gptq_by_groups(src: str, types: dict[str, str], hessian_files, spill_path: str, imatrix: dict | None = None,
                   damp: float = 0.01, refit: bool = True, threads=None, progress=None, memory: int | None = None,
                   shrink: float = SHRINK) -> tuple[dict, dict]:
    """gptq_replacements over Hessian files that each hold a group of layers (an iterator, e.g.
    calibration.hessians.stream_hessians), each file deleted once its matrices are rounded. The bytes are
    appended to `spill_path` and handed back memory-mapped from it, so neither the disk nor memory holds
    more than one group's Hessians and the rounded bytes cost no memory while later groups are collected."""
    total = len(_gptq_targets(read_gguf(src), types))
    where, raised, done = {}, {}, 0
    with open(spill_path, "wb") as spill:
        for path in hessian_files:
            step = None if progress is None else (lambda i, n, name, base=done: progress(min(base + i, total), total, name))
            out, more = gptq_replacements(src, types, path, imatrix, damp, refit, threads, step, memory, shrink,
                                          required=False)
            os.unlink(path)
            for name, q in out.items():
                where[name] = (spill.tell(), q.shape)
                spill.write(memoryview(np.ascontiguousarray(q)).cast("B"))
            raised.update(more)
            done += len(out)
    if not where:
        raise BadInput(NO_TARGETS)
    return {name: np.memmap(spill_path, np.uint8, "r", offset=off, shape=shape)
            for name, (off, shape) in where.items()}, raised


def _matrix_job_star(args):
    return _matrix_job(*args)
