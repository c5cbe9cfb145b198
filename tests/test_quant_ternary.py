"""TQ1_0, TQ2_0 and MXFP4 against llama.cpp: every block's bytes equal to ggml's quantizer (through
llmkit/quant/formats/ggml_lib.py) on data built to hit the edge cases (ties, zeros of both signs,
scales near powers of two and fp16's limits, subnormals), decoding equal to ggml's dequantizer, and
whole files equal to the `llama-quantize` binary for the TQ1_0, TQ2_0, MXFP4_MOE and Q2_K_S file
types, with the refusals llama.cpp makes (no imatrix where one is needed, an imatrix missing a
tensor) said in one line before anything is written."""

import re

import numpy as np
import pytest

from conftest import run_cli
from ggufmake import write_tiny_llama
from imatrixmake import write_imatrix_dat
from quantref import assert_blocks_equal_ggml, awkward_rows, binary_outcome, binary_quantize, same_file_as_binary

pytest.importorskip("llama_cpp")

from llmkit.quant.formats import get_format, ggml_lib  # noqa: E402


def hard_rows(seed=0) -> np.ndarray:
    """(48, 512) float32 rows of the cases a ternary or FP4 quantizer can get wrong."""
    rng = np.random.default_rng(seed)
    x = awkward_rows(48, rng)
    x[7] = np.nextafter(np.float32(2.0), np.float32(0)) * np.sign(x[7])
    x[8, :] = 0.0
    x[8, 5] = np.nextafter(np.float32(8.0), np.float32(0))  # log2f rounds up to 3 here
    x[9, :32] = np.nextafter(np.float32(2.0) ** np.arange(-20, 12, dtype=np.float32), np.float32(0))
    x[10] = np.float32(0.5) * np.sign(x[10])
    x[10, ::32] = 1.0  # every element at exactly half the block's max
    for r in range(11, 48):  # FP4 ties: multiples of a quarter of a power-of-two scale
        x[r] = (rng.integers(-24, 25, 512) / 4 * 2.0 ** rng.integers(-8, 8)).astype(np.float32)
    x[20:30] *= np.float32(1) + rng.standard_normal((10, 512)).astype(np.float32) * np.float32(1e-7)
    return x


@pytest.mark.parametrize("name", ["TQ1_0", "TQ2_0", "MXFP4"])
@pytest.mark.parametrize("jit", ["0", "1"])
def test_blocks_equal_ggml(name, jit, monkeypatch):
    """quantize_row_*_ref's bytes, with the compiled kernel (where the format has one) and without."""
    monkeypatch.setenv("LLMKIT_NO_JIT" if jit == "0" else "LLMKIT_JIT", "1")
    f = get_format(name)
    if name == "MXFP4":
        assert f.compiled() == (jit == "1")
    x = hard_rows()
    with np.errstate(over="ignore"):  # row 5's TQ scales overflow fp16, as in C (llama.cpp then refuses the row)
        ours = f.quantize(x)
    assert_blocks_equal_ggml(f, x, ours)


def test_fp4_table_is_ggmls():
    """The E2M1 values derived from the format's definition are the ones ggml decodes: a block with
    exponent 128 (scale 2^0 / 2 doubled back) and codes 0..15 in order."""
    from llmkit.quant.formats.lowbit.mxfp4 import E2M1_DOUBLED

    block = np.zeros(17, np.uint8)
    block[0] = 128
    codes = np.arange(32) % 16
    block[1:] = codes[:16] | (codes[16:] << 4)
    assert ggml_lib.dequantize(39, block, 32).tolist() == np.concatenate([E2M1_DOUBLED, E2M1_DOUBLED]).tolist()


def test_trits_read_back():
    """TQ1_0's base-3 bytes decode to the trits they were made from (all 3^5 and 3^4 patterns)."""
    f = get_format("TQ1_0")
    trits = np.stack(np.meshgrid(*[np.arange(3)] * 5, indexing="ij"), -1).reshape(-1, 5)  # 243 patterns
    x = np.zeros((243, 256), np.float32)
    x[:, 0:160:32] = trits - 1  # weights m, m+32, ... of byte 0
    x[:, 160:240:16] = trits - 1  # byte 32
    x[:, 240:256:4][:, :4] = trits[:, :4] - 1  # high byte 0
    x[:, 255] = 1.0  # d = 1 everywhere
    out = f.quantize(x)
    assert np.array_equal(f.dequantize(out.reshape(-1), x.size).reshape(x.shape), x)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Dense (GQA 2, 8 layers, outliers), MoE (4 experts), rows of 96/160 (fallbacks), each with a
    synthetic imatrix in llama-imatrix's .dat layout."""
    d = tmp_path_factory.mktemp("tq")
    m = {"dense": write_tiny_llama(d / "dense.gguf", n_embd=256, n_ff=512, n_layer=8, n_head=4, n_head_kv=2, seed=1,
                                   outliers=True),
         "moe": write_tiny_llama(d / "moe.gguf", n_embd=256, n_ff=256, n_layer=2, n_head=4, n_head_kv=2, seed=2,
                                 n_expert=4),
         "odd": write_tiny_llama(d / "odd.gguf", n_embd=96, n_ff=160, n_layer=2, n_head=4, n_head_kv=2, seed=3)}
    return d, m, {k: write_imatrix_dat(d / f"{k}.dat", p, seed=5) for k, p in m.items()}


