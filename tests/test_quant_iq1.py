"""The 1-bit i-quants IQ1_S and IQ1_M against ggml: the quantized bytes equal to ggml's own
quantizer (ggml_quantize_chunk) with an imatrix (and IQ1_M's kernel without one, a path ggml has
but llama.cpp never takes), decoding equal to ggml's, the refusal without an imatrix, and whole
files equal to the `llama-quantize` binary's. The 2048-point grid is iq2grid.py's (tested there)."""

import threading

import numpy as np
import pytest

from conftest import run_cli
from test_quant_binary import binary_quantize, setup, tools  # noqa: F401 - pytest fixtures

pytest.importorskip("numba")
pytest.importorskip("llama_cpp")

TYPES = ("IQ1_S", "IQ1_M")


def hard_rows(seed: int, n_rows: int = 48, n: int = 512):
    """Gaussian rows with outliers, exact zeros, all-zero sub-blocks, tiny, one-signed rows and rows
    of many equal values (the sort's ties); heavy-tailed importance weights, some zero."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, n)).astype(np.float32) * np.float32(0.02)
    x[rng.random(x.shape) < 0.01] *= 30  # outliers
    x[rng.random(x.shape) < 0.02] = 0
    x[1, 32:64] = 0  # one zero sub-block
    x[2, 256:512] = 0  # one zero super-block
    x[3, :256] = np.float32(1e-13) * rng.standard_normal(256).astype(np.float32)  # below both epsilons
    x[4] = np.abs(x[4])
    x[5] = -np.abs(x[5])
    x[6] = np.round(x[6] * 100)  # many equal values: the order of ties decides the split
    x[7, ::2] = np.float32(-0.0)
    qw = (rng.lognormal(0, 1.5, n) ** 2).astype(np.float32)
    qw[rng.random(n) < 0.03] = 0
    return x, qw


def _check(name, x, qw):
    from llmkit.quant.formats import get_format, ggml_lib

    f = get_format(name)
    ours = f.quantize(x, qw)
    ref = ggml_lib.quantize(f.type_id, x, qw)
    assert ours.shape == ref.shape == (len(x), x.shape[1] // 256 * f.type_size)
    bad = np.nonzero((ours != ref).any(axis=1))[0]
    assert len(bad) == 0, f"{name}: rows {bad[:8]} differ from ggml"


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", TYPES)
def test_bytes_equal_ggml(name, seed):
    _check(name, *hard_rows(seed))


@pytest.mark.parametrize("name", TYPES)
def test_bytes_equal_ggml_wide_rows_flat_imatrix(name):
    """4096-wide rows (16 super-blocks each with its own imatrix slice) and a flat imatrix of ones."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((6, 4096)) * rng.lognormal(0, 1, 4096)).astype(np.float32)
    _check(name, x, np.ones(4096, np.float32))


def test_bytes_equal_ggml_real_imatrix(setup):  # noqa: F811
    """The model's own weights and llmkit's imatrix of them (what a quantization run passes)."""
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.calibration.imatrix import load_imatrix
    from llmkit.quant.formats.base import load_f32

    d, base, imx, _ = setup
    g, imatrix = read_gguf(str(base)), load_imatrix(str(imx))
    infos = {t.name: t for t in g.tensors}
    with open(base, "rb") as fh:
        for tname in ("blk.0.ffn_down.weight", "blk.1.attn_q.weight"):
            x = load_f32(fh, infos[tname], g.data_offset)
            for name in TYPES:
                _check(name, x, np.asarray(imatrix[tname], np.float32))


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
    """On quantized rows and on random blocks (every index, shift, and scale code; finite d)."""
    from llmkit.quant.formats import get_format, ggml_lib

    f = get_format(name)
    x, qw = hard_rows(7, n_rows=8)
    q = f.quantize(x, qw).reshape(-1)
    assert np.array_equal(f.dequantize(q, x.size), ggml_lib.dequantize(f.type_id, q, x.size))
    rng = np.random.default_rng(3)
    b = rng.integers(0, 256, (64, f.type_size), dtype=np.uint8)
    if name == "IQ1_S":
        b[:, 1] &= 0x3F  # |d| < 2: finite halves
    else:
        b[:, 55] &= 0x3F  # the top nibble of the spread super-scale
    n = 64 * 256
    assert np.array_equal(f.dequantize(b.reshape(-1), n), ggml_lib.dequantize(f.type_id, b, n))


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


def test_threads_give_the_same_bytes():
    """The write layer quantizes row slices from several threads at once (the kernels release the GIL)."""
    from llmkit.quant.formats import get_format

    for name in TYPES:
        f = get_format(name)
        x, qw = hard_rows(5, n_rows=64)
        want = f.quantize(x, qw)
        got = [None] * 4

        def work(i):
            got[i] = f.quantize(x[16 * i:16 * (i + 1)], qw)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert np.array_equal(np.concatenate(got), want)


@pytest.mark.parametrize("ftype", TYPES)
def test_same_file_as_the_llama_quantize_binary(tools, setup, ftype):  # noqa: F811
    """Whole files with an imatrix, header and metadata included."""
    from llmkit.gguf.reader import read_gguf

    d, base, imx, _ = setup
    ref, ours = d / f"bin-{ftype}.gguf", d / f"ours-{ftype}.gguf"
    binary_quantize(tools, base, ref, ftype, imx)
    r = run_cli(["quant", str(base), "-t", ftype, "-o", str(ours), "--imatrix", str(imx)])
    assert r.exit_code == 0, r.stderr
    assert ours.read_bytes() == ref.read_bytes(), f"{ftype} differs from llama-quantize"
    assert ftype in {t.type_name for t in read_gguf(str(ours)).tensors}
