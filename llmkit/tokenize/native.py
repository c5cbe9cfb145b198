"""Loading the compiled tokenizer kernels (`bpe._bpe_kernels`, `training._train_kernels` and
`training._bpe_train_kernels`) without paying numba's start-up on every run.

The kernels are numba `cfunc`s that allocate nothing. The first use compiles them (numba, a few
seconds), links their machine code into one shared library in numba's cache directory and loads
it; later processes load that library with ctypes and never import numba or numpy. Without a
linker the compiled functions are called through numba directly (same code, numba's start-up on
every run); without numba, or with LLMKIT_NO_JIT=1, `kernels()` is None and the encoders keep
their pure-Python path. docs/design/tokenizers.md says why (start-up against tiktoken's).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_LOCK = threading.Lock()
_KERNELS: object = None
_FAILED = False
C = ctypes
_ARGTYPES = {
    "build_pairs": [C.c_void_p] * 3 + [C.c_int64, C.c_void_p, C.c_void_p, C.c_int64],
    "build_vocab": [C.c_void_p, C.c_void_p, C.c_int64, C.c_void_p, C.c_int64],
    "encode_lines": [C.c_void_p, C.c_void_p, C.c_int64, C.c_int64,
                     C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p, C.c_int64, C.c_void_p, C.c_int64,
                     C.c_void_p, C.c_void_p, C.c_int64, C.c_void_p, C.c_int64, C.c_int64,
                     C.c_void_p, C.c_void_p, C.c_int64, C.c_void_p, C.c_int64, C.c_void_p, C.c_int64,
                     C.c_void_p,
                     C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p, C.c_int64],
    "format_ids": [C.c_void_p, C.c_void_p, C.c_int64, C.c_void_p, C.c_int64],
    "count_words": [C.c_void_p, C.c_int64, C.c_int64, C.c_int64, C.c_int64, C.c_void_p, C.c_void_p, C.c_void_p,
                    C.c_int64, C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p],
    "rehash_words": [C.c_void_p, C.c_int64, C.c_void_p, C.c_int64],
    "wp_run": [C.c_void_p] * 33 + [C.c_int64],
    "rehash_pairs": [C.c_void_p, C.c_void_p, C.c_int64, C.c_void_p, C.c_void_p, C.c_int64],
    "bpe_run": [C.c_void_p] * 26 + [C.c_int64],
}
# the kernels' sources (beside the algorithms that use them), hashed in this order into the library's name
MODULES = ("bpe/_bpe_kernels", "training/_train_kernels", "training/_bpe_train_kernels")


class Kernels:
    """The kernels as ctypes functions (ctypes releases the GIL while they run)."""

    def __init__(self, addresses: dict[str, int], keep=None, source: str = ""):
        self._keep = keep  # the library or the numba objects the addresses point into
        self.source = source  # "library" (linked once, loaded with ctypes) or "numba"
        for name, types in _ARGTYPES.items():
            f = C.CFUNCTYPE(C.c_int64, *types)(addresses[name])
            setattr(self, name, f)


def cache_dir() -> Path:
    """numba's cache directory (llmkit.config decides it)."""
    from llmkit import native as shared

    return shared.cache_dir()


def _key() -> str:
    """Names the library: the kernels' source, this Python and this machine's architecture."""
    from llmkit import native as shared

    return shared.source_key([_HERE / f"{m}.py" for m in MODULES])


COMPILE_AT_BYTES = 16 << 20  # from about this much text, compiling pays off (docs/design/tokenizers.md)


def kernels(work_bytes: int = 0) -> Kernels | None:
    """The compiled kernels, or None: no numba, LLMKIT_NO_JIT=1, compiling failed, or they are not
    compiled yet and `work_bytes` of text would not repay compiling them (LLMKIT_JIT=1 always does)."""
    global _KERNELS, _FAILED
    from llmkit import config

    if config.flag("LLMKIT_NO_JIT"):
        return None
    if _KERNELS is not None or _FAILED:
        return _KERNELS
    with _LOCK:
        if _KERNELS is None and not _FAILED:
            _KERNELS = _load_library()
            if _KERNELS is None and (work_bytes >= COMPILE_AT_BYTES or config.flag("LLMKIT_JIT")):
                try:
                    _KERNELS = _compile()
                except Exception:  # noqa: BLE001 - any failure to compile leaves the Python path, same ids
                    _KERNELS = None
                _FAILED = _KERNELS is None
    return _KERNELS