@pytest.mark.parametrize("model,ftype,imx", [
    ("dense", "TQ1_0", False), ("dense", "TQ2_0", False), ("dense", "TQ1_0", True), ("odd", "TQ1_0", False),
    ("odd", "TQ2_0", False), ("moe", "TQ2_0", False), ("moe", "MXFP4_MOE", False), ("moe", "MXFP4_MOE", True),
    ("dense", "MXFP4_MOE", False), ("odd", "MXFP4_MOE", False), ("dense", "Q2_K_S", True), ("moe", "Q2_K_S", True),
    ("odd", "Q2_K_S", False)])
def test_same_file_as_the_binary(models, monkeypatch, model, ftype, imx):
    """Whole files (metadata included), with the compiled kernels forced on; the fallback count in the
    report equals the binary's."""
    d, m, imxs = models
    monkeypatch.setenv("LLMKIT_JIT", "1")
    fallbacks = same_file_as_binary(m[model], d, ftype, imxs[model] if imx else None, f"{model}-{imx}")
    if model == "odd" and ftype != "MXFP4_MOE":  # (MXFP4_MOE gives this dense model Q8_0: rows of 96 fit)
        assert fallbacks > 0


@pytest.mark.parametrize("ftype", ["Q2_K_S", "IQ2_XXS", "IQ1_M", "IQ3_XXS"])
def test_refuses_without_imatrix_like_the_binary(models, tmp_path, ftype):
    """No imatrix: the binary refuses (naming the first tensor), llmkit too, in one line, exit 1, and
    writes nothing (a file already at the output path is left as it was)."""
    d, m, _ = models
    p = binary_outcome(m["dense"], tmp_path / "bin.gguf", ftype)
    assert p.returncode != 0
    first = re.search(r"offending tensor: (\S+)", p.stderr + p.stdout).group(1)
    out = tmp_path / "ours.gguf"
    out.write_bytes(b"earlier result")
    r = run_cli(["quant", str(m["dense"]), "--type", ftype, "-o", str(out)])
    assert r.exit_code == 1
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "importance matrix" in r.stderr and f"'{first}'" in r.stderr
    assert out.read_bytes() == b"earlier result" and [p.name for p in tmp_path.glob("ours*")] == ["ours.gguf"]


def test_rows_that_fall_back_need_no_imatrix(models, tmp_path):
    """Q2_K_S on rows of 96: every matrix falls back to Q4_0, so neither tool asks for an imatrix."""
    d, m, _ = models
    binary_quantize(m["odd"], tmp_path / "bin.gguf", "Q2_K_S")
    assert run_cli(["quant", str(m["odd"]), "--type", "Q2_K_S", "-o", str(tmp_path / "ours.gguf")]).exit_code == 0
    assert (tmp_path / "bin.gguf").read_bytes() == (tmp_path / "ours.gguf").read_bytes()


@pytest.mark.parametrize("ftype", ["Q2_K_S", "IQ2_XS"])
def test_imatrix_missing_a_tensor(models, tmp_path, ftype):
    """An imatrix without blk.3.attn_q.weight: the binary bails out on that tensor; llmkit says so in one
    line naming it, before writing."""
    d, m, _ = models
    holey = write_imatrix_dat(tmp_path / "holey.dat", m["dense"], seed=5, skip={"blk.3.attn_q.weight"})
    p = binary_outcome(m["dense"], tmp_path / "bin.gguf", ftype, holey)
    assert p.returncode != 0 and "blk.3.attn_q.weight" in p.stderr + p.stdout
    out = tmp_path / "ours.gguf"
    r = run_cli(["quant", str(m["dense"]), "--type", ftype, "-o", str(out), "--imatrix", str(holey)])
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "'blk.3.attn_q.weight'" in r.stderr
    assert not out.exists()
