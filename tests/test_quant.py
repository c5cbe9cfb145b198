"""llmkit quant against llama.cpp's own quantizer (the llama-quantize binary): whole output files must be
byte-identical for every type, on random-weight models of several shapes built here; plus imatrix
(formats, collection, the error it saves), reports, compare, perplexity and bad input."""

import json
import os
import struct
import time

import numpy as np
import pytest

from conftest import run_cli
from ggufbad import MALFORMED
from ggufmake import write_tiny_llama
from quantref import binary_outcome, binary_quantize

llama_cpp = pytest.importorskip("llama_cpp")

from llmkit.quant.plan import rules  # noqa: E402
from llmkit.quant.write.quantize import quantize_file  # noqa: E402

ALL = [t for t in rules.FTYPES if t not in rules.IMATRIX_FTYPES]  # the others: test_quant_newtypes.py


def reference(src, dst, ftype, imatrix=None, pure=False, output_type=None, embd_type=None, tensor_types=()):
    """The `llama-quantize` binary, with an imatrix (loaded from its file: the binary reads that file)
    and type overrides as its flags."""
    extra = (["--pure"] if pure else []) + (["--output-tensor-type", output_type.lower()] if output_type else []) \
        + (["--token-embedding-type", embd_type.lower()] if embd_type else [])
    for pattern, t in tensor_types:
        extra += ["--tensor-type", f"{pattern.lower()}={t.lower()}"]
    binary_quantize(src, dst, ftype, imatrix.source if imatrix else None, extra)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("qmodels")
    m = {
        # untied output, GQA 2, outliers and exact zeros
        "base": write_tiny_llama(d / "base.gguf", n_embd=256, n_ff=512, n_layer=3, n_head=4, n_head_kv=2, seed=1,
                                 outliers=True),
        # tied embeddings, GQA 4, 8 layers (use_more_bits pattern over layers)
        "tied": write_tiny_llama(d / "tied.gguf", n_embd=256, n_ff=256, n_layer=8, n_head=8, n_head_kv=2, seed=2,
                                 tied=True),
        # rows of 288 and 640: not multiples of 256 (K-quant fallbacks)
        "odd": write_tiny_llama(d / "odd.gguf", n_embd=288, n_ff=640, n_layer=2, n_head=4, n_head_kv=4, seed=3),
        # F16 input
        "f16": write_tiny_llama(d / "f16.gguf", n_embd=256, n_ff=512, n_layer=2, n_head=4, n_head_kv=2, seed=4,
                                dtype=np.float16),
    }
    return d, m


def same_file(a, b) -> bool:
    return open(a, "rb").read() == open(b, "rb").read()


