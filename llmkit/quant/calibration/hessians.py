"""GPTQ's Hessians: H = X^T X of every matrix's inputs over calibration text (collected by
imatrix.collect_gram), saved as a GGUF file of F32 matrices and read back memory-mapped by name.

Memory: one H is ne0^2 float32, and a model's Hessians together can exceed the machine's memory,
so they are never all held at once. One short pass finds the layout (which matrices share
an input, each input's width), the file's header is written, then the model runs over the text once
per group of layers, each pass accumulating only that group's H and writing it to its place in the
file. The passes repeat the same float32 operations in the same order, so the file holds the same
numbers as one pass over every layer would. `gptq_memory` estimates a whole GPTQ run from the
model's shapes before anything starts.
"""

from __future__ import annotations

import gc
import json
import os
import re

import numpy as np

from llmkit.errors import BadFileFormat, BadInput, OptionError
from llmkit.gguf.reader import read_gguf
from llmkit.gguf.writer import f32_layout
from llmkit.quant.calibration.imatrix import collect_gram
from llmkit.machine import available_memory


HESSIAN_FORMAT = "llmkit-hessians"
OVERHEAD = 768 << 20  # an allowance for Python, numpy, llama.cpp's context and compute buffers
_LAYER = re.compile(r"blk\.(\d+)\.")


def hessian_index(path: str) -> dict[str, tuple[int, int]]:
    """{matrix name: (byte offset of its H in the file, dimension)} of a Hessian file (checked)."""
    g = read_gguf(path)
    if g.get("general.type") != HESSIAN_FORMAT:
        raise BadFileFormat(f"'{path}' is not a Hessian file written by llmkit (GPTQ's saved Hessians).")
    by = {t.name: t for t in g.tensors}
    out = {}
    for name, key in json.loads(g.get("llmkit.hessian.aliases") or "{}").items():
        t = by.get(f"{key}.hessian")
        if t is None or t.type != 0 or len(t.shape) != 2 or t.shape[0] != t.shape[1]:
            raise BadFileFormat(f"'{path}': the Hessian of '{name}' is missing or not a square F32 matrix.")
        out[name] = (g.data_offset + t.offset, int(t.shape[0]))
    return out


