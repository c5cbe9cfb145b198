"""The 1-bit i-quants IQ1_S and IQ1_M against ggml: the quantized bytes equal to ggml's own
quantizer (ggml_quantize_chunk) with an imatrix (and IQ1_M's kernel without one, a path ggml has
but llama.cpp never takes), decoding equal to ggml's, the refusal without an imatrix, and whole
files equal to the `llama-quantize` binary's. The 2048-point grid is iq2grid.py's (tested there)."""


import numpy as np
import pytest

from conftest import run_cli
from latticecases import (assert_dequantize_equals_ggml, assert_equal_ggml, assert_threads_same, hard_rows,
                          model_rows)
from quantref import binary_quantize, setup  # noqa: F401 - a module fixture

pytest.importorskip("numba")
pytest.importorskip("llama_cpp")

TYPES = ("IQ1_S", "IQ1_M")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", TYPES)
def test_bytes_equal_ggml(name, seed):
    assert_equal_ggml(name, *hard_rows(seed))


@pytest.mark.parametrize("name", TYPES)
def test_bytes_equal_ggml_wide_rows_flat_imatrix(name):
    """4096-wide rows (16 super-blocks each with its own imatrix slice) and a flat imatrix of ones."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((6, 4096)) * rng.lognormal(0, 1, 4096)).astype(np.float32)
    assert_equal_ggml(name, x, np.ones(4096, np.float32))


def test_bytes_equal_ggml_real_imatrix(setup):  # noqa: F811
    """The model's own weights and llmkit's imatrix of them (what a quantization run passes)."""
    for _, x, qw in model_rows(setup):
        for name in TYPES:
            assert_equal_ggml(name, x, qw)


def test_iq1_m_kernel_without_imatrix_equals_ggml():
    """ggml's IQ1_M also runs without column weights (x^2); llama.cpp refuses the type without an
    imatrix, so llmkit does too, but the kernel's path is kept equal."""
    from llmkit.quant.formats import get_format, ggml_lib

    f = get_format("IQ1_M")
    for seed in (0, 1):
        x, _ = hard_rows(seed)
        out = np.empty((x.size // 256, f.type_size), np.uint8)
        f.kernel_module().iq1_m(x.reshape(-1, 256), np.zeros((1, 256), np.float32), False, *f.tables(), out)
        assert np.array_equal(out.reshape(len(x), -1), ggml_lib.quantize(f.type_id, x))


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_equals_ggml(name):
    assert_dequantize_equals_ggml(name, 1 if name == "IQ1_S" else 55)  # IQ1_M spreads its scale: the top nibble


@pytest.mark.parametrize("name", TYPES)
def test_refused_without_imatrix(name):
    from llmkit.errors import BadInput
    from llmkit.quant.formats import get_format

    with pytest.raises(BadInput, match="needs an importance matrix") as e:
        get_format(name).quantize(np.ones((1, 256), np.float32))
    assert "\n" not in str(e.value)


def test_iq1_m_scale_overflow_refused():
    """IQ1_M's super-scale is spread over four nibbles; a scale beyond fp16 is refused like ggml's validation."""
    from llmkit.errors import BadInput
    from llmkit.quant.formats import get_format

    f = get_format("IQ1_M")
    x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32) * np.float32(1e6)
    with pytest.raises(BadInput, match="beyond fp16"):
        f.check(f.quantize(x, np.ones(256, np.float32)), "t")


@pytest.mark.parametrize("name", TYPES)
def test_threads_give_the_same_bytes(name):
    assert_threads_same(name)


@pytest.mark.parametrize("ftype", TYPES)
def test_same_file_as_the_llama_quantize_binary(setup, ftype):  # noqa: F811
    """Whole files with an imatrix, header and metadata included."""
    from llmkit.gguf.reader import read_gguf

    d, base, imx, _ = setup
    ref, ours = d / f"bin-{ftype}.gguf", d / f"ours-{ftype}.gguf"
    binary_quantize(base, ref, ftype, imx)
    r = run_cli(["quant", str(base),"--type", ftype, "-o", str(ours), "--imatrix", str(imx)])
    assert r.exit_code == 0, r.stderr
    assert ours.read_bytes() == ref.read_bytes(), f"{ftype} differs from llama-quantize"
    assert ftype in {t.type_name for t in read_gguf(str(ours)).tensors}
