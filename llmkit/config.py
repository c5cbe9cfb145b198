"""Every setting llmkit reads from the environment, in one table: name, default, meaning, parsing.

Library code asks this module (`config.cache_dir("numba")`, `config.size("LLMKIT_MAX_FILE_BYTES")`,
`config.flag("LLMKIT_DEBUG")`); no other module reads `LLMKIT_*` variables, and docs/configuration.md
is checked against `VARIABLES` by a test.

>>> parse_size("512M"), parse_size("2g"), parse_size("1000")
(536870912, 2147483648, 1000)
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from llmkit.errors import BadInput


@dataclass(frozen=True)
class Variable:
    """One environment variable: its default (None: unset), what it means, and how it is read."""

    name: str
    default: object
    meaning: str
    kind: str = "text"  # text | path | flag | size (a count, may end in K/M/G) | seconds


_V = Variable
VARIABLES = {v.name: v for v in [
    _V("LLMKIT_CACHE", None, "cache root (default $XDG_CACHE_HOME/llmkit or ~/.cache/llmkit); "
       "holds embed/, numba/, quant-probes/, llama-server-<version>/ and bandwidth.json", "path"),
    _V("LLMKIT_MODEL", None, "GGUF model for `generate`, `constrain`, `kv` and the LLM steps of `rag` when none is "
       "given (default: the packaged SmolLM2-135M-Instruct)", "path"),
    _V("LLMKIT_DEBUG", False, "show tracebacks of errors", "flag"),
    _V("LLMKIT_NO_JIT", False, "never use the compiled (numba) quantizer and tokenizer kernels; the Python/numpy "
       "paths give the same bytes, ids and vocabularies", "flag"),
    _V("LLMKIT_JIT", False, "always use the compiled kernels, even for inputs too small to repay compiling or "
       "loading them (LLMKIT_NO_JIT wins)", "flag"),
    _V("LLMKIT_LLAMA_BIN", None, "directory holding llama.cpp's llama-server, llama-quantize, llama-perplexity and "
       "llama-imatrix (default: the ones installed with llama-cpp-python, else the cache)", "path"),
    # bounds on untrusted input (llmkit.io); each may end in K, M or G
    _V("LLMKIT_MAX_JSON_DEPTH", 256, "levels of JSON nesting", "size"),
    _V("LLMKIT_MAX_JSON_BYTES", 2 << 30, "bytes in one JSON or JSONL file", "size"),
    _V("LLMKIT_MAX_LINE_BYTES", 64 << 20, "bytes in one JSONL line, one input line of `tokenize encode`, or one "
       "file of `tokenize count`", "size"),
    _V("LLMKIT_MAX_UNZIPPED_BYTES", 256 << 20, "bytes unpacked from one archive (.docx, .epub)", "size"),
    _V("LLMKIT_MAX_ZIP_ENTRIES", 20000, "entries in one archive (.docx, .epub)", "size"),
    _V("LLMKIT_MAX_FILE_BYTES", 32 << 20, "bytes in one document to index (PDF excepted)", "size"),
    _V("LLMKIT_MAX_PDF_BYTES", 1 << 30, "bytes in one PDF to index", "size"),
    _V("LLMKIT_MAX_PDF_SECONDS", 300, "seconds to extract the text of one PDF", "seconds"),
    _V("LLMKIT_MAX_PDF_PAGE_SECONDS", 60, "seconds to extract the text of one PDF page", "seconds"),
    _V("LLMKIT_MAX_PARSE_SECONDS", 120, "seconds to parse one HTML page", "seconds"),
    _V("LLMKIT_INDEX_BATCH", 1024, "chunks `rag index` embeds per batch; each batch's vectors are committed "
       "as it finishes, so an interrupted run loses at most one batch", "size"),
    # OpenAI-compatible endpoints for `rag` (llmkit.rag.endpoint)
    _V("LLMKIT_EMBED_URL", None, "embedding endpoint URL[#MODEL] a new `rag index` embeds through when no --model is "
       "given"),
    _V("LLMKIT_LLM_URL", None, "chat endpoint URL[#MODEL] for the LLM steps of `rag` when no --llm is given (before "
       "LLMKIT_MODEL)"),
    _V("LLMKIT_API_KEY", None, "key sent to those endpoints as a bearer token (default: OPENAI_API_KEY)"),
    _V("LLMKIT_ENDPOINT_SECONDS", 120, "seconds to wait for one endpoint request", "seconds"),
    _V("LLMKIT_ENDPOINT_TOKENS", 256, "tokens of a text an embedding endpoint's model reads (longer texts are cut, "
       "chunks sized to fit)", "size"),
    _V("LLMKIT_STORE_WAIT_SECONDS", 600, "seconds to wait for an embedded vector store another process has open",
       "seconds"),
]}

# Read by scripts/install.sh, not by llmkit: documented with the rest in docs/configuration.md.
INSTALL_VARIABLES = {
    "LLMKIT_VENV": "where scripts/install.sh makes the virtual environment (default <checkout>/.venv)",
    "LLMKIT_EXTRAS": "the extras scripts/install.sh installs (default all,dev)",
    "LLMKIT_CMAKE_ARGS": "CMake arguments scripts/install.sh adds to llama.cpp's build (e.g. -DGGML_AVX2=OFF)",
}

LIMITS = [name for name in VARIABLES if name.startswith("LLMKIT_MAX_") or name == "LLMKIT_STORE_WAIT_SECONDS"]
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """A positive count such as `1000`, `512M`, `2G` or `1.5GiB` (powers of 1024); ValueError otherwise."""
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)I?B?", text.strip().upper())
    value = int(float(m.group(1)) * _UNITS[m.group(2)]) if m else 0
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive number (e.g. 1000, 512M or 1.5G)")
    return value


def _raw(name: str) -> str:
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of llmkit's settings (llmkit.config.VARIABLES)")
    return os.environ.get(name, "").strip()


def text(name: str) -> str | None:
    """The variable's value, or its default when unset or empty."""
    return _raw(name) or VARIABLES[name].default


