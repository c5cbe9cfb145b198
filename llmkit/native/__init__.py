"""Shared libraries linked from numba `cfunc`s, so that later processes load compiled kernels with
ctypes in milliseconds and never import numba (whose import alone is ~0.4 s).

A kernel module defines C-callable cfuncs over raw pointers that allocate nothing. `link` takes
their LLVM modules, links them into one object with inert definitions of the few numba runtime
symbols that only a cfunc wrapper's exception path references, and has the system C compiler driver
(`cc -shared`) write `<name>-<key>.so` and a symbol table into numba's cache directory; `load` opens
that library and returns the kernels as ctypes functions (which release the GIL while they run).
The key names the kernels' source, the Python and the machine, so a new source builds a new library
and the old one is deleted. Used by the tokenizers' and the plain quantizers' `native` modules, which
import this one (never the reverse); `llmkit.build_native`, what scripts/install.sh runs, builds both.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import zlib
from pathlib import Path

_STUBS = """
define weak void @numba_gil_ensure(i8* %p) { ret void }
define weak void @numba_gil_release(i8* %p) { ret void }
define weak void @NRT_MemInfo_call_dtor(i8* %p) { ret void }
define weak void @NRT_Free(i8* %p) { ret void }
define weak i32 @numba_do_raise(i8* %p) { ret i32 0 }
define weak i8* @numba_runtime_build_excinfo_struct(i8* %p, i8* %q) { ret i8* null }
define weak i8* @numba_unpickle(i8* %p, i32 %n, i8* %h) { ret i8* null }
"""


def cache_dir() -> Path:
    """numba's cache directory, where the libraries live (llmkit.config decides it)."""
    from llmkit.config import numba_cache_dir

    return numba_cache_dir()


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo, plus "avx512" when any AVX-512 flag is there (empty
    where there is none to read: nothing to compare)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    if any(x.startswith("avx512") for x in flags):
                        flags.add("avx512")
                    return flags
    except OSError:
        pass
    return set()


def source_key(sources: list[Path]) -> str:
    """The key of a library built from `sources` for this Python and machine (CRCs, not a
    cryptographic hash: loading must stay cheap)."""
    src = b"".join(p.read_bytes() for p in sources)
    where = f"{sys.version}|{os.uname().machine if hasattr(os, 'uname') else ''}|{sys.platform}".encode()
    return f"{zlib.crc32(src):08x}{zlib.crc32(where):08x}{len(src):x}"


def load(name: str, key: str, argtypes: dict[str, list]) -> tuple[ctypes.CDLL, dict[str, object]] | None:
    """(library, {kernel: ctypes function returning int64}) of `name`-`key`.so, or None when it is not
    built (or cannot be loaded)."""
    base = cache_dir() / f"{name}-{key}"
    so, names = base.with_suffix(".so"), base.with_suffix(".json")
    if not (so.exists() and names.exists()):
        return None
    try:
        lib = ctypes.CDLL(str(so))
        table = json.loads(names.read_text())
        funcs = {k: ctypes.CFUNCTYPE(ctypes.c_int64, *types)(ctypes.cast(lib[table[k]], ctypes.c_void_p).value)
                 for k, types in argtypes.items()}
        return lib, funcs
    except (OSError, ValueError, KeyError, AttributeError):
        return None


def link(name: str, key: str, cfuncs: dict, old_names: tuple[str, ...] = ()) -> bool:
    """Write `name`-`key`.so (and its symbol table) from numba cfuncs, removing libraries of other keys
    (and any named `old_names`-*); False on failure (no linker): numba then runs the kernels itself."""
    import subprocess
    import tempfile

    import llvmlite.binding as ll

    try:
        target = ll.Target.from_default_triple()
        tm = target.create_target_machine(reloc="pic", codemodel="default", opt=3)
        module = ll.parse_assembly(_STUBS)
        names = {}
        for kernel, f in cfuncs.items():
            native_name, code = _machine_module(f)
            module.link_in(ll.parse_bitcode(code))
            names[kernel] = native_name
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        base = d / f"{name}-{key}"
        with tempfile.TemporaryDirectory(dir=d) as tmp:
            obj = Path(tmp) / "k.o"
            obj.write_bytes(tm.emit_object(module))
            so = Path(tmp) / "k.so"
            cc = os.environ.get("CC") or "cc"
            subprocess.run([cc, "-shared", "-o", str(so), str(obj)], check=True, capture_output=True, timeout=120)
            table = Path(tmp) / "k.json"
            table.write_text(json.dumps(names))
            os.replace(so, base.with_suffix(".so"))
            os.replace(table, base.with_suffix(".json"))
        for pattern in (name, *old_names):
            for old in d.glob(f"{pattern}-*"):
                if not old.name.startswith(base.name):
                    old.unlink(missing_ok=True)
        return True
    except (OSError, subprocess.SubprocessError, RuntimeError):
        return False


def _machine_module(f) -> tuple[str, bytes]:
    """(symbol, LLVM bitcode) of a cfunc's whole module; one that numba loaded from its cache holds
    only machine code, so it is compiled again here without the cache."""
    from numba import cfunc

    module = f._library._final_module
    if any(fn.name == f.native_name and not fn.is_declaration for fn in module.functions):
        return f.native_name, module.as_bitcode()
    fresh = cfunc(f._sig, error_model="numpy")(f._pyfunc)
    return fresh.native_name, fresh._library._final_module.as_bitcode()