def layer_of(name: str) -> int:
    """blk.N.* -> N (-1 for a matrix outside the layers)."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def matrix_inputs(src: str) -> dict[str, int]:
    """{matrix: its input width} for the 2-D blk.* matrices of a model, from its shapes alone."""
    return {t.name: int(t.shape[0]) for t in read_gguf(src).tensors
            if len(t.shape) == 2 and t.name.startswith("blk.") and t.shape[1] > 1}


def layer_bytes(widths: dict[str, int]) -> dict[int, int]:
    """float32 H bytes per layer, every matrix counted as its own input (an upper bound: q/k/v and
    gate/up share theirs)."""
    out: dict[int, int] = {}
    for name, d in widths.items():
        out[layer_of(name)] = out.get(layer_of(name), 0) + 4 * d * d
    return out


def rounding_bytes(dim: int, rows: int) -> int:
    """What rounding one matrix of `rows` x `dim` holds: its H mapped (float32), four float64 H-sized
    matrices (three while inverting, U kept; LAPACK's copies) and the matrix in float64 with its
    temporaries."""
    return 4 * dim * dim + 4 * 8 * dim * dim + 24 * dim * rows


def gptq_memory(src: str, threads: int, memory: int | None = None) -> tuple[int, int, int]:
    """(peak bytes a GPTQ run needs at least, bytes per group of layers its Hessian passes may hold,
    bytes the rounding jobs may hold together), estimated from the model's shapes for a target peak
    `memory` (default: the larger of twice the file's size and that least peak). Collecting: the model
    (mapped, resident once read) + one group's H + one H of temporaries + OVERHEAD. Rounding: each
    running job's rounding_bytes, beside the parent holding the quantized bytes (<= half the file).
    How the estimate compares with measured peaks: docs/design/quant-gptq.md."""
    size = os.path.getsize(src)
    widths = matrix_inputs(src)
    if not widths:
        raise BadInput(f"'{src}' has no blk.* weight matrices for GPTQ.")
    big = max(widths.values())
    per_layer = layer_bytes(widths)
    rows = {t.name: int(t.shape[1]) for t in read_gguf(src).tensors if t.name in widths}
    worker = max(rounding_bytes(d, rows[n]) for n, d in widths.items())
    least = max(size + max(per_layer.values()) + 4 * big * big + OVERHEAD, OVERHEAD + size // 2 + worker)
    target = max(2 * size, least) if memory is None else memory
    if target < least:
        raise OptionError("GPTQ on {path} needs about {need:.1f} GiB (the model with one layer's Hessians, or one "
                          "rounding worker), more than the {allowed:.1f} GiB allowed; use a machine with more memory or "
                          "round-to-nearest ({method} rtn).", path=f"'{src}'", need=least / 2**30,
                          allowed=target / 2**30)
    group = target - size - 4 * big * big - OVERHEAD
    return least, group, target - OVERHEAD - size // 2


def check_gptq_fits(src: str, threads: int) -> tuple[int, int]:
    """Before a GPTQ run starts: (bytes per Hessian group, bytes the rounding jobs may hold together), or
    an OptionError in one line when even the least memory it needs is more than this machine has
    available."""
    least, group, jobs = gptq_memory(src, threads)
    avail = available_memory()
    if avail is not None and least > avail:
        raise OptionError("GPTQ on {path} needs about {need:.1f} GiB of memory (estimated from its shapes), {avail:.1f} "
                          "GiB is available; free memory or use round-to-nearest ({method} rtn).", path=f"'{src}'",
                          need=least / 2**30, avail=avail / 2**30)
    if avail is not None and 2 * os.path.getsize(src) > avail:  # fit the passes to what there is
        least, group, jobs = gptq_memory(src, threads, max(least, avail))
    return group, jobs


def layer_hessian_bytes(layout: dict[str, tuple[str, int]]) -> dict[int, int]:
    """{layer: bytes of its distinct float32 H} as a Hessian file holds them (shared inputs once)."""
    per: dict[int, int] = {}
    for name, (key, d) in layout.items():
        if key == name:
            per[layer_of(name)] = per.get(layer_of(name), 0) + 4 * d * d
    return per


def layer_groups(layout: dict[str, tuple[str, int]], budget: int) -> list[list[int]]:
    """Consecutive layers packed into groups whose distinct H (float32) fit `budget` bytes (a layer
    that alone exceeds it gets a group of its own)."""
    per = layer_hessian_bytes(layout)
    groups: list[list[int]] = []
    used = 0
    for layer in sorted(per):
        if groups and used + per[layer] <= budget:
            groups[-1].append(layer)
            used += per[layer]
        else:
            groups.append([layer])
            used = per[layer]
    return groups


def hessian_layout(model_path: str, text: str, n_ctx: int = 512, threads=None) -> dict[str, tuple[str, int]]:
    """{matrix: (the matrix whose H it shares, H's dimension)} from one short pass over the text."""
    shapes, _, _ = collect_gram(model_path, text, n_ctx=n_ctx, threads=threads, max_chunks=1, layout_only=True)
    if not shapes:
        raise BadInput("no matrix inputs were seen while running the model; is it a transformer GGUF?")
    first_of: dict[int, str] = {}
    return {name: (first_of.setdefault(id(shapes[name]), name), int(shapes[name].shape[1])) for name in sorted(shapes)}


def check_disk(folder: str, need: int, what: str, where: str = "TMPDIR") -> int:
    """The free bytes of `folder`'s disk; a run whose files need more room than that is refused before
    anything is written (`where`: what the user points at another disk)."""
    import shutil

    free = shutil.disk_usage(folder).free
    if need > free:
        raise OptionError("{what} need about {need:.1f} GiB of disk in {folder}, {free:.1f} GiB is free; point "
                          + where + " at a disk with room.", what=what, need=need / 2**30, folder=f"'{folder}'",
                          free=free / 2**30)
    return free


def collect_hessians(model_path: str, text: str, out_path: str, n_ctx: int = 512, chunks: int = 0, threads=None,
                     progress=None, group_bytes: int | None = None) -> int:
    """Run the model over calibration text and save every matrix's H (the mean of x x^T over tokens),
    one pass per group of layers holding at most `group_bytes` of Hessians (default: all in one
    pass). Returns the number of passes."""
    layout = hessian_layout(model_path, text, n_ctx, threads)
    groups = layer_groups(layout, group_bytes if group_bytes is not None else 1 << 62)
    check_disk(os.path.dirname(os.path.abspath(out_path)), sum(layer_hessian_bytes(layout).values()),
               "GPTQ's Hessians", "{hessian_path}")
    _write_groups(model_path, text, out_path, layout, groups, n_ctx, chunks, threads, progress, 0, len(groups))
    return len(groups)


def stream_hessians(model_path: str, text: str, folder: str, n_ctx: int = 512, chunks: int = 0, threads=None,
                    progress=None, group_bytes: int | None = None, keep_free: int = 0):
    """The Hessians a group of layers at a time: yields the path of a file in `folder` holding one
    group's H, to be used and deleted before the next is collected, so the disk holds one group at
    most (groups are sized to the smaller of `group_bytes` and the folder's free space less `keep_free`)."""
    layout = hessian_layout(model_path, text, n_ctx, threads)
    free = check_disk(folder, max(layer_hessian_bytes(layout).values()) + keep_free,
                      "GPTQ's Hessians of one layer and the rounded matrices")
    room = free - keep_free - (1 << 20)
    groups = layer_groups(layout, min(room, group_bytes if group_bytes is not None else 1 << 62))
    for gi, layers in enumerate(groups):
        path = os.path.join(folder, f"hessians-{gi}.gguf")
        _write_groups(model_path, text, path, layout, [layers], n_ctx, chunks, threads, progress, gi, len(groups))
        yield path


def _write_groups(model_path: str, text: str, out_path: str, layout: dict, groups: list[list[int]], n_ctx: int,
                  chunks: int, threads, progress, first: int, total: int) -> None:
    """One Hessian file of the matrices in `groups`' layers, one pass over the text per group
    (progress counts passes `first`.. of `total`)."""
    from llmkit.io import atomic_file

    wanted_all = {layer for layers in groups for layer in layers}
    layout = {n: v for n, v in layout.items() if layer_of(n) in wanted_all}
    keys = sorted({k for k, _ in layout.values()}, key=lambda k: (layer_of(k), k))

    def header(n_chunks: int) -> tuple[bytes, list[int]]:
        kvs = [("general.type", "str", HESSIAN_FORMAT), ("llmkit.hessian.model", "str", os.path.basename(model_path)),
               ("llmkit.hessian.aliases", "str", json.dumps({n: k for n, (k, _) in layout.items()})),
               ("llmkit.hessian.chunks", "u32", n_chunks), ("llmkit.hessian.chunk_size", "u32", n_ctx)]
        return f32_layout(kvs, [(f"{k}.hessian", (layout[k][1], layout[k][1])) for k in keys])

    head, offsets = header(0)
    at = dict(zip(keys, offsets))
    n = 0
    with atomic_file(out_path) as f:
        f.write(head)
        for gi, layers in enumerate(groups, first):
            wanted = set(layers)
            step = None if progress is None else (lambda d, t, gi=gi: progress(gi * t + d, total * t))
            sums, counts, n = collect_gram(model_path, text, n_ctx=n_ctx, threads=threads, max_chunks=chunks,
                                           progress=step, only=lambda name: layer_of(name) in wanted)
            for k in keys:
                if layer_of(k) not in wanted:
                    continue
                d = layout[k][1]
                h = sums.get(k)
                if h is None or h.shape != (d, d):
                    raise BadInput(f"the matrix '{k}' was not seen again while collecting its Hessian.")
                h /= np.float32(max(int(np.asarray(counts[k]).sum()), 1))  # in place: no second copy
                f.seek(at[k])
                f.write(memoryview(np.ascontiguousarray(h, "<f4")).cast("B"))
            del sums, counts
            gc.collect()  # the pass's model object (its logits buffer is vocabulary-sized) before the next
        end = f.seek(0, os.SEEK_END)
        f.truncate(max(end, offsets[-1] + 4 * layout[keys[-1]][1] ** 2))
        f.seek(0)
        f.write(header(n)[0])  # the same length: only the chunk count (a u32) changes