def _load_library() -> Kernels | None:
    from llmkit import native as shared

    loaded = shared.load("tokenize-kernels", _key(), _ARGTYPES)
    if loaded is None:
        return None
    lib, funcs = loaded
    return Kernels({k: C.cast(f, C.c_void_p).value for k, f in funcs.items()}, (lib, funcs), "library")


def _compile() -> Kernels | None:
    """Compile with numba; link a library for the next processes when a linker is at hand."""
    from llmkit.config import use_numba_cache

    use_numba_cache()
    import importlib

    # Imported by name from MODULES, as quant's jit.load_kernels does: the kernel modules stay private
    # to their packages, and the source files hashed for the library key are the ones compiled.
    try:
        mods = [importlib.import_module("llmkit.tokenize." + m.replace("/", ".")) for m in MODULES]
    except ImportError:
        return None
    kernels = {name: f for mod in mods for name, f in mod.KERNELS.items()}
    _link(kernels)
    lib = _load_library()
    if lib is not None:
        return lib
    return Kernels({k: f.address for k, f in kernels.items()}, kernels, "numba")


def build() -> bool:
    """Compile the kernels and link the library now, whatever the input size; False when no library
    could be linked (no numba or no C compiler)."""
    global _KERNELS, _FAILED
    k = _compile()
    with _LOCK:
        _KERNELS, _FAILED = k, k is None
    return k is not None and k.source == "library"


def _link(kernels: dict) -> None:
    """Write tokenize-kernels-<key>.so into the cache (llmkit.native.link), removing older libraries;
    silently skip on failure (no linker: numba runs the kernels)."""
    from llmkit import native as shared

    shared.link("tokenize-kernels", _key(), kernels, old_names=("tokenize-bpe",))


# -- the Unicode class table --------------------------------------------------------------------------
_CLASSES: bytes | None = None
_BERT_CLASSES: bytes | None = None


def class_table() -> bytes:
    """One byte per code point: 1 letter (\\p{L}), 2 number (\\p{N}), 4 whitespace (\\s), as HF tokenizers'
    regex engine defines them (`unicode_classes`, which the Python pre-tokenizers read too)."""
    global _CLASSES
    if _CLASSES is None:
        from llmkit.tokenize import unicode_classes

        _CLASSES = unicode_classes.table()
    return _CLASSES


def bert_class_table() -> bytes:
    """One byte per code point for BERT's normalizer and pre-tokenizer (pretok's own patterns):
    1 whitespace, 2 dropped (control, unassigned), 4 CJK ideograph, 8 punctuation."""
    global _BERT_CLASSES
    if _BERT_CLASSES is None:
        from llmkit.tokenize import pretok

        _BERT_CLASSES = _table("bert", ((1, pretok._WS_PAT), (2, pretok._CONTROL_PAT), (4, pretok._CJK_PAT),
                                        (8, f"[{pretok._PUNCT}]")))
    return _BERT_CLASSES


def _table(name: str, bits) -> bytes:
    """A code point -> class bits table from `regex` patterns, read from the cache when there."""
    import regex

    path = cache_dir() / f"tokenize-{name}-{regex.__version__}-{sys.version_info[0]}{sys.version_info[1]}.bin"
    try:
        data = path.read_bytes()
        if len(data) == 0x110000:
            return data
    except OSError:
        pass
    every = "".join(map(chr, range(0x110000)))
    table = bytearray(0x110000)
    for bit, pat in bits:
        for m in regex.finditer(pat, every):
            table[m.start()] |= bit
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        from llmkit.io import atomic_write_bytes

        atomic_write_bytes(str(path), bytes(table))
    except (OSError, ImportError):
        pass
    return bytes(table)
