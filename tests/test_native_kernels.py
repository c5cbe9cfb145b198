"""The linked kernel libraries (llmkit.native): the plain quantizers' library gives ggml's bytes, a
quantize run with it imports no numba and writes llama-quantize's file, and `python -m llmkit.build_native`
builds both libraries into an empty cache."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import llmkit_env
from quantref import awkward_rows, binary_quantize

pytest.importorskip("numba")
pytest.importorskip("llama_cpp")

PLAIN = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache directory holding both libraries, built by the command the install script runs."""
    cache = tmp_path_factory.mktemp("numba-cache")
    p = subprocess.run([sys.executable, "-m", "llmkit.build_native"], capture_output=True, text=True, timeout=600,
                       env=llmkit_env(NUMBA_CACHE_DIR=str(cache)))
    assert p.returncode == 0, p.stderr
    return cache


def _in_child(cache, code: str) -> dict:
    """Run `code` in a fresh interpreter using the libraries in `cache`; it prints one JSON object."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env=llmkit_env(NUMBA_CACHE_DIR=str(cache)))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_both_libraries_are_built(built):
    names = sorted(f.name.rsplit("-", 1)[0] for f in built.glob("*.so"))
    assert names == ["quant-kernels", "tokenize-kernels"]


def test_library_bytes_equal_ggml_and_the_numpy_definition(built, tmp_path):
    """Every plain type on rows that catch rounding and scale mistakes; F16 reading with its Inf/NaN count."""
    x = awkward_rows(64, np.random.default_rng(3))
    np.save(tmp_path / "x.npy", x)
    got = _in_child(built, f"""
import json, sys, numpy as np
from llmkit.quant.formats import get_format, native, ggml_lib
x = np.load({str(tmp_path / 'x.npy')!r})
out = {{}}
for name in {PLAIN!r}:
    f = get_format(name)
    lib = native.run(name.lower(), x, f.type_size).reshape(len(x), -1)
    with np.errstate(all="ignore"):
        numpy_path = f.quantize_blocks(x.reshape(-1, 32)).reshape(len(x), -1)
    out[name] = [bool(np.array_equal(lib, ggml_lib.quantize(f.type_id, x))), bool(np.array_equal(lib, numpy_path))]
h = np.concatenate([x.reshape(-1).astype(np.float16), np.array([np.inf, -np.inf, np.nan], np.float16)])
rows, bad = native.f16_rows(h.view(np.uint8), h.size, native.f16_table())
out["f16"] = [bool(np.array_equal(rows.reshape(-1).view(np.uint32), h.astype(np.float32).view(np.uint32))),
             bad == int((~np.isfinite(h)).sum()), bad >= 3]
out["numba"] = "numba" in sys.modules
print(json.dumps(out))
""")
    assert got.pop("numba") is False  # the library is loaded with ctypes alone
    assert got.pop("f16") == [True, True, True]  # the rows' values beyond fp16 count too
    assert got == {name: [True, True] for name in PLAIN}


def test_a_plain_run_imports_no_numba_and_equals_llama_quantize(built, tmp_path):
    """An F16 model to Q4_0 (F16 read by the library, Q4_0 by the library, the output matrix's Q6_K in
    numpy): the same file as llama-quantize, and numba never imported."""
    from ggufmake import write_tiny_llama

    src, ref, ours = tmp_path / "f16.gguf", tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    write_tiny_llama(src, n_embd=256, n_ff=512, n_layer=2, dtype=np.float16, seed=4)
    binary_quantize(src, ref, "Q4_0")
    got = _in_child(built, f"""
import json, sys
from llmkit.cli import main
try:
    main(["quant", {str(src)!r}, "--type", "Q4_0", "-o", {str(ours)!r}, "-t", "2"])
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps({{"numba": "numba" in sys.modules}}))
""")
    assert got == {"numba": False}
    assert ours.read_bytes() == ref.read_bytes()
