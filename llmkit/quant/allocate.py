"""Per-tensor types chosen under a size budget (`llmkit quant --target-bpw B` / `--target-size S`).

llama.cpp's mixes (Q4_K_M, ...) give every model the same recipe. Here each tensor's type is chosen
for this model, ExLlamaV2-style: a measured error for every candidate type, then the cheapest
allocation of bits under the budget.

1. Error of a candidate: a deterministic sample of the tensor's rows (evenly spaced, about 128k
   weights) is quantized with llmkit's byte-exact quantizers and dequantized; the error is the
   activation-weighted squared error sum_j w_j (x_ij - q_ij)^2 (w = the imatrix's mean squared input
   per column, i.e. the expected squared output error of the matrix; 1 without an imatrix), scaled
   to all rows.
2. Sensitivity: how much the model's output cares about a tensor's error. With calibration text
   (`--calib`) one probe per tensor kind (attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up,
   ffn_down, token_embd, output): that kind quantized to Q4_0, everything else Q8_0, and the KL
   divergence to the all-Q8_0 model measured on the text (through llama.cpp); the kind's
   sensitivity is that KLD per unit of the kind's added error, so the allocator minimises a
   predicted KLD. Without calibration text every kind counts the same.
3. Solver: a multiple-choice knapsack by Lagrangian relaxation (each tensor takes the type that
   minimises sensitivity x error + lambda x bytes; lambda bisected to the largest allocation that
   fits), then the remaining bytes are spent on the upgrades with the best error saved per byte.
   The file lands at most a few tensors' worth of bytes, and within 0.5 %, under the budget.

1-D tensors (norms) and tensors llama.cpp never quantizes keep their type; a candidate needs row
lengths its block size divides.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from llmkit.errors import BadInput
from llmkit.quant import rules
from llmkit.quant.base import get_format

CANDIDATES = ("Q2_K", "Q3_K", "IQ4_XS", "Q4_K", "IQ4_NL", "Q4_0", "Q4_1", "Q5_K", "Q5_0", "Q5_1", "Q6_K",
              "Q8_0", "F16")
KINDS = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "token_embd",
         "output", "other")
SAMPLE_WEIGHTS = 1 << 17


@dataclass
class Item:
    name: str
    shape: list[int]
    kind: str
    fixed: str | None  # a type that cannot change (not quantizable)
    bytes: dict = field(default_factory=dict)  # type -> padded bytes
    error: dict = field(default_factory=dict)  # type -> weighted squared error (whole tensor)
    chosen: str = ""


@dataclass
class Allocation:
    assign: dict  # tensor -> type
    budget: int  # bytes allowed for the tensors' data (+ header for --target-size)
    used: int
    predicted: float  # sensitivity-weighted error sum (predicted KLD with probes)
    sensitivity: dict  # kind -> factor
    sensitivity_source: str  # "probe" | "cached probe" | "none"
    items: list[Item]
    seconds: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["items"] = [{"name": i.name, "kind": i.kind, "type": i.chosen, "bytes": i.bytes.get(i.chosen),
                       "error": i.error.get(i.chosen)} for i in self.items]
        return d


def _padded(type_name: str, shape, align: int) -> int:
    from llmkit.quant.quantize import tensor_bytes

    n = tensor_bytes(type_name, shape)
    return n + (-n % align)


def candidates_for(shape) -> list[str]:
    return [t for t in CANDIDATES if shape[0] % rules.BLOCK[t] == 0]


def sample_rows(n_rows: int, ne0: int) -> np.ndarray:
    """Evenly spaced rows, about SAMPLE_WEIGHTS weights in all (all rows of small tensors)."""
    k = max(1, min(n_rows, SAMPLE_WEIGHTS // max(ne0, 1)))
    return np.unique(np.linspace(0, n_rows - 1, k).round().astype(np.int64))


def measure(src: str, imatrix: dict | None = None, threads: int | None = None,
            progress: Callable[[int, int, str], None] | None = None, align: int | None = None,
            hessian_path: str | None = None) -> list[Item]:
    """Every tensor's candidate types with their bytes and measured (sampled) errors. With GPTQ's
    Hessians every candidate's error is the output error tr(D H D^T) of the sampled rows, and the
    types GPTQ writes are measured GPTQ-quantized."""
    from concurrent.futures import ThreadPoolExecutor

    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.quantize import ALIGN

    g = read_gguf(src)
    align = align or int(g.metadata.get("general.alignment", ALIGN))
    hidx = {}
    if hessian_path:
        from llmkit.quant.gptq import hessian_index

        hidx = hessian_index(hessian_path)
    items = []
    order = rules.tensor_order([t.name for t in g.tensors])
    by_name = {t.name: t for t in g.tensors}
    jobs = []
    with open(src, "rb") as f, ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
        for i, name in enumerate(order):
            t = by_name[name]
            shape = tuple(t.shape)
            if not rules.allows_quantization(name, shape):
                items.append(Item(name, list(shape), rules.category(name), t.type_name,
                                  {t.type_name: _padded(t.type_name, shape, align)}, {t.type_name: 0.0}, t.type_name))
                continue
            cands = candidates_for(shape)
            if not cands:
                raise BadInput(f"tensor '{name}' has rows of {shape[0]} weights, which no quantized type fits.")
            ne0 = shape[0]
            n_rows = int(np.prod(shape, dtype=np.int64)) // ne0
            rows_per_matrix = shape[1] if len(shape) > 1 else 1
            rows = sample_rows(n_rows, ne0)
            xs = read_rows(f, t, g.data_offset, rows)
            w = None
            if imatrix is not None and name in imatrix:
                qw = np.asarray(imatrix[name], np.float32)
                if len(qw) == ne0 * (shape[2] if len(shape) > 2 else 1):
                    w = qw.reshape(-1, ne0)  # one row of column weights per expert
            item = Item(name, list(shape), rules.category(name), None,
                        {c: _padded(c, shape, align) for c in cands})
            items.append(item)
            ws = None if w is None else w[(rows // rows_per_matrix) % len(w)]
            h = None
            if name in hidx and len(shape) == 2 and hidx[name][1] == ne0:
                off, dim = hidx[name]
                h = np.memmap(hessian_path, dtype="<f4", mode="r", offset=off, shape=(dim, dim))
            jobs.append(pool.submit(_errors, item, xs, ws, n_rows / len(rows), h))
            if progress:
                progress(i + 1, len(order), name)
        for j in jobs:
            j.result()
    return items


def read_rows(f, info, data_offset: int, rows: np.ndarray) -> np.ndarray:
    """Only the given rows of a tensor, as float32 (n, ne0) (dequantized when stored quantized)."""
    from llmkit.quant.quantize import to_f32

    ne0 = info.shape[0]
    n_rows = int(np.prod(info.shape, dtype=np.int64)) // ne0
    row_nbytes = info.nbytes // n_rows
    buf = np.empty(len(rows) * row_nbytes, np.uint8)
    for k, r in enumerate(rows.tolist()):
        f.seek(data_offset + info.offset + r * row_nbytes)
        f.readinto(memoryview(buf)[k * row_nbytes:(k + 1) * row_nbytes])

    class _Sample:  # to_f32 needs only the shape and type of what it converts
        shape = (ne0, len(rows))
        type, type_name, name = info.type, info.type_name, info.name

    return np.ascontiguousarray(to_f32(buf, _Sample))


def _errors(item: Item, xs: np.ndarray, ws, scale: float, h=None) -> None:
    """Weighted squared error of each candidate on the sampled rows, scaled to the whole tensor
    (with a Hessian: the output error, GPTQ rounding for the types it writes)."""
    weights = np.ones_like(xs) if ws is None else ws
    if h is not None:
        from llmkit.quant.gptq import SUPPORTED, output_error, quantize_matrix

        H = np.asarray(h, np.float64)
        for c in item.bytes:
            fmt = get_format(c)
            if c in SUPPORTED:
                q, _ = quantize_matrix(xs, H, c, importance=None if ws is None else ws[0])
            else:
                q = fmt.quantize(xs, None if ws is None else ws[0])
            d = fmt.dequantize(q.reshape(-1), xs.size).reshape(xs.shape)
            item.error[c] = output_error(xs, d, H) * scale
        return
    for c in item.bytes:
        fmt = get_format(c)
        if ws is not None and fmt.uses_imatrix and len(np.unique(ws, axis=0)) == 1:
            q = fmt.quantize(xs, ws[0])
        elif ws is not None and fmt.uses_imatrix:  # experts: each row with its own expert's weights
            q = np.concatenate([fmt.quantize(xs[i:i + 1], ws[i]) for i in range(len(xs))])
        else:
            q = fmt.quantize(xs)
        d = fmt.dequantize(q.reshape(-1), xs.size).reshape(xs.shape)
        item.error[c] = float(((xs.astype(np.float64) - d) ** 2 * weights).sum() * scale)


def solve(items: list[Item], budget: int, sensitivity: dict | None = None) -> tuple[int, float]:
    """Choose each item's type: minimise sum(sensitivity x error) with sum(bytes) <= budget.
    Returns (bytes used, predicted error)."""
    s = sensitivity or {}
    free = [i for i in items if i.fixed is None]
    fixed_bytes = sum(i.bytes[i.fixed] for i in items if i.fixed is not None)
    lo_total = fixed_bytes + sum(min(i.bytes.values()) for i in free)
    hi_total = fixed_bytes + sum(max(i.bytes.values()) for i in free)
    if budget < lo_total:
        raise BadInput(f"the budget of {budget:,} bytes is below the smallest possible model ({lo_total:,} bytes with "
                       "every tensor at its smallest type). Raise --target-bpw/--target-size.")
    if budget >= hi_total:
        raise BadInput(f"the budget of {budget:,} bytes reaches the largest candidate mix ({hi_total:,} bytes, F16 "
                       "where it fits): nothing to allocate. Lower --target-bpw/--target-size, or use -t F16.")

    def cost(i, t):
        return s.get(i.kind, 1.0) * i.error[t]

    def pick(lam):
        total = fixed_bytes
        for i in free:
            i.chosen = min(i.bytes, key=lambda t: (cost(i, t) + lam * i.bytes[t], i.bytes[t]))
            total += i.bytes[i.chosen]
        return total

    lo, hi = 0.0, 1.0
    while pick(hi) > budget:
        hi *= 4
        if hi > 1e30:
            break
    for _ in range(100):  # bisection on lambda: the smallest lambda whose allocation fits
        mid = (lo + hi) / 2
        if pick(mid) > budget:
            lo = mid
        else:
            hi = mid
    used = pick(hi)
    # spend what is left: upgrades by error saved per extra byte, best first
    while True:
        best, best_gain = None, 0.0
        for i in free:
            for t, b in i.bytes.items():
                extra = b - i.bytes[i.chosen]
                if extra <= 0 or used + extra > budget:
                    continue
                gain = (cost(i, i.chosen) - cost(i, t)) / extra
                if gain > best_gain:
                    best, best_gain = (i, t, extra), gain
        if best is None:
            break
        i, t, extra = best
        i.chosen = t
        used += extra
    for i in items:
        if i.fixed is not None:
            i.chosen = i.fixed
    return used, float(sum(cost(i, i.chosen) for i in free))


def probe_sensitivity(src: str, items: list[Item], calib_text: str, imatrix=None, n_ctx: int = 256, chunks: int = 4,
                      threads=None, progress=None) -> dict:
    """KLD per unit of added error for each tensor kind (module doc, step 2)."""
    from llmkit.quant.kld import kl_divergence, save_base
    from llmkit.quant.quantize import quantize_file

    kinds = sorted({i.kind for i in items if i.fixed is None and "Q4_0" in i.bytes and "Q8_0" in i.bytes})
    out = {}
    with tempfile.TemporaryDirectory(prefix="llmkit-probe-") as tmp:
        ref = os.path.join(tmp, "ref.gguf")
        base = os.path.join(tmp, "ref.kld")
        assign = {i.name: ("Q8_0" if "Q8_0" in i.bytes else max(i.bytes, key=i.bytes.get))
                  for i in items if i.fixed is None}
        quantize_file(src, ref, "Q8_0", pure=True, imatrix=imatrix, allow_requantize=True, threads=threads,
                      assign=assign)
        save_base(ref, calib_text, base, n_ctx, chunks, threads)
        # a probe differs from the reference only in one kind's tensors: the others are copied from
        # the reference file's quantized bytes instead of being quantized again
        from llmkit.gguf.reader import read_gguf

        refg = read_gguf(ref)
        mm = np.memmap(ref, np.uint8, "r")
        ref_bytes = {t.name: mm[refg.data_offset + t.offset:refg.data_offset + t.offset + t.nbytes]
                     for t in refg.tensors if t.name in assign}
        for n, kind in enumerate(kinds):
            if progress:
                progress(n, len(kinds), f"probe {kind}")
            probe = os.path.join(tmp, "probe.gguf")
            a = dict(assign)
            added = 0.0
            for i in items:
                if i.kind == kind and i.fixed is None and "Q4_0" in i.bytes:
                    a[i.name] = "Q4_0"
                    added += i.error["Q4_0"] - i.error[assign[i.name]]
            keep = {name: b for name, b in ref_bytes.items() if a[name] == assign[name]}
            quantize_file(src, probe, "Q8_0", pure=True, imatrix=imatrix, allow_requantize=True, threads=threads,
                          assign=a, replace=keep)
            kld = kl_divergence(probe, base, threads).kld_mean
            out[kind] = max(kld, 0.0) / added if added > 0 else 0.0
            os.unlink(probe)
    # kinds that could not be probed take the median factor
    known = [v for v in out.values() if v > 0]
    fill = float(np.median(known)) if known else 1.0
    for i in items:
        if i.fixed is None and i.kind not in out:
            out[i.kind] = fill
    return out


def allocate(src: str, *, target_bpw: float | None = None, target_size: int | None = None, imatrix=None,
             calib_text: str | None = None, threads=None, progress=None, n_ctx: int = 256, chunks: int = 4,
             hessian_path: str | None = None) -> Allocation:
    """Measure, (probe,) and solve for `src` under the budget."""
    t0 = time.perf_counter()
    if (target_bpw is None) == (target_size is None):
        raise BadInput("give exactly one of --target-bpw and --target-size.")
    items = measure(src, imatrix, threads, progress, hessian_path=hessian_path)
    n_weights = sum(int(np.prod(i.shape)) for i in items)
    if target_bpw is not None:
        if not 1.0 < target_bpw < 32.0:
            raise BadInput(f"--target-bpw {target_bpw} is outside what GGUF types give (about 2.6 to 16 bits).")
        budget = int(target_bpw * n_weights / 8)
    else:
        budget = int(target_size) - _header_bytes(src, items)
    sens, source = {}, "none"
    if calib_text:
        key = _probe_key(src, imatrix, calib_text, n_ctx, chunks)
        sens, source = _cached_probe(key), "cached probe"
        if sens is None:
            sens, source = probe_sensitivity(src, items, calib_text, imatrix, n_ctx, chunks, threads, progress), "probe"
            _store_probe(key, sens)
    used, predicted = solve(items, budget, sens)
    return Allocation({i.name: i.chosen for i in items if i.fixed is None}, budget, used, predicted, sens, source,
                      items, time.perf_counter() - t0)


PROBE_VERSION = 1


def _probe_key(src, imatrix, calib_text, n_ctx, chunks) -> str:
    """Identity of a sensitivity probe: the model file (path, size, mtime), the imatrix's contents,
    the calibration text and its chunking. Trying several budgets probes once."""
    import hashlib

    h = hashlib.sha256()
    st = os.stat(src)
    h.update(f"{PROBE_VERSION}|{os.path.abspath(src)}|{st.st_size}|{st.st_mtime_ns}|{n_ctx}|{chunks}|".encode())
    h.update(calib_text.encode("utf-8"))
    for name in sorted(imatrix or {}):
        h.update(name.encode())
        h.update(np.ascontiguousarray(imatrix[name], np.float32).tobytes())
    return h.hexdigest()[:32]


def _probe_cache(key: str) -> str:
    from llmkit.io import cache_dir

    return os.path.join(os.environ.get("LLMKIT_PROBE_CACHE") or str(cache_dir("quant-probes")), key + ".json")


def _cached_probe(key: str) -> dict | None:
    try:
        with open(_probe_cache(key), encoding="utf-8") as f:
            d = json.load(f)
        return {str(k): float(v) for k, v in d.items()}
    except (OSError, ValueError, AttributeError):
        return None


def _store_probe(key: str, sens: dict) -> None:
    from llmkit.io import atomic_write_text

    try:
        os.makedirs(os.path.dirname(_probe_cache(key)), exist_ok=True)
        atomic_write_text(_probe_cache(key), json.dumps(sens))
    except OSError:
        pass  # a cache that cannot be written only costs time


RECIPE_KEY = "llmkit.quantize.recipe"
RECIPE_RESERVE = 4096  # bytes kept for the recipe metadata when a whole-file size is the target


def _header_bytes(src: str, items: list[Item]) -> int:
    """The output header's size (types do not change it) plus room for the recipe entry."""
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.quantize import ALIGN, _header

    g = read_gguf(src)
    align = int(g.metadata.get("general.alignment", ALIGN))
    by = {i.name: i for i in items}
    tensors = [(n, tuple(by[n].shape), "F16" if by[n].fixed is None else by[n].fixed)
               for n in rules.tensor_order(list(by))]
    return len(_header(g, tensors, 1, align)) + RECIPE_RESERVE


def recipe(a: Allocation, target_bpw=None, target_size=None, imatrix: bool = False, method: str = "rtn") -> str:
    """The recipe stored in the output's metadata."""
    counts: dict[str, int] = {}
    for i in a.items:
        counts[i.chosen] = counts.get(i.chosen, 0) + 1
    return json.dumps({"tool": "llmkit quant", "target_bpw": target_bpw, "target_size": target_size,
                       "imatrix": imatrix, "method": method, "sensitivity": a.sensitivity_source,
                       "predicted": a.predicted, "types": counts}, separators=(",", ":"))


def file_type_for(a: Allocation) -> str:
    """The llama.cpp file type named after the type holding most weights."""
    weights: dict[str, int] = {}
    for i in a.items:
        if i.fixed is None:
            weights[i.chosen] = weights.get(i.chosen, 0) + int(np.prod(i.shape))
    top = max(weights, key=weights.get)
    return {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}.get(top, top if top in rules.FTYPES else "Q4_K_M")
