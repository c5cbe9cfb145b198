"""Q1_0 (a sign bit per weight and the block's mean |x|, 128 per block) and Q2_0 (levels -1, 0, 1, 2
times the block's max |x|, 64 per block) against llama.cpp: every block's bytes equal to ggml's
quantizer on edge cases, decoding equal to ggml's, whole files equal to the `llama-quantize` binary
with and without an imatrix; the row widths it refuses (Q1_0 has no fallback type) refused in one
line before anything is written; and the list of file types the binary offers (`--help`), so that a
llama.cpp upgrade adding one fails here until llmkit writes it."""

import json

import numpy as np
import pytest

from conftest import run_cli
from ggufmake import write_tiny_llama
from imatrixmake import write_imatrix_dat
from quantref import assert_blocks_equal_ggml, awkward_rows, binary_refuses, dry_run_types, listed_file_types, same_file_as_binary

pytest.importorskip("llama_cpp")

from llmkit.quant.formats import get_format, ggml_lib  # noqa: E402
from llmkit.quant.plan import rules  # noqa: E402
from llmkit.quant.plan.tensors import plan_types  # noqa: E402


def test_every_file_type_the_binary_lists_is_written():
    """`llama-quantize --help` of the installed llama.cpp: each file type it offers is one llmkit
    writes, under the same llama_ftype number, and its aliases resolve the same way."""
    listed, aliases = listed_file_types()
    missing = sorted(set(listed) - set(rules.FTYPES))
    assert not missing, f"llama-quantize offers file types llmkit does not write: {missing}"
    assert {k: rules.FTYPES[k][0] for k in listed} == listed
    assert {a: rules.resolve_ftype(a) for a in aliases} == aliases
    assert len(listed) == len(rules.FTYPES) == 35


def edge_rows(seed=0) -> np.ndarray:
    """(40, 512) float32: zeros of both signs, exact halves of the block max (roundf's ties), tiny and
    subnormal scales, scales beyond fp16, runs summing differently in another order."""
    rng = np.random.default_rng(seed)
    x = awkward_rows(40, rng)
    x[7, ::64] = 1.0  # every other weight at exactly half (and minus half) the block's max
    x[7, 1::64] = -1.0
    x[7] = np.where(np.arange(512) % 64 > 1, np.float32(0.5) * np.sign(x[7]), x[7])
    x[8:20] = (rng.integers(-8, 9, (12, 512)) / 8).astype(np.float32)
    x[20:30] = np.float32(1) + rng.standard_normal((10, 512)).astype(np.float32) * np.float32(1e-7)
    x[30:] *= np.float32(2.0) ** rng.integers(-20, 12, (10, 1)).astype(np.float32)
    return x


@pytest.mark.parametrize("name", ["Q1_0", "Q2_0"])
def test_blocks_equal_ggml(name):
    """quantize_row_q1_0_ref / q2_0_ref's bytes (the imatrix is ignored by both, as in ggml), and a
    NaN/Inf weight handled as C does; decoding equal to ggml's dequantizer."""
    f = get_format(name)
    x = edge_rows()
    for imx in (None, np.linspace(0.1, 3, 512, dtype=np.float32)):
        with np.errstate(over="ignore"):
            ours = f.quantize(x, imx)
        assert_blocks_equal_ggml(f, x, ours, imx)
    y = x[8:20].copy()
    y[0, 3], y[1, 70], y[2, 0], y[3, :64] = np.nan, np.inf, -np.inf, 0.0
    y[3, 9] = np.nan  # the only non-zero of its block: C's max skips a NaN, d = 0
    with np.errstate(all="ignore"):
        assert np.array_equal(f.quantize(y), ggml_lib.quantize(f.type_id, y))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """8 layers (the first/last-eighth rules) with outliers, a tied output, rows of 96/160 (Q2_0
    falls back, Q1_0 cannot), rows of 192 (fit Q2_0's 64 but not Q1_0's 128); synthetic imatrices."""
    d = tmp_path_factory.mktemp("lowbit")
    m = {"dense": write_tiny_llama(d / "dense.gguf", n_embd=256, n_ff=512, n_layer=8, n_head=4, n_head_kv=2, seed=1,
                                   outliers=True),
         "tied": write_tiny_llama(d / "tied.gguf", n_embd=256, n_ff=384, n_layer=2, n_head=4, n_head_kv=4, seed=2,
                                  tied=True),
         "odd": write_tiny_llama(d / "odd.gguf", n_embd=96, n_ff=160, n_layer=2, n_head=4, n_head_kv=2, seed=3),
         "r192": write_tiny_llama(d / "r192.gguf", n_embd=192, n_ff=384, n_layer=2, n_head=4, n_head_kv=2, seed=4)}
    return d, m, {k: write_imatrix_dat(d / f"{k}.dat", p, seed=5) for k, p in m.items()}


