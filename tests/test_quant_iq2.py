"""The 2-bit i-quants IQ2_XXS, IQ2_XS and IQ2_S against ggml: the grid tables read back from ggml's
dequantizer, the quantized bytes equal to ggml's own quantizer (ggml_quantize_chunk) row for row,
decoding equal to ggml's, and whole files equal to the `llama-quantize` binary's."""


import numpy as np
import pytest

from conftest import run_cli, run_subprocess
from latticecases import (assert_dequantize_equals_ggml, assert_equal_ggml, assert_threads_same, hard_rows,
                          model_rows)
from quantref import binary_quantize, setup  # noqa: F401 - a module fixture

pytest.importorskip("numba")
pytest.importorskip("llama_cpp")

TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", TYPES)
def test_bytes_equal_ggml_with_imatrix(name, seed):
    assert_equal_ggml(name, *hard_rows(seed))


def test_bytes_equal_ggml_real_imatrix(setup):  # noqa: F811
    """The model's own weights and llmkit's imatrix of them (what a quantization run passes)."""
    for _, x, qw in model_rows(setup):
        for name in TYPES:
            assert_equal_ggml(name, x, qw)


def test_iq2_s_without_imatrix_equals_ggml():
    """IQ2_S alone has a path without column weights (llama.cpp takes it for a token embedding)."""
    from llmkit.quant.formats import get_format, ggml_lib

    f = get_format("IQ2_S")
    for seed in (0, 1):
        x, _ = hard_rows(seed)
        assert np.array_equal(f.quantize(x), ggml_lib.quantize(f.type_id, x))


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_equals_ggml(name):
    assert_dequantize_equals_ggml(name)


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ2_XS"])
def test_refused_without_imatrix(name):
    from llmkit.errors import BadInput
    from llmkit.quant.formats import get_format

    with pytest.raises(BadInput, match="needs an importance matrix") as e:
        get_format(name).quantize(np.ones((1, 256), np.float32))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", TYPES)
def test_threads_give_the_same_bytes(name):
    assert_threads_same(name)


def test_grid_tables_built_read_back_and_cached(tmp_path, monkeypatch):
    """The grids come from ggml's dequantizer; kmap and neighbour lists as iq2xs_init_impl builds
    them; the .npy cache written atomically and read back equal."""
    from llmkit.quant.formats.iquants import iq2grid

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
def test_same_file_as_the_llama_quantize_binary(setup, ftype, pure):  # noqa: F811
    """Whole files with an imatrix, header and metadata included. The IQ2_S tensors come from the
    IQ2_M file type; with --pure every tensor is IQ2_S, the token embedding (which the imatrix
    lacks) by IQ2_S's path without column weights."""
    d, base, imx, _ = setup
    flag = ["--pure"] if pure else []
    ref, ours = d / f"bin-{ftype}-{pure}.gguf", d / f"ours-{ftype}-{pure}.gguf"
    binary_quantize(base, ref, ftype, imx, flag)
    r = run_cli(["quant", str(base),"--type", ftype, "-o", str(ours), "--imatrix", str(imx), *flag])
    assert r.exit_code == 0, r.stderr
    assert ours.read_bytes() == ref.read_bytes(), f"{ftype} (pure: {pure}) differs from llama-quantize"
    if pure:
        from llmkit.gguf.reader import read_gguf

        assert {t.type_name for t in read_gguf(str(ours)).tensors} == {"IQ2_S", "F32"}


def test_first_compilation_is_announced_once(setup, tmp_path):  # noqa: F811
    """A kernel's first compilation (an empty numba cache) is said on stderr; the next run loads it."""
    d, base, imx, _ = setup
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    args = ["quant", str(base), "--type", "IQ2_XXS", "--imatrix", str(imx)]
    first = run_subprocess(args + ["-o", str(tmp_path / "a.gguf")], text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "compiling llmkit's iq2_xxs quantization kernel" in first.stderr
    again = run_subprocess(args + ["-o", str(tmp_path / "b.gguf")], text=True, env=env, timeout=600)
    assert again.returncode == 0 and "compiling" not in again.stderr, again.stderr
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