CASES = ([("base", t) for t in ALL] + [("tied", t) for t in ("Q2_K", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q8_0")]
         + [("odd", t) for t in ("Q2_K", "Q3_K_S", "Q4_K_M", "Q5_K_S", "Q6_K", "Q4_0", "IQ4_XS")]
         + [("tied", t) for t in ("IQ4_NL", "IQ4_XS")]
         + [("f16", t) for t in ("F16", "BF16", "Q8_0", "Q4_K_M")])


@pytest.mark.parametrize("model,ftype", CASES)
def test_byte_identical_to_llama_cpp(models, model, ftype):
    d, m = models
    ours, ref = d / f"ours-{model}-{ftype}.gguf", d / f"ref-{model}-{ftype}.gguf"
    reference(m[model], ref, ftype)
    quantize_file(str(m[model]), str(ours), ftype)
    assert same_file(ours, ref), f"{model} {ftype} differs from llama.cpp"
    os.unlink(ours), os.unlink(ref)


def test_pure_and_mixture_types(models):
    d, m = models
    ref, ours = d / "ref-pure.gguf", d / "ours-pure.gguf"
    reference(m["tied"], ref, "Q4_K_M", pure=True)
    rep = quantize_file(str(m["tied"]), str(ours), "Q4_K_M", pure=True)
    assert same_file(ours, ref)
    assert {t.type_out for t in rep.tensors if t.type_in != t.type_out} == {"Q4_K"}
    rep = quantize_file(str(m["tied"]), str(ours), "Q4_K_M")
    types = {t.name: t.type_out for t in rep.tensors}
    assert types["token_embd.weight"] == "Q6_K"  # tied: the embedding doubles as the output layer
    v6 = [i for i in range(8) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"]
    assert v6 == [0, 3, 6, 7]  # use_more_bits(i, 8): i < 1, i >= 7, or (i - 1) % 3 == 2
    assert types["blk.0.attn_norm.weight"] == "F32"


@pytest.fixture(scope="module")
def imatrix_file(models, kernel_small):
    d, m = models
    out = d / "imatrix.gguf"
    r = run_cli(["quant", "imatrix", "-m", str(m["base"]), "--text", str(kernel_small), "-o", str(out), "-c", "128",
                  "--chunks", "64"])
    assert r.exit_code == 0, r.stderr
    return out


@pytest.mark.parametrize("ftype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_M", "Q5_K_S", "Q6_K",
                                   "IQ4_NL", "IQ4_XS"])
def test_imatrix_byte_identical(models, imatrix_file, ftype):
    from llmkit.quant.calibration.imatrix import load_imatrix

    d, m = models
    imx = load_imatrix(str(imatrix_file))
    ref, ours = d / f"ref-imx-{ftype}.gguf", d / f"ours-imx-{ftype}.gguf"
    reference(m["base"], ref, ftype, imatrix=imx)
    r = run_cli(["quant", str(m["base"]), "--type", ftype, "-o", str(ours), "--imatrix", str(imatrix_file)])
    assert r.exit_code == 0, r.stderr
    assert same_file(ours, ref)


def test_imatrix_lowers_activation_weighted_error(models, imatrix_file):
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.calibration.imatrix import load_imatrix
    from llmkit.quant.formats import get_format, load_f32

    d, m = models
    imx = load_imatrix(str(imatrix_file))
    assert len(imx) == 3 * 7  # every matrix of every layer, including the last layer's FFN
    g = read_gguf(str(m["base"]))
    f = open(m["base"], "rb")
    plain = weighted = 0.0
    for t in g.tensors:
        if t.name not in imx:
            continue
        x = load_f32(f, t, g.data_offset)
        fmt = get_format("Q4_K")
        err = lambda q: float(((fmt.dequantize(q.reshape(-1), x.size).reshape(x.shape) - x) ** 2 * imx[t.name]).sum())
        plain += err(fmt.quantize(x))
        weighted += err(fmt.quantize(x, imx[t.name]))
    assert weighted < 0.97 * plain  # activation-weighted squared error drops with the imatrix


def test_legacy_dat_imatrix(tmp_path):
    from llmkit.quant.calibration.imatrix import load_imatrix

    p = tmp_path / "old.dat"
    vals = np.array([2.0, 4.0, 6.0], np.float32)
    name = b"blk.0.attn_q.weight"
    p.write_bytes(struct.pack("<i", 1) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 2, 3) + vals.tobytes()
                  + struct.pack("<i", 10) + struct.pack("<i", 4) + b"wiki")
    np.testing.assert_array_equal(load_imatrix(str(p))["blk.0.attn_q.weight"], vals / 2)
    p.write_bytes(p.read_bytes()[:20])
    r = run_cli(["quant", str(p),"--type", "Q4_0", "-o", str(tmp_path / "x.gguf"), "--imatrix", str(p)])
    assert r.exit_code == 1 and "imatrix" in r.stderr


def test_report_json_compare_and_ppl(models, kernel_small, tmp_path):
    d, m = models
    q8 = tmp_path / "q8.gguf"
    r = run_cli(["quant", str(m["base"]), "--type", "Q8_0", "-o", str(q8), "--json"])
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["ftype"] == "Q8_0" and rep["ratio"] > 3.5 and 8.0 < rep["bpw"] < 9.0
    q = [t for t in rep["tensors"] if t["type_out"] == "Q8_0"]
    assert q and all(t["cosine"] > 0.9999 and t["bpw"] == 8.5 for t in q)
    q2 = tmp_path / "q2.gguf"
    assert run_cli(["quant", str(m["base"]), "--type", "Q2_K", "-o", str(q2)]).exit_code == 0
    r = run_cli(["quant", "compare", str(m["base"]), str(q2), "--json"])
    diffs = {t["name"]: t for t in json.loads(r.stdout)["tensors"]}
    assert diffs["blk.0.attn_norm.weight"]["rmse"] == 0 and 0 < diffs["blk.0.attn_q.weight"]["rmse"]
    assert diffs["blk.0.attn_q.weight"]["cosine"] < 0.999
    r = run_cli(["quant", "ppl", "-m", str(m["base"]), "-m", str(q8), "-m", str(q2), str(kernel_small), "-c", "128",
                 "--chunks", "3", "--json"])
    assert r.exit_code == 0, r.stderr
    ppl = [json.loads(x)["ppl"] for x in r.stdout.splitlines()]
    assert len(ppl) == 3 and all(np.isfinite(ppl))
    assert abs(ppl[1] - ppl[0]) < abs(ppl[2] - ppl[0])  # Q8_0 stays closer to F32 than Q2_K


def _model_with(tmp_path, mutate, n_embd=64, n_ff=128):
    """A one-layer tiny model with blk.0.attn_q.weight's F32 data changed in place."""
    from llmkit.gguf.reader import read_gguf

    p = tmp_path / f"bad-weights-{n_embd}.gguf"
    write_tiny_llama(p, n_embd=n_embd, n_ff=n_ff, n_layer=1, seed=5)
    g = read_gguf(str(p))
    t = next(t for t in g.tensors if t.name == "blk.0.attn_q.weight")
    data = bytearray(p.read_bytes())
    arr = np.frombuffer(bytes(data[g.data_offset + t.offset: g.data_offset + t.offset + t.nbytes]), "<f4").copy()
    mutate(arr)
    data[g.data_offset + t.offset: g.data_offset + t.offset + t.nbytes] = arr.tobytes()
    p.write_bytes(bytes(data))
    return p


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_weights_refused(tmp_path, value):
    def put(a):
        a[7] = value

    p = _model_with(tmp_path, put, 256, 256)
    out = tmp_path / "out.gguf"
    # IQ4_NL: a NaN makes the block's least-squares scale 0, so only the input check can see it
    for ftype in ("Q8_0", "IQ4_NL", "Q4_K_M"):
        r = run_cli(["quant", str(p),"--type", ftype, "-o", str(out)])
        assert r.exit_code == 1 and "NaN/Inf" in r.stderr and not out.exists(), (ftype, r.stderr)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # no temp file left behind


def test_bad_usage_and_requantize(models, tmp_path):
    d, m = models
    q4 = tmp_path / "q4.gguf"
    r = run_cli(["quant", str(m["base"]), "--type", "Q4_0", "-o", str(q4)])
    assert r.exit_code == 0 and "x smaller" in r.stderr
    r = run_cli(["quant", str(q4),"--type", "Q8_0", "-o", str(tmp_path / "again.gguf")])
    assert r.exit_code == 1 and "already quantized" in r.stderr
    ref = tmp_path / "ref-re.gguf"
    binary_quantize(q4, ref, "Q8_0", extra=["--allow-requantize"])
    r = run_cli(["quant", str(q4),"--type", "Q8_0", "-o", str(tmp_path / "again.gguf"), "--allow-requantize"])
    assert r.exit_code == 0 and same_file(tmp_path / "again.gguf", ref)
    assert "x larger" in r.stderr  # Q4_0 -> Q8_0 grows the file; it is not called "0.6x smaller"
    before = q4.read_bytes()
    r = run_cli(["quant", str(q4),"--type", "Q8_0", "-o", str(q4), "--allow-requantize"])
    assert r.exit_code == 1 and "output path is the input" in r.stderr and q4.read_bytes() == before
    r = run_cli(["quant", str(m["base"]), "--type", "Q7_X", "-o", str(tmp_path / "x.gguf")])
    assert r.exit_code == 1 and "unknown quantization type" in r.stderr
    r = run_cli(["quant", str(m["base"]), "-o", str(tmp_path / "x.gguf")])
    assert r.exit_code == 2


def test_model_needing_more_memory_than_available_refused_first(models, monkeypatch, tmp_path):
    """Tensors that need more memory than the machine has: refused in one line with both figures,
    before anything is written (an earlier file at the output path stays)."""
    from llmkit.quant.write import quantize as q

    d, m = models
    need, big = q.memory_needed(*_plan_and_opts(m["base"], "Q4_K_M"))
    monkeypatch.setattr(q, "available_memory", lambda: need - 1)
    out = tmp_path / "out.gguf"
    out.write_bytes(b"earlier result")
    r = run_cli(["quant", str(m["base"]), "--type", "Q4_K_M", "-o", str(out), "-t", "2"])
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"needs about {need / 2**30:.1f} GiB" in r.stderr and f"'{big}'" in r.stderr and "available" in r.stderr
    assert out.read_bytes() == b"earlier result" and [p.name for p in tmp_path.iterdir()] == ["out.gguf"]
    monkeypatch.setattr(q, "available_memory", lambda: need)
    assert run_cli(["quant", str(m["base"]), "--type", "Q4_K_M", "-o", str(out), "-t", "2"]).exit_code == 0


def _plan_and_opts(src, ftype):
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.options import QuantOptions
    from llmkit.quant.plan.tensors import plan_tensors

    plan, _ = plan_tensors(read_gguf(str(src)), ftype, False, False, None, None)
    return plan, QuantOptions(ftype, threads=2)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_inputs_fail_fast(tmp_path, name):
    p = tmp_path / "bad.gguf"
    p.write_bytes(MALFORMED[name])
    out = tmp_path / "out.gguf"
    t = time.perf_counter()
    r = run_cli(["quant", str(p),"--type", "Q4_K_M", "-o", str(out)])
    assert time.perf_counter() - t < 1.0
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_worker_processes_give_the_same_bytes(models, monkeypatch, imatrix_file):
    """Large tensors go to worker processes that read their own rows; the bytes must not change."""
    from llmkit.quant.write import jobs as q
    from llmkit.quant.calibration.imatrix import load_imatrix

    d, m = models
    monkeypatch.setattr(q.Workers, "PROCESS_MIN_BYTES", 0)
    imx = load_imatrix(str(imatrix_file))
    for ftype, w in (("Q4_K_M", None), ("Q6_K", imx), ("Q2_K", None)):
        ref, ours = d / f"ref-proc-{ftype}.gguf", d / f"ours-proc-{ftype}.gguf"
        reference(m["base"], ref, ftype, imatrix=w)
        quantize_file(str(m["base"]), str(ours), ftype, threads=2, imatrix=w)
        assert same_file(ours, ref), ftype


@pytest.mark.parametrize("ftype,value", [("Q8_0", 1e7), ("Q4_K_M", 1e9), ("Q4_K_M", 1e7), ("Q2_K", 3e6), ("F16", 1e5),
                                         ("IQ4_NL", 1e8)])
def test_fp16_overflow_refused_like_llama_cpp(tmp_path, ftype, value):
    """A huge weight: where llama.cpp refuses (a scale beyond fp16), llmkit refuses; where it
    accepts, the bytes are the same."""
    def put(a):
        a[3] = value

    # K-quants need 256-wide rows
    p = _model_with(tmp_path, put, *((256, 256) if ftype == "Q4_K_M" else (64, 128)))
    refused = binary_outcome(p, tmp_path / "ref.gguf", ftype).returncode != 0
    out = tmp_path / "out.gguf"
    r = run_cli(["quant", str(p),"--type", ftype, "-o", str(out)])
    if refused:
        assert r.exit_code == 1 and "beyond fp16's range" in r.stderr and not out.exists()
    else:
        assert r.exit_code == 0 and same_file(out, tmp_path / "ref.gguf")
    assert refused == (value != 1e7 or ftype == "Q8_0")


def test_colsum_is_the_c_loop_order():
    """The K-quant searches rely on numpy reducing axis 0 row by row (C's `s += a[i]` order); pairwise
    summation would give 2^24 + 32 here instead of 2^24, and different bytes from llama.cpp."""
    from llmkit.quant.formats.numerics import colsum, seq_sum

    a = np.ones((33, 5), np.float32)
    a[0] = 2.0 ** 24
    assert colsum(a)[0] == 2.0 ** 24
    rng = np.random.default_rng(0)
    b = (rng.standard_normal((32, 300)) * np.exp(rng.standard_normal((32, 300)) * 4)).astype(np.float32)
    s = b[0].copy()
    for row in b[1:]:
        s = (s + row).astype(np.float32)
    assert np.array_equal(colsum(b), s)
    assert np.array_equal(seq_sum(np.ascontiguousarray(b.T)), s)


def test_input_alignment_other_than_32_gives_a_valid_file(tmp_path):
    """general.alignment = 64: the key is copied, so the data must be laid out to 64 (llama.cpp's
    quantizer pads to 32 regardless and its own loader rejects the result). Same quantized bytes
    per tensor as llama.cpp on the 32-aligned twin, and llama.cpp loads the file."""
    import llama_cpp

    from llmkit.gguf.reader import read_gguf

    a64, a32 = tmp_path / "a64.gguf", tmp_path / "a32.gguf"
    write_tiny_llama(a64, n_embd=256, n_ff=512, n_layer=1, seed=7, alignment=64)
    write_tiny_llama(a32, n_embd=256, n_ff=512, n_layer=1, seed=7)
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    quantize_file(str(a64), str(ours), "Q4_K_M")
    reference(a32, ref, "Q4_K_M")
    go, gr = read_gguf(str(ours)), read_gguf(str(ref))  # the reader checks every offset against the alignment
    assert go.metadata["general.alignment"] == 64 and go.data_offset % 64 == 0
    fo, fr = open(ours, "rb"), open(ref, "rb")
    for to, tr in zip(go.tensors, gr.tensors):
        assert (to.name, to.type, to.offset % 64) == (tr.name, tr.type, 0)
        fo.seek(go.data_offset + to.offset), fr.seek(gr.data_offset + tr.offset)
        assert fo.read(to.nbytes) == fr.read(tr.nbytes), to.name
    fo.close(), fr.close()
    llm = llama_cpp.Llama(str(ours), n_ctx=64, verbose=False)
    assert llm.n_vocab() > 256
    llm.close()


OVERRIDE_CASES = [
    ("base", "Q4_K_M", dict(output_type="Q8_0", embd_type="Q4_0", tensor_types=[("attn_v", "Q8_0"), ("FFN_DOWN", "Q5_K")])),
    ("base", "Q3_K_S", dict(tensor_types=[(r"blk\.[02]\.", "Q6_K")])),
    ("tied", "Q4_K_M", dict(output_type="Q5_0", embd_type="Q5_K")),  # tied: the embedding follows its own option
    ("odd", "Q4_K_M", dict(tensor_types=[("ffn_up", "Q4_K")])),  # 640-wide rows: the pattern's type falls back
]


@pytest.mark.parametrize("model,ftype,ov", OVERRIDE_CASES)
def test_type_overrides_byte_identical(models, model, ftype, ov):
    d, m = models
    ours, ref = d / f"ours-ov-{model}.gguf", d / f"ref-ov-{model}.gguf"
    reference(m[model], ref, ftype, **ov)
    o = rules.Overrides(ov.get("output_type"), ov.get("embd_type"), ov.get("tensor_types", []))
    quantize_file(str(m[model]), str(ours), ftype, overrides=o)
    assert same_file(ours, ref)
    os.unlink(ours), os.unlink(ref)


def test_type_override_cli_and_errors(models, tmp_path):
    d, m = models
    out = tmp_path / "o.gguf"
    r = run_cli(["quant", str(m["base"]), "--type", "Q4_0", "-o", str(out), "--tensor-type", "attn_q=q8_0",
                 "--output-tensor-type", "q6_k", "--json"])
    assert r.exit_code == 0, r.output
    types = {t["name"]: t["type_out"] for t in json.loads(r.stdout)["tensors"]}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["output.weight"] == "Q6_K"
    assert types["blk.0.attn_k.weight"] == "Q4_0"
    for args, words in ((["--tensor-type", "attn_q"], "PATTERN=TYPE"), (["--tensor-type", "attn_q=Q9_9"], "unknown tensor type"),
                        (["--tensor-type", "(=Q8_0"], "regular expression"), (["--output-tensor-type", "Q7"], "unknown")):
        r = run_cli(["quant", str(m["base"]), "--type", "Q4_0", "-o", str(out), *args])
        assert r.exit_code == 1 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = run_cli(["quant", str(m["odd"]), "--type", "Q4_0", "-o", str(out), "--token-embedding-type", "Q4_K"])
    assert r.exit_code == 1 and "not a multiple" in r.stderr


def test_mixture_of_experts_quantization_and_imatrix(tmp_path, kernel_small):
    """A Mixtral-style model (4 experts, 2 used): 3-D expert tensors quantize byte-identically, the
    imatrix covers every expert through llama.cpp's MUL_MAT_ID (routed tokens only, per-expert counts),
    and quantizing with it — one imatrix slice per expert — still equals llama.cpp."""
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.calibration.imatrix import load_imatrix

    src = write_tiny_llama(tmp_path / "moe.gguf", n_embd=256, n_ff=512, n_layer=2, n_expert=4, outliers=True, seed=9)
    imx_path = tmp_path / "moe-imatrix.gguf"
    r = run_cli(["quant", "imatrix", "-m", str(src), "--text", str(kernel_small), "-o", str(imx_path), "-c", "128",
                 "--chunks", "4"])
    assert r.exit_code == 0, r.stderr
    g = read_gguf(str(imx_path))
    by = {t.name: t for t in g.tensors}
    counts = by["blk.1.ffn_down_exps.weight.counts"]
    assert counts.shape == (1, 4) and by["blk.1.ffn_down_exps.weight.in_sum2"].shape == (512, 4)
    with open(imx_path, "rb") as f:
        f.seek(g.data_offset + counts.offset)
        c = np.frombuffer(f.read(16), "<f4")
    assert c.sum() == 4 * 128 * 2  # every token of every chunk went to 2 experts (BOS counted: 128 per chunk)
    imx = load_imatrix(str(imx_path))
    assert len(imx["blk.0.ffn_gate_exps.weight"]) == 4 * 256 and "blk.0.attn_q.weight" in imx
    for ftype, w in (("Q4_K_M", None), ("Q2_K", imx), ("Q4_0", imx), ("Q6_K", imx)):
        ours, ref = tmp_path / f"ours-{ftype}.gguf", tmp_path / f"ref-{ftype}.gguf"
        reference(src, ref, ftype, imatrix=w)
        quantize_file(str(src), str(ours), ftype, imatrix=w)
        assert same_file(ours, ref), ftype


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K"])
def test_compiled_kernels_equal_the_numpy_definition(name, monkeypatch):
    """The numba kernels (jit.py) and the readable numpy modules give the same bytes on hard blocks
    (the numpy modules are in turn byte-identical to llama.cpp, tested above)."""
    pytest.importorskip("numba")
    from llmkit.quant.formats import get_format, jit

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((512, 256)) * rng.random((512, 1)) * 4).astype(np.float32)
    x[::7, :32] = 0.0
    x[3::7, 32:64] = -0.0
    x[::11, 64:96] = np.abs(x[::11, 64:96])
    x[::13, 100] *= 300.0
    fmt = get_format(name)
    assert fmt.compiled()
    compiled = fmt.quantize(x)
    monkeypatch.setenv("LLMKIT_NO_JIT", "1")
    assert not fmt.compiled()
    assert np.array_equal(fmt.quantize(x), compiled)
    del jit


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_numpy_plain_formats_equal_ggml_on_awkward_rows(name, monkeypatch):
    """The numpy definitions alone (no kernels) on zero, -0, tiny and subnormal-scale blocks: a
    subnormal scale's infinite reciprocal gives C's level 0, not a clamped 15."""
    from quantref import assert_blocks_equal_ggml, awkward_rows

    from llmkit.quant.formats import get_format

    monkeypatch.setenv("LLMKIT_NO_JIT", "1")
    fmt = get_format(name)
    assert not fmt.compiled()
    x = awkward_rows(32, np.random.default_rng(5))
    x = np.delete(x, 5, axis=0)  # the row whose scale exceeds fp16: refused by both, not quantized
    with np.errstate(all="ignore"):
        ours = fmt.quantize(x)
    assert_blocks_equal_ggml(fmt, x, ours)


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_compiled_imatrix_kernels_equal_ggml(name, monkeypatch):
    """The numba kernels of the K-quants' imatrix paths (jit.run_weighted) give ggml_quantize_chunk's
    bytes on hard rows: zero and -0 sub-blocks, outliers, an imatrix with zero columns, with a
    whole zero super-block and all zero (where ggml's scale search divides 0 by 0 and keeps 0)."""
    pytest.importorskip("numba")
    from llmkit.quant.formats import get_format, ggml_lib, jit

    monkeypatch.setenv("LLMKIT_JIT", "1")
    fmt = get_format(name)
    rng = np.random.default_rng(11)
    n = 1024
    x = (rng.standard_normal((48, n)) * rng.choice([0.01, 1.0, 30.0], (48, 1))).astype(np.float32)
    x[::5, :32] = 0.0
    x[2::5, 32:64] = -0.0
    x[::7, 64:96] = np.abs(x[::7, 64:96])
    x[::9, 300] *= 300.0
    seen, real = [], jit.run_weighted
    monkeypatch.setattr(jit, "run_weighted", lambda k, *a: seen.append(k) or real(k, *a))
    for case in range(3):
        qw = (rng.random(n) * rng.choice([0.0, 1.0, 100.0], n)).astype(np.float32)
        if case == 1:
            qw[:256] = 0.0
        if case == 2:
            qw[:] = 0.0
        ours = fmt.quantize(x, qw)
        assert np.array_equal(ours, ggml_lib.quantize(fmt.type_id, x, qw).reshape(ours.shape)), (name, case)
    assert seen == [fmt.weighted_kernel] * 3


def test_error_stats_a_slice_at_a_time_equal_the_whole_array(monkeypatch):
    """The report's RMSE, max error and cosine are summed over slices (bounded memory on an 8B model's
    embedding) and equal the whole-array figures."""
    from llmkit.quant.quality import stats

    rng = np.random.default_rng(3)
    a = rng.standard_normal(10_001).astype(np.float32)
    b = a + rng.standard_normal(a.size).astype(np.float32) * 0.05
    A, B = a.astype(np.float64), b.astype(np.float64)
    want = (np.sqrt(np.mean((A - B) ** 2)), np.abs(A - B).max(), A @ B / np.linalg.norm(A) / np.linalg.norm(B))
    monkeypatch.setattr(stats, "STATS_SLICE", 1000)
    np.testing.assert_allclose(stats.error_stats(a, b), want, rtol=1e-12)
    assert stats.error_stats(a, a)[:2] == (0.0, 0.0)