@pytest.mark.parametrize("model,ftype,imx", [
    ("dense", "Q1_0", False), ("dense", "Q2_0", False), ("dense", "Q1_0", True), ("dense", "Q2_0", True),
    ("tied", "Q1_0", False), ("tied", "Q2_0", True), ("odd", "Q2_0", False), ("r192", "Q2_0", False)])
def test_same_file_as_the_binary(models, model, ftype, imx):
    """Whole files, metadata included; the fallback count equals the binary's."""
    d, m, imxs = models
    fallbacks = same_file_as_binary(m[model], d, ftype, imxs[model] if imx else None, f"{model}-{imx}")
    assert (fallbacks > 0) == (model in ("odd", "r192"))


@pytest.mark.parametrize("model", ["odd", "r192"])
def test_q1_0_rows_without_a_fallback_are_refused(models, tmp_path, model):
    """Rows that are not a multiple of 128: llama.cpp has no fallback for Q1_0 and stops; llmkit says
    so in one line naming the first such tensor, before writing (an earlier file stays as it was)."""
    _, m, _ = models
    log = binary_refuses(m[model], tmp_path / "bin.gguf", "Q1_0")
    assert "no tensor type fallback" in log
    out = tmp_path / "ours.gguf"
    out.write_bytes(b"earlier result")
    r = run_cli(["quant", str(m[model]), "--type", "Q1_0", "-o", str(out)])
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Q1_0" in r.stderr and "128" in r.stderr and "'token_embd.weight'" in r.stderr
    assert out.read_bytes() == b"earlier result"


@pytest.mark.parametrize("ftype", ["Q1_0", "Q2_0"])
def test_types_per_tensor_equal_the_binary(models, ftype):
    """Rules only, with overrides: --pure, an output type, a pattern naming Q2_0 inside another file type."""
    _, m, imxs = models
    for extra, kw in (([], {}), (["--pure"], {"pure": True}),
                      (["--output-tensor-type", "q2_0"], {"overrides": rules.Overrides(output="Q2_0")})):
        theirs, _ = dry_run_types(m["tied"], ftype, imxs["tied"], extra)
        assert plan_types(str(m["tied"]), ftype, has_imatrix=True, **kw) == theirs, extra
    theirs, _ = dry_run_types(m["dense"], "Q4_K_M", None, ["--tensor-type", "ffn_up=q1_0", "--tensor-type", "attn_q=q2_0"])
    ours = plan_types(str(m["dense"]), "Q4_K_M", overrides=rules.Overrides(
        tensor_types=[("ffn_up", "Q1_0"), ("attn_q", "Q2_0")]))
    assert ours == theirs and ours["blk.0.ffn_up.weight"] == "Q1_0"


def tensor(path, name) -> np.ndarray:
    """A tensor's raw bytes."""
    from llmkit.gguf.reader import read_gguf
    from llmkit.gguf.tensors import read_tensor

    g = read_gguf(str(path))
    with open(path, "rb") as f:
        return read_tensor(f, next(t for t in g.tensors if t.name == name), g.data_offset)


def test_inspect_compare_and_ppl_read_them(models, tmp_path, kernel_small):
    """A Q1_0 and a Q2_0 file through quant inspect, compare (dequantized by llmkit) and ppl (llama.cpp)."""
    _, m, _ = models
    text = tmp_path / "t.txt"
    text.write_text(kernel_small.read_text(encoding="utf-8")[:4000], encoding="utf-8")
    for ftype in ("Q1_0", "Q2_0"):
        q = tmp_path / f"{ftype}.gguf"
        assert run_cli(["quant", str(m["dense"]), "--type", ftype, "-o", str(q)]).exit_code == 0
        r = run_cli(["quant", "inspect", str(q), "--json"])
        assert r.exit_code == 0 and ftype in r.stdout, r.stderr
        r = run_cli(["quant", "compare", str(m["dense"]), str(q), "--json"])
        assert r.exit_code == 0, r.stderr
        row = {t["name"]: t for t in json.loads(r.stdout)["tensors"]}["blk.3.ffn_up.weight"]
        x, y = tensor(m["dense"], "blk.3.ffn_up.weight"), tensor(q, "blk.3.ffn_up.weight")
        ggml = ggml_lib.dequantize(get_format(ftype).type_id, y, x.size // 4)
        x = x.view("<f4")
        assert row["type_b"] == ftype
        assert row["cosine"] == pytest.approx(float(x @ ggml / np.linalg.norm(x) / np.linalg.norm(ggml)), rel=1e-6)
        r = run_cli(["quant", "ppl", "-m", str(q), str(text), "-c", "128", "--chunks", "2", "--json"])
        assert r.exit_code == 0, r.stderr
        assert np.isfinite(json.loads(r.stdout.splitlines()[0])["ppl"])