def flag(name: str) -> bool:
    """True when the variable is set to anything but empty or 0."""
    return _raw(name) not in ("", "0")


def size(name: str) -> int:
    """A numeric setting (limits, seconds): the variable parsed by `parse_size`, or its default."""
    raw = _raw(name)
    if not raw:
        return int(VARIABLES[name].default)
    try:
        return parse_size(raw)
    except ValueError:
        raise BadInput(f"{name}={os.environ[name]!r} is not a positive number (e.g. 1000 or 512M). "
                       "Fix or unset it.") from None


def cache_root() -> Path:
    """LLMKIT_CACHE, else $XDG_CACHE_HOME/llmkit, else ~/.cache/llmkit (not created here)."""
    root = _raw("LLMKIT_CACHE")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return Path(xdg or Path.home() / ".cache") / "llmkit"


def cache_dir(*parts: str) -> Path:
    """A place under the cache root (not created here)."""
    return cache_root().joinpath(*parts)


def numba_cache_dir() -> Path:
    """numba's cache directory, where compiled kernels and the libraries linked from them live:
    NUMBA_CACHE_DIR, else the cache root's numba/ (not created here)."""
    own = os.environ.get("NUMBA_CACHE_DIR", "").strip()
    return Path(own) if own else cache_dir("numba")


def library_default(name: str, value: str) -> None:
    """Set an environment variable a library reads when it loads (numba, OpenMP), unless the user set it."""
    os.environ.setdefault(name, value)


def use_numba_cache() -> Path:
    """Point numba at llmkit's cache before numba is imported; the directory."""
    d = numba_cache_dir()
    library_default("NUMBA_CACHE_DIR", str(d))
    return d


@contextmanager
def scoped_env(values: dict[str, str]):
    """Set each variable the user has not set for the block; remove exactly those afterwards.

    >>> with scoped_env({"DOCTEST_SCOPED_VAR": "1"}):
    ...     os.environ["DOCTEST_SCOPED_VAR"]
    '1'
    >>> "DOCTEST_SCOPED_VAR" in os.environ
    False
    """
    added = [n for n in values if n not in os.environ]
    for n in added:
        os.environ[n] = values[n]
    try:
        yield
    finally:
        for n in added:
            os.environ.pop(n, None)


# The caches llmkit keeps, by sub-directory: what `llmkit doctor` reports and what may be deleted at any time.
CACHES = {
    "embed": "embedding models exported to ONNX (rebuilt on next use)",
    "numba": "compiled quantizer and tokenizer kernels (recompiled on next use: seconds per kernel)",
    "quant-probes": "per-model sensitivity probes of `quant`'s size budgets",
    "iqgrid": "i-quant lattice tables read back from ggml (rebuilt on next use)",
    "bandwidth.json": "this machine's measured memory bandwidth (`kv plan`)",
    "verify-cost.json": "what verifying a batch of drafts costs each model here (`generate`'s adaptive drafting)",
    "llama-server-<version>": "llama.cpp tools built by scripts/build_llama_server.sh when the binding's wheel "
                              "has none",
}
