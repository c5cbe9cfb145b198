"""The 14 file types llama.cpp added for 1-3 bit models (the i-quant mixes, Q2_K_S, TQ1_0/TQ2_0,
MXFP4_MOE) against the `llama-quantize` binary: the type llmkit's rules give every tensor equals the
binary's (from its --dry-run log) on models that take each branch of llama_tensor_get_type
(GQA 1/2/4, 8 experts, a tied output, 8 layers for the first/last-eighth rules, rows that fall back),
with and without an imatrix, refusing where the binary refuses and naming the same tensor; and whole
files equal to the binary's for every one of these file types."""

import re

import pytest

from conftest import run_cli
from ggufmake import write_tiny_llama
from imatrixmake import write_imatrix_dat
from quantref import binary_outcome, binary_quantize, dry_run_types

pytest.importorskip("llama_cpp")

from llmkit.errors import BadInput  # noqa: E402
from llmkit.quant.plan import rules  # noqa: E402
from llmkit.quant.plan.tensors import plan_types  # noqa: E402

NEW = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "Q2_K_S",
       "TQ1_0", "TQ2_0", "MXFP4_MOE")
SHAPES = {  # name -> write_tiny_llama arguments
    "gqa2": dict(n_embd=256, n_ff=512, n_layer=8, n_head=4, n_head_kv=2, seed=1),
    "gqa4": dict(n_embd=256, n_ff=320, n_layer=8, n_head=4, n_head_kv=1, seed=2),  # ffn rows of 320 fall back
    "experts8": dict(n_embd=256, n_ff=256, n_layer=8, n_head=4, n_head_kv=4, seed=3, n_expert=8),
    "tied": dict(n_embd=256, n_ff=512, n_layer=3, n_head=4, n_head_kv=4, seed=4, tied=True),
    "odd": dict(n_embd=96, n_ff=160, n_layer=2, n_head=4, n_head_kv=2, seed=5),  # every row falls back
    # for whole files: small enough for the slow searches (IQ1_S, IQ2_XXS) of both tools
    "small-tied": dict(n_embd=256, n_ff=256, n_layer=2, n_head=4, n_head_kv=4, seed=6, tied=True, outliers=True),
    "small-gqa4": dict(n_embd=256, n_ff=288, n_layer=2, n_head=4, n_head_kv=1, seed=7),  # ffn rows of 288 fall back
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("newtypes")
    out = {}
    for k, kw in SHAPES.items():
        p = write_tiny_llama(d / f"{k}.gguf", **kw)
        out[k] = (p, write_imatrix_dat(d / f"{k}.dat", p, seed=7))
    return d, out


def test_the_file_type_table():
    """llama.h's numbers, llama_ftype_get_default_type's tensor types; 35 file types in all
    (Q1_0, Q2_0: test_quant_lowbit.py)."""
    want = {"IQ2_XXS": (19, "IQ2_XXS"), "IQ2_XS": (20, "IQ2_XS"), "Q2_K_S": (21, "Q2_K"), "IQ3_XS": (22, "IQ3_S"),
            "IQ3_XXS": (23, "IQ3_XXS"), "IQ1_S": (24, "IQ1_S"), "IQ3_S": (26, "IQ3_S"), "IQ3_M": (27, "IQ3_S"),
            "IQ2_S": (28, "IQ2_XS"), "IQ2_M": (29, "IQ2_S"), "IQ1_M": (31, "IQ1_M"), "TQ1_0": (36, "TQ1_0"),
            "TQ2_0": (37, "TQ2_0"), "MXFP4_MOE": (38, "MXFP4")}
    assert {k: rules.FTYPES[k] for k in NEW} == want
    assert len(rules.FTYPES) == 35 and rules.resolve_ftype("iq2_m") == "IQ2_M"


@pytest.mark.parametrize("imx", [False, True], ids=["no-imatrix", "imatrix"])
@pytest.mark.parametrize("shape", [k for k in SHAPES if not k.startswith("small")])
@pytest.mark.parametrize("ftype", NEW)
def test_types_per_tensor_equal_the_binary(models, tmp_path, ftype, shape, imx):
    """Rules only (no llmkit bytes): every tensor's type as the binary's --dry-run reports it; where the
    binary needs an imatrix and has none, the same refusal naming the same first tensor."""
    d, ms = models
    src, dat = ms[shape]
    theirs, needs = dry_run_types(src, ftype, dat if imx else None)
    try:
        ours = plan_types(str(src), ftype, has_imatrix=imx)
    except BadInput as e:
        ours = str(e)
    if needs:  # the real run refuses in its first pass over the tensors, before quantizing any
        p = binary_outcome(src, tmp_path / "refused.gguf", ftype)
        assert p.returncode != 0
        first = re.search(r"offending tensor: (\S+)", p.stderr + p.stdout).group(1)
        assert isinstance(ours, str) and f"'{first}'" in ours, ours
        assert not imx and ftype in rules.IMATRIX_FTYPES
        return
    assert ours == theirs
    if not imx and shape != "odd":  # (rows of 96 all fall back to 32-block types, which need none)
        assert ftype not in rules.IMATRIX_FTYPES


@pytest.mark.parametrize("ftype,out_type", [("Q4_K_M", "Q8_0"), ("IQ3_S", "Q4_0"), ("TQ2_0", "IQ4_NL"),
                                            ("IQ2_XXS", "Q3_K")])
def test_tied_token_embedding_takes_the_output_type(models, ftype, out_type):
    """--output-tensor-type also types a token embedding that stands in for the output (llama.cpp's
    output branch), then the fallback rule applies as to any other choice."""
    d, ms = models
    src, dat = ms["tied"]
    theirs, _ = dry_run_types(src, ftype, dat, ["--output-tensor-type", out_type.lower()])
    ours = plan_types(str(src), ftype, has_imatrix=True, overrides=rules.Overrides(output=out_type))
    assert ours == theirs and ours["token_embd.weight"] == out_type


WHOLE = [(t, "imatrix") for t in NEW] + [(t, None) for t in ("IQ3_S", "IQ3_M")]


@pytest.mark.slow  # the binary builds the IQ1/IQ2 search tables on every run (~10 s for IQ1_*, under load)
@pytest.mark.parametrize("ftype,imx", WHOLE)
def test_same_file_as_the_binary(models, monkeypatch, ftype, imx):
    """Whole files with llmkit's formats (the grid i-quants included), compiled kernels forced on, on
    a tied model (Q5_K/Q6_K token embeddings, outliers) and a GQA-4 one (Q2_K/IQ3_S/Q4_K token
    embeddings, fallback rows)."""
    d, ms = models
    monkeypatch.setenv("LLMKIT_JIT", "1")
    for shape in ("small-tied", "small-gqa4"):
        src, dat = ms[shape]
        ref, ours = d / f"whole-bin-{shape}-{ftype}.gguf", d / f"whole-ours-{shape}-{ftype}.gguf"
        binary_quantize(src, ref, ftype, dat if imx else None)
        r = run_cli(["quant", str(src),"--type", ftype, "-o", str(ours)] + (["--imatrix", str(dat)] if imx else []))
        assert r.exit_code == 0, r.stderr
        assert ours.read_bytes() == ref.read_bytes(), f"{shape} {ftype} (imatrix {imx}) differs from llama-quantize"
        ref.unlink(), ours.unlink()
