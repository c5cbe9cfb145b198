"""What each candidate type would cost a tensor: its bytes and its measured error (step 1 of allocate.py).

A deterministic sample of the tensor's rows is quantized with llmkit's byte-exact quantizers and
dequantized; the error is the activation-weighted squared error sum_j w_j (x_ij - q_ij)^2 (w = the
imatrix's mean squared input per column; 1 without one), scaled to all rows. The sample: at least
MIN_ROWS evenly spaced rows (about SAMPLE_WEIGHTS weights), which stand for all the others, plus the
TOP_ROWS rows holding the largest weighted magnitudes |x_ij| sqrt(w_j), counted once each: a few
outlier rows can hold most of a tensor's error, and evenly spaced rows miss them. With GPTQ's
Hessians the error is the output error tr(D H D^T) instead. Why these sizes: docs/design/quant-budget.md.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from llmkit.errors import BadInput
from llmkit.gguf.reader import read_gguf
from llmkit.gguf.tensors import read_rows
from llmkit.gguf.types import ALIGNMENT, tensor_bytes
from llmkit.quant.calibration.hessians import hessian_index
from llmkit.quant.formats import get_format, to_f32
from llmkit.quant.formats.jit import DEFAULT, Kernels
from llmkit.quant.plan import rules
from llmkit.quant.rounding.gptq import SUPPORTED, output_error, quantize_matrix

CANDIDATES = ("Q2_K", "Q3_K", "IQ4_XS", "Q4_K", "IQ4_NL", "Q4_0", "Q4_1", "Q5_K", "Q5_0", "Q5_1", "Q6_K",
              "Q8_0", "F16")
# the lattice i-quants: candidates for a tensor with an imatrix entry under a budget of at most
# GRID_MAX_BPW (without an imatrix llama.cpp refuses most of them); above it the K-quants serve every
# tensor well and the slower lattice searches only add time. TQ1_0/TQ2_0, Q1_0/Q2_0 (for models trained
# for them) and MXFP4 (MoE experts) are never candidates: on ordinary weights a smaller type beats them.
GRID_CANDIDATES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
GRID_MAX_BPW = 3.6
SAMPLE_WEIGHTS = 1 << 15  # per tensor: the allocations barely move with larger samples, at a multiple of the time
MIN_ROWS = 8  # even for wide tensors (FFN-down: 3 rows of 8960 would be 32k weights)
TOP_ROWS = 4  # rows with the largest weighted magnitude, always measured


@dataclass
class Item:
    name: str
    shape: list[int]
    kind: str
    fixed: str | None  # a type that cannot change (not quantizable)
    bytes: dict = field(default_factory=dict)  # type -> padded bytes
    error: dict = field(default_factory=dict)  # type -> weighted squared error (whole tensor)
    chosen: str = ""


def padded(type_name: str, shape, align: int) -> int:
    """Bytes of a tensor of this type, padded to the file's alignment."""
    n = tensor_bytes(type_name, shape)
    return n + (-n % align)


def candidates_for(shape, grid: bool = False) -> list[str]:
    """The types a tensor of this shape can take (with `grid`: the lattice i-quants too)."""
    return [t for t in (GRID_CANDIDATES if grid else ()) + CANDIDATES if shape[0] % rules.BLOCK[t] == 0]


def grid_names(imatrix) -> frozenset:
    """The tensors whose imatrix entry lets them take the lattice i-quants."""
    return frozenset(imatrix) if imatrix is not None else frozenset()


