"""KV-cache memory planning from GGUF metadata (no model load).

bytes = sum over layers of kv_cells(layer) x (row_bytes(type_k, n_head_kv x head_dim_k)
        + row_bytes(type_v, n_head_kv x head_dim_v)) x streams

as llama.cpp allocates it: the context is padded to 256 cells, grouped-query attention stores only
`head_count_kv` heads, per-layer head counts may differ, sliding-window layers keep only about
window + micro-batch cells, and quantized cache types store blocks (q8_0: 34 bytes per 32 values).

Beside the cache, a process holds llama.cpp's compute buffer, sized for a full micro-batch at a full
context: without flash attention the attention scores and their mask (n_head + 1 slabs of
n_ubatch x cells float32), with it only the float16 mask; or the logits of a full micro-batch,
whichever phase is larger (docs/design/llama-runtime.md compares this with llama.cpp's own figures).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from llmkit.errors import BadFileFormat, BadInput, OptionError

# cache type -> (block size, bytes per block)
CACHE_TYPES = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20),
               "q5_0": (32, 22), "q5_1": (32, 24), "iq4_nl": (32, 18)}
PAD = 256
# architectures whose sliding-window layer pattern llama.cpp sets in code (every n-th layer is global)
SWA_PATTERNS = {"gemma3": 6, "gemma3n": 5, "cohere2": 4}


def row_bytes(cache_type: str, n: int) -> int:
    """Bytes of one row of n values in a cache type.

    >>> row_bytes("f16", 64), row_bytes("q8_0", 64)
    (128, 68)
    """
    if cache_type not in CACHE_TYPES:
        raise BadInput(f"unknown cache type '{cache_type}'. Use one of: {', '.join(CACHE_TYPES)}.")
    bs, size = CACHE_TYPES[cache_type]
    if n % bs:
        raise BadInput(f"cache type {cache_type} needs rows divisible by {bs}, but a layer has {n} values per row.")
    return n // bs * size


@dataclass
class KVPlan:
    model: str
    architecture: str
    n_layer: int
    n_ctx: int
    n_ctx_cells: int
    n_seq: int
    cache_type_k: str
    cache_type_v: str
    head_count_kv: list[int]
    head_dim_k: int
    head_dim_v: int
    swa_layers: int
    swa_cells: int
    k_bytes: int
    v_bytes: int
    weights_bytes: int
    bandwidth_gbs: float | None = None
    per_layer_bytes: list[int] = field(default_factory=list)
    train_ctx: int = 0
    flash_attn: bool = False
    n_ubatch: int = 512
    compute_bytes: int = 0  # llama.cpp's compute buffer for these settings
    output_bytes: int = 0  # logits of one token; a batch asking for more grows it by that many rows
    rope_scaling: str = ""

    @property
    def kv_bytes(self) -> int:
        return self.k_bytes + self.v_bytes

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.weights_bytes

    @property
    def process_bytes(self) -> int:
        """What a process running the model holds at most: weights, KV, compute buffer, logits."""
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes

    @property
    def allocated_bytes(self) -> int:
        """The memory llama.cpp allocates (the weights are a mapping of the file, pages the kernel may drop)."""
        return self.kv_bytes + self.compute_bytes + self.output_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return self.kv_bytes / (self.n_ctx_cells * self.n_seq)

    def decode_bound_tok_s(self, filled_tokens: int | None = None) -> float | None:
        """Upper bound on decode speed: every token reads all weights plus the filled KV cache."""
        if not self.bandwidth_gbs:
            return None
        kv_read = self.kv_bytes_per_token * (filled_tokens if filled_tokens is not None else self.n_ctx)
        return self.bandwidth_gbs * 1e9 / (self.weights_bytes + kv_read)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(kv_bytes=self.kv_bytes, total_bytes=self.total_bytes, kv_bytes_per_token=self.kv_bytes_per_token,
                 process_bytes=self.process_bytes, decode_bound_tok_s_full_ctx=self.decode_bound_tok_s())
        return d


def _hparam(g, arch: str, key: str, default=None):
    return g.get(f"{arch}.{key}", default)


def plan(path: str, n_ctx: int | None = None, n_seq: int = 1, cache_type_k: str = "f16", cache_type_v: str = "f16",
         n_ubatch: int = 512, bandwidth_gbs: float | None = None, flash_attn: bool = False, gguf=None) -> KVPlan:
    """Compute the KV cache llama.cpp will allocate for a model and settings, and the rest of what a
    process running it holds. n_ctx None: min(2048, the training context); 0: the training context."""
    from llmkit.gguf.reader import read_gguf

    if n_seq < 1:
        raise OptionError("{parallel} must be at least 1, got {value}.", value=n_seq)
    g = gguf if gguf is not None else read_gguf(path)
    arch = g.get("general.architecture")
    if not arch:
        raise BadFileFormat(f"'{path}' has no general.architecture; it is not a llama.cpp model.")
    n_layer = _hparam(g, arch, "block_count")
    n_embd = _hparam(g, arch, "embedding_length")
    n_head = _hparam(g, arch, "attention.head_count")
    if not all(isinstance(x, (int, np.integer, np.ndarray)) for x in (n_layer, n_embd, n_head)):
        raise BadFileFormat(f"'{path}' lacks {arch}.block_count/embedding_length/attention.head_count.")
    n_layer = int(n_layer)
    heads = _per_layer(n_head, n_layer)
    kv = _hparam(g, arch, "attention.head_count_kv", n_head)
    heads_kv = _per_layer(kv, n_layer)
    head_dim_default = int(n_embd) // max(heads[0], 1)
    hk = int(_hparam(g, arch, "attention.key_length", head_dim_default))
    hv = int(_hparam(g, arch, "attention.value_length", head_dim_default))
    train_ctx = int(_hparam(g, arch, "context_length", 2048) or 2048)
    n_ctx = min(2048, train_ctx) if n_ctx is None else n_ctx or train_ctx
    if n_ctx < 1:
        raise BadInput(f"context size must be positive, got {n_ctx}.")
    cells = math.ceil(n_ctx / PAD) * PAD
    is_swa, swa_cells = _sliding_window(g, arch, n_layer, cells, n_seq, n_ubatch)
    layer_cells = [swa_cells if is_swa[il] else cells for il in range(n_layer)]
    # a layer without attention (hybrid models: no kv heads) holds no cache
    k_layer = [row_bytes(cache_type_k, h * hk) * c if h else 0 for h, c in zip(heads_kv, layer_cells)]
    v_layer = [row_bytes(cache_type_v, h * hv) * c if h else 0 for h, c in zip(heads_kv, layer_cells)]
    k_bytes, v_bytes = sum(k_layer), sum(v_layer)
    per_layer = [k + v for k, v in zip(k_layer, v_layer)]
    weights = sum(t.nbytes for t in g.tensors)
    ub, compute, n_vocab = _compute_bytes(g, arch, n_layer, int(n_embd), max(heads), cells, n_ubatch, flash_attn)
    scaling = _hparam(g, arch, "rope.scaling.type")
    factor = _hparam(g, arch, "rope.scaling.factor")
    rope = f"{scaling} x{float(factor):g}" if scaling and scaling != "none" and factor else "none"
    return KVPlan(model=path, architecture=arch, n_layer=n_layer, n_ctx=n_ctx, n_ctx_cells=cells, n_seq=n_seq,
                  cache_type_k=cache_type_k, cache_type_v=cache_type_v, head_count_kv=heads_kv, head_dim_k=hk,
                  head_dim_v=hv, swa_layers=sum(is_swa), swa_cells=swa_cells, k_bytes=k_bytes, v_bytes=v_bytes,
                  weights_bytes=weights, bandwidth_gbs=bandwidth_gbs, per_layer_bytes=per_layer, train_ctx=train_ctx,
                  flash_attn=flash_attn, n_ubatch=ub, compute_bytes=compute, output_bytes=n_vocab * 4 * n_seq,
                  rope_scaling=rope)


def _sliding_window(g, arch: str, n_layer: int, cells: int, n_seq: int, n_ubatch: int) -> tuple[list[bool], int]:
    """(which layers use the sliding window, the cells each of those holds); no window: all False, 0."""
    window = _hparam(g, arch, "attention.sliding_window")
    pattern = SWA_PATTERNS.get(arch)
    if not (window and pattern):
        return [False] * n_layer, 0
    is_swa = [(il % pattern) < pattern - 1 for il in range(n_layer)]
    return is_swa, min(cells, math.ceil((int(window) * n_seq + n_ubatch) / PAD) * PAD)


def _compute_bytes(g, arch: str, n_layer: int, n_embd: int, max_heads: int, cells: int, n_ubatch: int,
                   flash_attn: bool) -> tuple[int, int, int]:
    """(micro-batch, compute buffer bytes, vocabulary size): the larger of the attention scores and
    the output logits for one micro-batch, plus the feed-forward activations."""
    tokens = g.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if tokens is not None else 0
    n_ff = _hparam(g, arch, "feed_forward_length", 4 * n_embd)
    n_ff = max(_per_layer(n_ff, n_layer)) if n_ff is not None else 4 * n_embd
    ub = min(n_ubatch, cells)
    attention = (ub * cells * 2 if flash_attn else (max_heads + 1) * ub * cells * 4)
    return ub, max(attention, ub * n_vocab * 4) + ub * 4 * (2 * n_ff + n_embd), n_vocab


def context_sweep(path: str, top: int | None = None) -> list[int]:
    """Context sizes for a memory curve: powers of two from 1024 to the training context (or `top`)."""
    from llmkit.gguf.reader import read_gguf

    g = read_gguf(path)
    arch = g.get("general.architecture")
    top = top or int(_hparam(g, arch, "context_length", 2048) or 2048)
    ctxs = [1 << i for i in range(10, 21) if (1 << i) < top]
    return ctxs + [top]


def memory_chart(plans: list[KVPlan], ram_bytes: int | None):
    """A panel of what a process holds (weights + KV + compute + logits) against context length, one
    series per model and cache setting, the machine's memory marked."""
    from llmkit.plot import Panel, Series

    curves: dict[str, list[KVPlan]] = {}
    for p in plans:
        label = f"{Path(p.model).name} ({p.cache_type_k}/{p.cache_type_v}{', flash' if p.flash_attn else ''})"
        curves.setdefault(label, []).append(p)
    series = [Series(label, [p.n_ctx for p in ps], [p.process_bytes / 2**30 for p in ps])
              for label, ps in curves.items()]
    hlines = [(ram_bytes / 2**30, f"RAM {ram_bytes / 2**30:.0f} GiB")] if ram_bytes else []
    return [Panel("memory a process holds against context length", "context (tokens)", "GiB", series,
                  hlines=hlines, xlog=True)]


