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

Steps per matrix (the reference algorithm): dead columns (diag 0) zeroed; H dampened by
`damp` x mean(diag H) (raised x10 until H is positive definite, and reported); U = the upper
Cholesky factor of H^-1; for column c: q = nearest grid value of w_c, err = (w_c - q) / U[c, c],
w_{c+1..} -= err * U[c, c+1..] inside the block, then one matrix product for the columns after it.
"""

from __future__ import annotations

import os

import numpy as np

from llmkit.errors import BadInput
from llmkit.quant.base import F32, get_format

SUPPORTED = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0")


# -- levels in and out of the block layouts ---------------------------------------------------------

def levels_of(name: str, b: np.ndarray) -> np.ndarray:
    """The unsigned level of every weight of (nb, type_size) blocks: (nb, block) int32."""
    nb = len(b)
    if name == "Q4_0":
        qs = b[:, 2:]
        return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)
    if name == "Q4_K":
        qs = b[:, 16:].reshape(nb, 4, 32)
        return np.stack([qs & 0xF, qs >> 4], axis=2).reshape(nb, 256).astype(np.int32)
    if name == "Q5_K":
        qh, qs = b[:, 16:48], b[:, 48:].reshape(nb, 4, 32)
        k = np.arange(4)[None, :, None]
        lo = (qs & 0xF) | (((qh[:, None, :] >> (2 * k)) & 1) << 4)
        hi = (qs >> 4) | (((qh[:, None, :] >> (2 * k + 1)) & 1) << 4)
        return np.stack([lo, hi], axis=2).reshape(nb, 256).astype(np.int32)
    if name == "Q6_K":
        ql, qh = b[:, 0:128].reshape(nb, 2, 64), b[:, 128:192].reshape(nb, 2, 32)
        q = np.empty((nb, 2, 4, 32), np.int32)
        q[:, :, 0] = (ql[:, :, :32] & 0xF) | (((qh >> 0) & 3) << 4)
        q[:, :, 1] = (ql[:, :, 32:] & 0xF) | (((qh >> 2) & 3) << 4)
        q[:, :, 2] = (ql[:, :, :32] >> 4) | (((qh >> 4) & 3) << 4)
        q[:, :, 3] = (ql[:, :, 32:] >> 4) | (((qh >> 6) & 3) << 4)
        return q.reshape(nb, 256)
    if name == "Q3_K":
        from llmkit.quant.q3_k import unpack_2bit

        low = unpack_2bit(b[:, 32:96]).astype(np.int32)
        high = ((b[:, None, 0:32] >> np.arange(8)[None, :, None]) & 1).reshape(nb, 256).astype(np.int32)
        return low | (high << 2)
    if name == "Q2_K":
        from llmkit.quant.q3_k import unpack_2bit

        return unpack_2bit(b[:, 16:80]).astype(np.int32)
    raise BadInput(f"GPTQ writes {', '.join(SUPPORTED)}, not {name}.")


def set_levels(name: str, b: np.ndarray, L: np.ndarray) -> np.ndarray:
    """Blocks `b` with their level bits replaced by L (nb, block); scales and mins kept."""
    out = np.array(b, dtype=np.uint8, copy=True)
    nb = len(b)
    L = np.asarray(L, np.int64).astype(np.uint8)
    if name == "Q4_0":
        out[:, 2:] = L[:, :16] | (L[:, 16:] << 4)
    elif name == "Q4_K":
        q = L.reshape(nb, 4, 2, 32)
        out[:, 16:] = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(nb, 128)
    elif name == "Q5_K":
        q = L.reshape(nb, 4, 2, 32)
        out[:, 48:] = ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(nb, 128)
        qh = np.zeros((nb, 32), np.uint8)
        for g in range(4):
            qh |= ((q[:, g, 0] >> 4) & 1) << (2 * g)
            qh |= ((q[:, g, 1] >> 4) & 1) << (2 * g + 1)
        out[:, 16:48] = qh
    elif name == "Q6_K":
        q = L.reshape(nb, 2, 4, 32)
        ql = np.empty((nb, 2, 64), np.uint8)
        ql[:, :, :32] = (q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4)
        ql[:, :, 32:] = (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)
        qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
        out[:, 0:128] = ql.reshape(nb, 128)
        out[:, 128:192] = qh.reshape(nb, 64)
    elif name == "Q3_K":
        from llmkit.quant.q3_k import pack_2bit

        out[:, 32:96] = pack_2bit(L & 3)
        high = (L >> 2).reshape(nb, 8, 32)
        out[:, 0:32] = (high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1).astype(np.uint8)
    elif name == "Q2_K":
        from llmkit.quant.q3_k import pack_2bit

        out[:, 16:80] = pack_2bit(L)
    else:
        raise BadInput(f"GPTQ writes {', '.join(SUPPORTED)}, not {name}.")
    return out


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

def inverse_hessian_factor(H: np.ndarray, damp: float = 0.01) -> tuple[np.ndarray, float, np.ndarray]:
    """(U = upper Cholesky factor of (H + lambda I)^-1, the dampening used, dead columns)."""
    H = np.array(H, dtype=np.float64, copy=True)
    dead = np.diag(H) <= 0
    H[dead, dead] = 1.0
    mean = float(np.mean(np.diag(H)))
    lam = damp
    for _ in range(8):
        try:
            Hd = H + lam * mean * np.eye(len(H))
            Lc = np.linalg.cholesky(Hd)
            inv = np.linalg.inv(Lc)
            Hinv = inv.T @ inv
            U = np.linalg.cholesky(Hinv).T
            return U, lam, dead
        except np.linalg.LinAlgError:
            lam *= 10
    raise BadInput("the Hessian is not positive definite even with strong dampening; give more calibration text.")


def quantize_matrix(W: np.ndarray, H: np.ndarray, name: str, damp: float = 0.01, refit: bool = True,
                    importance: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """GPTQ of one matrix (rows = outputs, columns = the H dimension) into format `name`:
    (uint8 (rows, row_bytes), dampening used)."""
    if name not in SUPPORTED:
        raise BadInput(f"GPTQ writes {', '.join(SUPPORTED)}, not {name}.")
    fmt = get_format(name)
    rows, cols = W.shape
    if H.shape != (cols, cols):
        raise BadInput(f"the Hessian is {H.shape[0]}x{H.shape[1]}, the matrix has {cols} columns.")
    if cols % fmt.block:
        raise BadInput(f"{name} needs rows of a multiple of {fmt.block} weights, got {cols}.")
    U, lam, dead = inverse_hessian_factor(H, damp)
    W = np.array(W, dtype=np.float64, copy=True)
    W[:, dead] = 0.0
    imp = np.maximum(np.diag(H), 0).astype(F32) if importance is None else np.asarray(importance, F32)
    g = fmt.block
    bpb = fmt.type_size
    out = np.empty((rows, cols // g, bpb), np.uint8)
    fixed = None if refit else fmt.quantize(W.astype(F32), imp).reshape(rows, cols // g, bpb)
    for j, c0 in enumerate(range(0, cols, g)):
        c1 = c0 + g
        blk = fmt.quantize(W[:, c0:c1].astype(F32), imp[c0:c1]).reshape(rows, bpb) if refit else fixed[:, j]
        a, b0 = grid(name, blk)
        a64, b64 = a.astype(np.float64), b0.astype(np.float64)
        maxl = MAX_LEVEL[name]
        L = np.empty((rows, g), np.int64)
        E = np.empty((rows, g))
        Ub = U[c0:c1, c0:c1]
        for i in range(g):
            w = W[:, c0 + i]
            with np.errstate(divide="ignore", invalid="ignore"):
                lv = np.where(a64[:, i] != 0, np.rint((w - b64[:, i]) / a64[:, i]), 0)
            lv = np.clip(lv, 0, maxl)
            q = a64[:, i] * lv + b64[:, i]
            err = (w - q) / Ub[i, i]
            W[:, c0 + i + 1:c1] -= np.outer(err, Ub[i, i + 1:])
            L[:, i], E[:, i] = lv, err
        if c1 < cols:
            W[:, c1:] -= E @ U[c0:c1, c1:]
        out[:, j] = set_levels(name, blk, L)
    return out.reshape(rows, -1), lam


def output_error(W: np.ndarray, Q: np.ndarray, H: np.ndarray) -> float:
    """tr((W - Q) H (W - Q)^T): the summed squared output error over the calibration activations."""
    D = (np.asarray(W, np.float64) - np.asarray(Q, np.float64))
    return float(np.einsum("ij,jk,ik->", D, np.asarray(H, np.float64), D))


# -- whole models ----------------------------------------------------------------------------------------

HESSIAN_FORMAT = "llmkit-hessians"


def save_hessians(path: str, sums: dict, counts: dict, chunks: int, n_ctx: int, model: str) -> None:
    """Write the collected H matrices (mean over tokens) as a GGUF file: one `NAME.hessian` tensor per
    distinct input, the matrices sharing it listed in `llmkit.hessian.aliases`."""
    import json

    from llmkit.gguf.writer import write_gguf

    first_of: dict[int, str] = {}
    aliases, tensors = {}, []
    for name in sorted(sums):
        h = sums[name]
        key = first_of.setdefault(id(h), name)
        if key == name:
            n = max(int(np.asarray(counts[name]).sum()), 1)
            tensors.append((f"{name}.hessian", np.asarray(h, np.float32) / np.float32(n)))
        aliases[name] = key
    kvs = [("general.type", "str", HESSIAN_FORMAT), ("llmkit.hessian.model", "str", os.path.basename(model)),
           ("llmkit.hessian.aliases", "str", json.dumps(aliases)), ("llmkit.hessian.chunks", "u32", chunks),
           ("llmkit.hessian.chunk_size", "u32", n_ctx)]
    write_gguf(path, kvs, tensors)


def hessian_index(path: str) -> dict[str, tuple[int, int]]:
    """{matrix name: (byte offset of its H in the file, dimension)} of a Hessian file (checked)."""
    import json

    from llmkit.errors import BadFileFormat
    from llmkit.gguf.reader import read_gguf

    g = read_gguf(path)
    if g.get("general.type") != HESSIAN_FORMAT:
        raise BadFileFormat(f"'{path}' is not a Hessian file written by llmkit quant --method gptq --hessian.")
    by = {t.name: t for t in g.tensors}
    out = {}
    for name, key in json.loads(g.get("llmkit.hessian.aliases") or "{}").items():
        t = by.get(f"{key}.hessian")
        if t is None or t.type != 0 or len(t.shape) != 2 or t.shape[0] != t.shape[1]:
            raise BadFileFormat(f"'{path}': the Hessian of '{name}' is missing or not a square F32 matrix.")
        out[name] = (g.data_offset + t.offset, int(t.shape[0]))
    return out


def collect_hessians(model_path: str, text: str, out_path: str, n_ctx: int = 512, chunks: int = 0, threads=None,
                     progress=None) -> None:
    """Run the model over calibration text and save every matrix's H (see imatrix.collect)."""
    from llmkit.llama import runtime
    from llmkit.quant.imatrix import collect

    probe = runtime.open_model(model_path, runtime.ModelOptions(n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads),
                               logits_all=False)
    n_tok = len(probe.tokenize(text.encode("utf-8"), add_bos=False, special=False))
    del probe
    if n_tok < n_ctx:
        raise BadInput(f"the calibration text has {n_tok} tokens, fewer than one chunk of {n_ctx}; give more text "
                       "or a smaller -c.")
    sums, counts, n = collect(model_path, text, n_ctx=n_ctx, threads=threads, max_chunks=chunks, progress=progress,
                              hessian=True)
    if not sums:
        raise BadInput("no matrix inputs were seen while running the model; is it a transformer GGUF?")
    save_hessians(out_path, sums, counts, n, n_ctx, model_path)