def sample_rows(n_rows: int, ne0: int, top: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(rows, how many rows each stands for): evenly spaced rows, about SAMPLE_WEIGHTS weights and at
    least MIN_ROWS (all rows of small tensors), standing for the rest, and the rows `top`, each itself.

    >>> rows, stand = sample_rows(100, 4096, np.array([7]))
    >>> rows.tolist(), stand.tolist()
    ([0, 7, 14, 28, 42, 57, 71, 85, 99], [12.375, 1.0, 12.375, 12.375, 12.375, 12.375, 12.375, 12.375, 12.375])
    """
    k = max(1, min(n_rows, max(MIN_ROWS, SAMPLE_WEIGHTS // max(ne0, 1))))
    even = np.unique(np.linspace(0, n_rows - 1, k).round().astype(np.int64))
    top = np.unique(top) if top is not None and len(top) else np.zeros(0, np.int64)
    even = np.setdiff1d(even, top)
    rows = np.concatenate([even, top])
    stand = np.concatenate([np.full(len(even), (n_rows - len(top)) / max(len(even), 1)), np.ones(len(top))])
    order = np.argsort(rows)
    return rows[order], stand[order]


def top_rows(f, t, data_offset: int, w, k: int = TOP_ROWS) -> np.ndarray:
    """The k rows with the largest |x_ij| sqrt(w_j) (w: (n_matrices, ne0) column weights or None),
    read in slabs of about 4M weights."""
    from llmkit.gguf.tensors import read_tensor, row_slab

    ne0 = t.shape[0]
    n_rows = int(np.prod(t.shape, dtype=np.int64)) // ne0
    if n_rows <= k:
        return np.arange(n_rows)
    rows_per_matrix = t.shape[1] if len(t.shape) > 1 else 1
    sw = None if w is None else np.sqrt(np.maximum(w, 0)).astype(np.float32)
    score = np.empty(n_rows, np.float32)
    step = max(1, (1 << 22) // ne0)
    for r0 in range(0, n_rows, step):
        info = row_slab(t, r0, min(step, n_rows - r0))
        x = np.abs(to_f32(read_tensor(f, info, data_offset), info))
        if sw is not None:
            x *= sw[(np.arange(r0, r0 + len(x)) // rows_per_matrix) % len(sw)]
        score[r0:r0 + len(x)] = x.max(axis=1)
    return np.sort(np.argpartition(score, -k)[-k:])


def shape_items(g, align: int, grid_for=frozenset()) -> list[Item]:
    """Every tensor in llama.cpp's order with its candidate types and their bytes, from the shapes
    alone (no errors yet): enough to know the smallest and largest file before measuring anything.
    Tensors named in `grid_for` may also take the lattice i-quants."""
    by_name = {t.name: t for t in g.tensors}
    items = []
    for name in rules.tensor_order(list(by_name)):
        t = by_name[name]
        shape = tuple(t.shape)
        if not rules.allows_quantization(name, shape):
            items.append(Item(name, list(shape), rules.category(name), t.type_name,
                              {t.type_name: padded(t.type_name, shape, align)}, {t.type_name: 0.0}, t.type_name))
            continue
        cands = candidates_for(shape, name in grid_for)
        if not cands:
            raise BadInput(f"tensor '{name}' has rows of {shape[0]} weights, which no quantized type fits.")
        items.append(Item(name, list(shape), rules.category(name), None, {c: padded(c, shape, align) for c in cands}))
    return items


def measure(src: str, imatrix: dict | None = None, threads: int | None = None,
            progress: Callable[[int, int, str], None] | None = None, align: int | None = None,
            hessian_path: str | None = None, grid: bool = False, kernels: Kernels = DEFAULT) -> list[Item]:
    """Every tensor's candidate types with their bytes and measured (sampled) errors. With GPTQ's
    Hessians every candidate's error is the output error tr(D H D^T) of the sampled rows, and the
    types GPTQ writes are measured GPTQ-quantized."""
    g = read_gguf(src)
    align = align or int(g.metadata.get("general.alignment", ALIGNMENT))
    hidx = {}
    if hessian_path:
        hidx = hessian_index(hessian_path)
    items = shape_items(g, align, grid_names(imatrix) if grid else frozenset())
    by_name = {t.name: t for t in g.tensors}
    jobs = []
    with open(src, "rb") as f, ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
        for i, item in enumerate(items):
            name = item.name
            t = by_name[name]
            shape = tuple(t.shape)
            if item.fixed is not None:
                continue
            ne0 = shape[0]
            n_rows = int(np.prod(shape, dtype=np.int64)) // ne0
            rows_per_matrix = shape[1] if len(shape) > 1 else 1
            w = None
            if imatrix is not None and name in imatrix:
                qw = np.asarray(imatrix[name], np.float32)
                if len(qw) == ne0 * (shape[2] if len(shape) > 2 else 1):
                    w = qw.reshape(-1, ne0)  # one row of column weights per expert
            rows, stand = sample_rows(n_rows, ne0, top_rows(f, t, g.data_offset, w))
            xs = np.ascontiguousarray(to_f32(*read_rows(f, t, g.data_offset, rows)))
            ws = None if w is None else w[(rows // rows_per_matrix) % len(w)]
            h = None
            if name in hidx and len(shape) == 2 and hidx[name][1] == ne0:
                off, dim = hidx[name]
                h = np.memmap(hessian_path, dtype="<f4", mode="r", offset=off, shape=(dim, dim))
            jobs.append(pool.submit(_errors, item, xs, ws, stand, h, kernels))
            if progress:
                progress(i + 1, len(items), name)
        for j in jobs:
            j.result()
    return items


def _errors(item: Item, xs: np.ndarray, ws, stand: np.ndarray, h=None, kernels: Kernels = DEFAULT) -> None:
    """Weighted squared error of each candidate on the sampled rows, each row counted for the rows it
    stands for (with a Hessian: the output error, GPTQ rounding for the types it writes)."""
    weights = np.ones_like(xs) if ws is None else ws
    if h is not None:
        H = np.asarray(h, np.float64)
        for c in item.bytes:
            fmt = get_format(c)
            if c in SUPPORTED:
                q, _ = quantize_matrix(xs, H, c, importance=None if ws is None else ws[0])
            else:
                q = fmt.quantize(xs, None if ws is None else ws[0], kernels)
            d = fmt.dequantize(q.reshape(-1), xs.size).reshape(xs.shape)
            item.error[c] = output_error(xs, d, H, stand)
        return
    for c in item.bytes:
        fmt = get_format(c)
        if ws is not None and fmt.uses_imatrix and len(np.unique(ws, axis=0)) == 1:
            q = fmt.quantize(xs, ws[0], kernels)
        elif ws is not None and fmt.uses_imatrix:  # experts: each row with its own expert's weights
            q = np.concatenate([fmt.quantize(xs[i:i + 1], ws[i], kernels) for i in range(len(xs))])
        else:
            q = fmt.quantize(xs, None, kernels)
        d = fmt.dequantize(q.reshape(-1), xs.size).reshape(xs.shape)
        item.error[c] = float(((xs.astype(np.float64) - d) ** 2 * weights).sum(axis=1) @ stand)