def check_fits(path: str, opts, available: int | None = None, gguf=None) -> list[str]:
    """Refuse, before a model is loaded, a context whose memory cannot be had (naming the bytes needed,
    the bytes available and the largest context that fits); notes to show otherwise (a context past
    the training context). `gguf`: the file already read, if it was."""
    from llmkit.gguf.reader import read_gguf
    from llmkit.machine import available_memory

    g = gguf if gguf is not None else read_gguf(path)

    def at(n: int) -> KVPlan:
        return plan(path, n, 1, opts.cache_type_k, opts.cache_type_v, n_ubatch=opts.n_batch,
                    flash_attn=bool(opts.flash_attn), gguf=g)

    p = at(opts.n_ctx)
    need = p.allocated_bytes + (0 if opts.use_mmap else p.weights_bytes)
    free = available if available is not None else available_memory()
    if free is not None and need > free:
        lo, hi = 0, p.n_ctx_cells // PAD  # bisection over whole 256-cell steps
        while lo < hi:
            mid = (lo + hi + 1) // 2
            q = at(mid * PAD)
            if q.allocated_bytes + (0 if opts.use_mmap else q.weights_bytes) <= free:
                lo = mid
            else:
                hi = mid - 1
        fits = f"the largest context that fits is {lo * PAD} tokens" if lo else "no context fits"
        hint = "" if opts.flash_attn else ", or pass --flash-attn (its compute buffer does not grow with n_head)"
        raise BadInput(f"a context of {p.n_ctx} tokens needs {need / 2**30:.2f} GiB (KV {p.kv_bytes / 2**30:.2f} GiB, "
                       f"compute buffer {p.compute_bytes / 2**30:.2f} GiB) but {free / 2**30:.2f} GiB of memory is "
                       f"available; {fits}. Lower -c, quantize the KV cache (--ctk q8_0 --ctv q8_0){hint}.")
    notes = []
    if p.n_ctx > p.train_ctx:
        notes.append(f"the context ({p.n_ctx} tokens) is larger than the model's training context ({p.train_ctx}); "
                     f"positions past it are extrapolated (RoPE scaling: {p.rope_scaling}).")
    return notes


