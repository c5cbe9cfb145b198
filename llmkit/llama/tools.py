"""Where llama.cpp's command-line tools are: the four llmkit runs beside the binding.

scripts/install.sh builds them with the llama-cpp-python wheel (llama_cpp/bin); when pip reused a wheel
without them, scripts/build_llama_server.sh builds them into the cache (llama-server-<version>/).
LLMKIT_LLAMA_BIN names another directory. Nothing here imports llama_cpp (that loads the library).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

from llmkit import config

TOOLS = ("llama-server", "llama-quantize", "llama-perplexity", "llama-imatrix")


def binding_version() -> str | None:
    """The installed llama-cpp-python's version, or None when it is not installed."""
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def bundled_dir() -> Path | None:
    """llama_cpp/bin of the installed binding (where scripts/install.sh's build puts the tools)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent / "bin"


def cache_dir() -> Path | None:
    """Where scripts/build_llama_server.sh puts tools it builds for this binding version."""
    version = binding_version()
    return config.cache_dir(f"llama-server-{version}") if version else None


def search_dirs() -> list[Path]:
    """The directories looked in, first match wins: LLMKIT_LLAMA_BIN, the binding's bin, the cache."""
    dirs = [Path(d) for d in [config.text("LLMKIT_LLAMA_BIN")] if d]
    dirs += [d for d in (bundled_dir(), cache_dir()) if d is not None]
    return dirs


def find(name: str) -> Path | None:
    """The path of tool `name` (one of TOOLS), or None when no directory has an executable of that name."""
    for d in search_dirs():
        p = d / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def missing() -> list[str]:
    """The tools not found anywhere."""
    return [t for t in TOOLS if find(t) is None]
