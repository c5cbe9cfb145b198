"""The 3-bit i-quants IQ3_XXS and IQ3_S against ggml: the grid tables read back from ggml's
dequantizer and built as iq3xs_init_impl builds them, the quantized bytes equal to ggml's own
quantizer (ggml_quantize_chunk) with and without an imatrix, decoding equal to ggml's, and whole
files equal to the `llama-quantize` binary's."""


import numpy as np
import pytest

from conftest import run_cli
from latticecases import (assert_dequantize_equals_ggml, assert_equal_ggml, assert_threads_same, hard_rows,
                          model_rows)
from quantref import binary_quantize, setup  # noqa: F401 - a module fixture

pytest.importorskip("numba")
pytest.importorskip("llama_cpp")

TYPES = ("IQ3_XXS", "IQ3_S")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("name", TYPES)
def test_bytes_equal_ggml(name, weighted, seed):
    x, qw = hard_rows(seed)
    assert_equal_ggml(name, x, qw if weighted else None)


def test_bytes_equal_ggml_real_imatrix(setup):  # noqa: F811
    """The model's own weights and llmkit's imatrix of them (what a quantization run passes), and
    the same rows without it."""
    for _, x, qw in model_rows(setup):
        for name in TYPES:
            for w in (qw, None):
                assert_equal_ggml(name, x, w)


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_equals_ggml(name):
    assert_dequantize_equals_ggml(name)


def test_bad_row_length():
    from llmkit.errors import BadInput
    from llmkit.quant.formats import get_format

    with pytest.raises(BadInput, match="multiple of 256 weights, got 320"):
        get_format("IQ3_S").quantize(np.ones((2, 320), np.float32))


def test_without_numba_one_line(monkeypatch):
    """The searches run only compiled: without numba, one line naming the extra to install."""
    import sys

    from llmkit.errors import MissingDependency
    import llmkit.quant.formats.iquants as iquants
    from llmkit.quant.formats import get_format
    from llmkit.quant.formats.iquants import iq3

    monkeypatch.setattr(iq3, "_KERNELS", None)
    monkeypatch.setitem(sys.modules, "llmkit.quant.formats.iquants._kernels_iq3", None)  # import fails
    monkeypatch.delattr(iquants, "_kernels_iq3", raising=False)
    f = get_format("IQ3_XXS")
    assert not f.compiled()
    with pytest.raises(MissingDependency, match=r"pip install 'llmkit\[quant\]'") as e:
        f.quantize(np.ones((1, 256), np.float32))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", TYPES)
def test_threads_give_the_same_bytes(name):
    assert_threads_same(name)


@pytest.mark.parametrize("size,nwant,total", [(256, 2, 22825), (512, 3, 28317)])
def test_grid_tables_built_read_back_and_cached(tmp_path, monkeypatch, size, nwant, total):
    """The grids come from ggml's dequantizer; kmap and neighbour lists as iq3xs_init_impl builds
    them (`total`: the length of ggml's neighbour array); the .npy cache written atomically and read
    back equal."""
    from llmkit.quant.formats.iquants import iq3grid

    monkeypatch.setenv("LLMKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(iq3grid, "_MEMO", {})
    grid, kmap, nbrs = iq3grid.tables(size)
    files = sorted(p.name for p in (tmp_path / "iqgrid").iterdir())
    assert files == [f"iq3grid-v1-{size}-{k}.npy" for k in ("grid", "kmap", "neighbours", "values")]
    assert len(nbrs) == total and set(np.unique(grid)) == set(range(1, 16, 2))
    vals = np.unique(iq3grid.values(size))
    assert vals.tolist() == ([4, 12, 20, 28, 36, 44, 52, 62] if size == 256 else list(range(1, 16, 2)))
    lv = grid.astype(np.int64) >> 1
    u = (lv << (3 * np.arange(4))).sum(axis=1)
    assert np.array_equal(kmap[u], np.arange(size))  # every grid point maps to itself
    # an off-grid pattern: its list holds the points at the nwant nearest distances, by (distance, index)
    for off in np.nonzero(kmap < 0)[0][::397]:
        at = -int(kmap[off]) - 1
        lst = nbrs[at + 1:at + 1 + nbrs[at]].astype(np.int64)
        pos = 2 * ((int(off) >> (3 * np.arange(4))) & 7) + 1
        d2 = ((grid.astype(np.int64) - pos) ** 2).sum(axis=1)
        keep = np.nonzero(d2 <= np.unique(d2)[nwant - 1])[0]
        assert np.array_equal(lst, keep[np.lexsort((keep, d2[keep]))])
    monkeypatch.setattr(iq3grid, "_MEMO", {})
    again = iq3grid.tables(size)
    assert all(np.array_equal(a, b) for a, b in zip(again, (grid, kmap, nbrs)))


@pytest.mark.parametrize("ftype,imx", [("IQ3_XXS", "gguf"), ("IQ3_S", "gguf"), ("IQ3_S", None), ("IQ3_M", "gguf"),
                                       ("IQ3_XS", "gguf")])
def test_same_file_as_the_llama_quantize_binary(setup, ftype, imx):  # noqa: F811
    """Whole files, header and metadata included."""
    d, base, imx_gguf, _ = setup
    path = imx_gguf if imx else None
    ref, ours = d / f"bin-{ftype}-{imx}.gguf", d / f"ours-{ftype}-{imx}.gguf"
    binary_quantize(base, ref, ftype, path)
    r = run_cli(["quant", str(base),"--type", ftype, "-o", str(ours)] + (["--imatrix", str(path)] if path else []))
    assert r.exit_code == 0, r.stderr
    assert ours.read_bytes() == ref.read_bytes(), f"{ftype} (imatrix {imx}) differs from llama-quantize"
    from llmkit.gguf.reader import read_gguf

    kinds = {t.type_name for t in read_gguf(str(ours)).tensors}
    assert {"IQ3_XXS" if ftype in ("IQ3_XXS", "IQ3_XS") else "IQ3_S"} <= kinds, kinds