def budget_in_tokens(path: str, n_ctx: int, budget_bytes: float | None = None, gpu_gb: float | None = None) -> int:
    """A KV budget in tokens of this model: `budget_bytes`, or GPU memory (GB) minus the weights."""
    p = plan(path, n_ctx)
    if budget_bytes is None:
        budget_bytes = gpu_gb * 1e9 - p.weights_bytes
        if budget_bytes <= 0:
            raise BadInput(f"the weights ({p.weights_bytes / 1e9:.2f} GB) do not fit in {gpu_gb} GB.")
    return int(budget_bytes // p.kv_bytes_per_token)


def _per_layer(v, n_layer: int) -> list[int]:
    if isinstance(v, np.ndarray):
        if len(v) != n_layer:
            raise BadFileFormat(f"a per-layer head count has {len(v)} entries for {n_layer} layers.")
        return [int(x) for x in v]
    return [int(v)] * n_layer


def measure_read_bandwidth(repeats: int = 3) -> float:
    """Read bandwidth in GB/s now: the best of a few numpy sums over 256 MB."""
    a = np.ones(256 * 1024 * 1024 // 8)
    a.sum()
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        a.sum()
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def measured_bandwidth(cache_dir: str | None = None) -> float:
    """This machine's memory read bandwidth in GB/s (numpy sum over 256 MB), measured once and cached."""
    from llmkit import config

    cache = Path(cache_dir) / "bandwidth.json" if cache_dir else config.cache_dir("bandwidth.json")
    try:
        return float(json.loads(cache.read_text())["read_gbs"])
    except (OSError, ValueError, KeyError):
        pass
    best = measure_read_bandwidth()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        from llmkit.io import atomic_write_text

        atomic_write_text(cache, json.dumps({"read_gbs": best, "measured": time.strftime("%Y-%m-%d")}))
    except OSError:
        pass
    return best
