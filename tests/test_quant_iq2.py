"""The 2-bit i-quants IQ2_XXS, IQ2_XS and IQ2_S against ggml: the grid tables read back from ggml's
dequantizer, the quantized bytes equal to ggml's own quantizer (ggml_quantize_chunk) row for row,
decoding equal to ggml's, and whole files equal to the `llama-quantize` binary's."""

import subprocess
import threading

import numpy as np
import pytest

from conftest import run_cli
from test_quant_binary import setup, tools  # noqa: F401 - pytest fixtures

pytest.importorskip("numba")
pytest.importorskip("llama_cpp")

TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S")


def hard_rows(seed: int, n_rows: int = 48, n: int = 512):
    """Gaussian rows with outliers, exact zeros, an all-zero sub-block and super-block, tiny values;
    and importance weights like an imatrix's (mean squared activations: heavy-tailed, some zero)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, n)).astype(np.float32) * np.float32(0.02)
    x[rng.random(x.shape) < 0.01] *= 30  # outliers
    x[rng.random(x.shape) < 0.02] = 0
    x[1, 32:48] = 0  # one zero sub-block
    x[2, 256:512] = 0  # one zero super-block
    x[3, :256] = np.float32(1e-9) * rng.standard_normal(256).astype(np.float32)  # below ggml's group epsilon
    x[4] = np.abs(x[4])
    x[5] = -np.abs(x[5])  # every sign flipped: odd counts in most groups
    qw = (rng.lognormal(0, 1.5, n) ** 2).astype(np.float32)
    qw[rng.random(n) < 0.03] = 0
    return x, qw


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", TYPES)
def test_bytes_equal_ggml_with_imatrix(name, seed):
    from llmkit.quant.formats import get_format, ggml_lib

    f = get_format(name)
    x, qw = hard_rows(seed)
    ours = f.quantize(x, qw)
    ref = ggml_lib.quantize(f.type_id, x, qw)
    assert ours.shape == ref.shape == (len(x), 2 * f.type_size)
    bad = np.nonzero((ours != ref).any(axis=1))[0]
    assert len(bad) == 0, f"{name}: rows {bad[:8]} differ from ggml"


def test_bytes_equal_ggml_real_imatrix(setup):  # noqa: F811
    """The model's own weights and llmkit's imatrix of them (what a quantization run passes)."""
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.calibration.imatrix import load_imatrix
    from llmkit.quant.formats import get_format, ggml_lib
    from llmkit.quant.formats.base import load_f32

    d, base, imx, _ = setup
    g, imatrix = read_gguf(str(base)), load_imatrix(str(imx))
    infos = {t.name: t for t in g.tensors}
    with open(base, "rb") as fh:
        for tname in ("blk.0.ffn_down.weight", "blk.1.attn_q.weight"):
            x = load_f32(fh, infos[tname], g.data_offset)
            qw = np.asarray(imatrix[tname], np.float32)
            for name in TYPES:
                f = get_format(name)
                assert np.array_equal(f.quantize(x, qw), ggml_lib.quantize(f.type_id, x, qw)), (name, tname)


def test_iq2_s_without_imatrix_equals_ggml():
    """IQ2_S alone has a path without column weights (llama.cpp takes it for a token embedding)."""
    from llmkit.quant.formats import get_format, ggml_lib

    f = get_format("IQ2_S")
    for seed in (0, 1):
        x, _ = hard_rows(seed)
        assert np.array_equal(f.quantize(x), ggml_lib.quantize(f.type_id, x))


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_equals_ggml(name):
    """On quantized rows and on random blocks (every index, sign and scale code; finite d)."""
    from llmkit.quant.formats import get_format, ggml_lib

    f = get_format(name)
    x, qw = hard_rows(7, n_rows=8)
    q = f.quantize(x, qw).reshape(-1)
    assert np.array_equal(f.dequantize(q, x.size), ggml_lib.dequantize(f.type_id, q, x.size))
    rng = np.random.default_rng(3)
    b = rng.integers(0, 256, (64, f.type_size), dtype=np.uint8)
    b[:, 1] &= 0x3F  # |d| < 2: finite halves
    n = 64 * 256
    assert np.array_equal(f.dequantize(b.reshape(-1), n), ggml_lib.dequantize(f.type_id, b, n))


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ2_XS"])
def test_refused_without_imatrix(name):
    from llmkit.errors import BadInput
    from llmkit.quant.formats import get_format

    with pytest.raises(BadInput, match="needs an importance matrix") as e:
        get_format(name).quantize(np.ones((1, 256), np.float32))
    assert "\n" not in str(e.value)


def test_threads_give_the_same_bytes():
    """The write layer quantizes row slices from several threads at once (the kernels release the GIL)."""
    from llmkit.quant.formats import get_format

    f = get_format("IQ2_XS")
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


def test_grid_tables_built_read_back_and_cached(tmp_path, monkeypatch):
    """The grids come from ggml's dequantizer; kmap and neighbour lists as iq2xs_init_impl builds
    them; the .npy cache written atomically and read back equal."""
    from llmkit.quant.formats import iq2grid

    monkeypatch.setenv("LLMKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(iq2grid, "_MEMO", {})
    grid, kmap, nbrs = iq2grid.tables(256)
    files = sorted(p.name for p in (tmp_path / "iqgrid").iterdir())
    assert files == [f"iq2grid-v1-256-{k}.npy" for k in ("grid", "kmap", "neighbours", "values")]
    assert set(np.unique(iq2grid.values(256))) == {8, 25, 43} and set(np.unique(grid)) == {1, 3, 5}
    lv = grid.astype(np.int64) >> 1
    u = (lv << (2 * np.arange(8))).sum(axis=1)
    assert np.array_equal(kmap[u], np.arange(256))  # every grid point maps to itself
    # an off-grid pattern: its list holds the points at the 2 nearest distances, by (distance, index)
    off = int(np.nonzero(kmap < 0)[0][100])
    at = -int(kmap[off]) - 1
    lst = nbrs[at + 1:at + 1 + nbrs[at]].astype(np.int64)
    pos = 2 * ((off >> (2 * np.arange(8))) & 3) + 1
    d2 = ((grid.astype(np.int64) - pos) ** 2).sum(axis=1)
    keep = np.nonzero(d2 <= np.unique(d2)[1])[0]
    assert np.array_equal(lst, keep[np.lexsort((keep, d2[keep]))])
    monkeypatch.setattr(iq2grid, "_MEMO", {})
    again = iq2grid.tables(256)
    assert all(np.array_equal(a, b) for a, b in zip(again, (grid, kmap, nbrs)))
    assert iq2grid.signs_table()[3] == 3 and iq2grid.signs_table()[1] == 129


@pytest.mark.parametrize("ftype,pure", [("IQ2_XXS", False), ("IQ2_XS", False), ("IQ2_S", False), ("IQ2_M", False),
                                        ("IQ2_M", True)])
def test_same_file_as_the_llama_quantize_binary(tools, setup, ftype, pure):  # noqa: F811
    """Whole files with an imatrix, header and metadata included. The IQ2_S tensors come from the
    IQ2_M file type; with --pure every tensor is IQ2_S, the token embedding (which the imatrix
    lacks) by IQ2_S's path without column weights."""
    d, base, imx, _ = setup
    flag = ["--pure"] if pure else []
    ref, ours = d / f"bin-{ftype}-{pure}.gguf", d / f"ours-{ftype}-{pure}.gguf"
    p = subprocess.run([str(tools / "llama-quantize"), *flag, "--imatrix", str(imx), str(base), str(ref), ftype, "2"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    r = run_cli(["quant", str(base), "-t", ftype, "-o", str(ours), "--imatrix", str(imx), *flag])
    assert r.exit_code == 0, r.stderr
    assert ours.read_bytes() == ref.read_bytes(), f"{ftype} (pure: {pure}) differs from llama-quantize"
    if pure:
        from llmkit.gguf.reader import read_gguf

        assert {t.type_name for t in read_gguf(str(ours)).tensors} == {"IQ2_S", "F32"}