def _matrix_job(src: str, data_offset: int, t_offset: int, t_type: int, t_type_name: str, shape: tuple, name: str,
                new: str, hpath: str, h_offset: int, dim: int, damp: float, refit: bool, importance):
    """Worker: read one matrix and its H from disk (memory-mapped), run GPTQ."""
    from llmkit.quant.quantize import to_f32

    class _Info:
        pass

    from llmkit.quant.quantize import tensor_bytes

    info = _Info()
    info.shape, info.type, info.type_name, info.name = shape, t_type, t_type_name, name
    nbytes = tensor_bytes(t_type_name, shape)
    with open(src, "rb") as f:
        f.seek(data_offset + t_offset)
        raw = np.frombuffer(f.read(nbytes), np.uint8)
    W = to_f32(raw, info).reshape(-1, shape[0])
    H = np.memmap(hpath, dtype="<f4", mode="r", offset=h_offset, shape=(dim, dim))
    q, lam = quantize_matrix(W, np.asarray(H), new, damp, refit, importance)
    return name, q, lam


def gptq_replacements(src: str, types: dict[str, str], hessian_path: str, imatrix: dict | None = None,
                      damp: float = 0.01, refit: bool = True, threads=None, progress=None) -> tuple[dict, dict]:
    """GPTQ bytes for every 2-D matrix whose type GPTQ writes and whose H is known:
    ({name: uint8 bytes}, {name: dampening used when it had to be raised})."""
    from concurrent.futures import ProcessPoolExecutor

    from llmkit.gguf.reader import read_gguf

    g = read_gguf(src)
    hidx = hessian_index(hessian_path)
    jobs = []
    for t in g.tensors:
        new = types.get(t.name)
        if new not in SUPPORTED or len(t.shape) != 2 or t.name not in hidx:
            continue
        off, dim = hidx[t.name]
        if dim != t.shape[0]:
            raise BadInput(f"the Hessian file's H for '{t.name}' is {dim}x{dim}, the tensor has rows of {t.shape[0]}: "
                           "it belongs to another model.")
        imp = None if imatrix is None or t.name not in imatrix else np.asarray(imatrix[t.name], np.float32)
        jobs.append((src, g.data_offset, t.offset, t.type, t.type_name, tuple(t.shape), t.name, new, hessian_path,
                     off, dim, damp, refit, imp))
    if not jobs:
        raise BadInput("no matrix of this model has both a GPTQ type (Q2_K..Q6_K, Q4_0) and a Hessian; "
                       "check the type and that the Hessians come from this model.")
    out, raised = {}, {}
    workers = max(1, threads or os.cpu_count() or 1)
    with ProcessPoolExecutor(workers) as pool:
        for i, (name, q, lam) in enumerate(pool.map(_matrix_job_star, jobs)):
            out[name] = q
            if lam > damp:
                raised[name] = lam
            if progress:
                progress(i + 1, len(jobs), name)
    return out, raised


def _matrix_job_star(args):
    return _matrix_job(*args)
