"""KL divergence like llama-perplexity: the packing, the file format by a round trip, the formulas
against a float64 reference from the full-precision logits. The comparison with llama.cpp's own
llama-perplexity (byte-identical base files, the same printed statistics) is in
test_quant_ppl_reference.py."""

import json
import math

import numpy as np
import pytest

from conftest import run_cli

pytest.importorskip("llama_cpp")
from ggufmake import write_tiny_llama  # noqa: E402

N_CTX = 128


@pytest.fixture(scope="module")
def setup(tmp_path_factory, kernel_small):
    d = tmp_path_factory.mktemp("kld")
    base = write_tiny_llama(d / "base.gguf", seed=5, n_embd=64, n_ff=128, n_ctx=512)
    for t in ("Q8_0", "Q4_0"):
        r = run_cli(["quant", str(base),"--type", t, "-o", str(d / f"{t}.gguf"), "--pure"])
        assert r.exit_code == 0, r.stderr
    text = d / "text.txt"
    text.write_text(kernel_small.read_text(encoding="utf-8")[:6000])
    return d, base, text


def test_pack_round_trip_within_half_a_level():
    from llmkit.quant.quality.kld import pack, row_width, unpack

    rng = np.random.default_rng(0)
    L = (rng.standard_normal((5, 301)) * 6).astype(np.float32)
    rows = pack(L)
    assert rows.shape == (5, row_width(301)) and rows.dtype == np.uint16 and row_width(301) == 306
    lp = unpack(rows, 301)
    ref = L - (L.max(axis=1, keepdims=True) + np.log(np.exp(L - L.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True)))
    scale = np.ascontiguousarray(rows[:, :4]).view(np.float32)[:, 0]
    floor = L.max(axis=1) - 16
    above = L > np.maximum(L.min(axis=1), floor)[:, None]
    assert np.all(np.abs(lp - ref)[above] <= (0.5 * scale[:, None] + 1e-5).repeat(301, 1)[above])


def test_base_file_round_trip(setup, tmp_path):
    from llmkit.quant.quality.kld import read_header
    from llmkit.quant.quality.scoring import Scorer, tokens_for

    d, base, text = setup
    out = tmp_path / "base.kld"
    r = run_cli(["quant", "ppl", "-m", str(base), "--save-logits", str(out), str(text), "-c", str(N_CTX), "--json"])
    assert r.exit_code == 0, r.stderr
    hdr = read_header(str(out))
    with Scorer(str(base), N_CTX) as s:
        toks = tokens_for(s, text.read_text())
        n_vocab = s.n_vocab
    assert (hdr.n_ctx, hdr.n_vocab, hdr.n_chunk) == (N_CTX, n_vocab, len(toks) // N_CTX)
    assert np.array_equal(hdr.tokens, toks)
    ppl = json.loads(r.stdout)["ppl"]
    plain = run_cli(["quant", "ppl", "-m", str(base), str(text), "-c", str(N_CTX), "--json"])
    # the same logits; only the float (base file) vs double (plain) log-softmax of llama-perplexity
    assert json.loads(plain.stdout)["ppl"] == pytest.approx(ppl, rel=1e-6)


def _reference(d, base, qpath, text):
    """Mean KLD, same-top share and PPL(Q) in float64 from full-precision logits of both models."""
    from llmkit.quant.quality.scoring import Scorer, tokens_for

    with Scorer(str(base), N_CTX) as sb, Scorer(str(qpath), N_CTX) as sq:
        toks = tokens_for(sb, text.read_text())
        both = list(zip(sb.chunks(toks), sq.chunks(toks)))
    kl, same, nll = [], 0, []
    for (i, lb), (_, lq) in both:
        chunk = toks[i * N_CTX:(i + 1) * N_CTX]
        lb, lq = lb.astype(np.float64), lq.astype(np.float64)
        pb = lb - np.logaddexp.reduce(lb, axis=1, keepdims=True)
        pq = lq - np.logaddexp.reduce(lq, axis=1, keepdims=True)
        kl.extend((np.exp(pb) * (pb - pq)).sum(axis=1))
        same += int((lb.argmax(1) == lq.argmax(1)).sum())
        t = chunk[N_CTX // 2 + 1:]
        nll.extend(-pq[np.arange(len(t)), t])
    return float(np.mean(kl)), same / len(kl), math.exp(np.mean(nll)), len(kl)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_kld_matches_a_full_precision_reference(setup, tmp_path, qtype):
    d, base, text = setup
    kfile = tmp_path / "base.kld"
    assert run_cli(["quant", "ppl", "-m", str(base), "--save-logits", str(kfile), str(text), "-c", str(N_CTX)]).exit_code == 0
    q = d / f"{qtype}.gguf"
    r = run_cli(["quant", "ppl", "-m", str(q), "--kld", str(kfile), "--json"])
    assert r.exit_code == 0, r.stderr
    got = json.loads(r.stdout)
    kl, same, ppl, n = _reference(d, base, q, text)
    assert got["count"] == n
    # only the uint16 packing of the base separates us from the reference
    assert got["kld"]["mean"] == pytest.approx(kl, rel=0.02, abs=2e-5)
    assert got["same_top_p"]["value"] == pytest.approx(same, abs=1.5 / n)
    assert got["ppl"]["value"] == pytest.approx(ppl, rel=1e-5)
    assert got["kld"]["p99"] >= got["kld"]["p90"] >= got["kld"]["p50"] >= got["kld"]["p1"]
    assert got["kld"]["uncertainty"] > 0 and -1 <= got["correlation"] <= 1
    # the base against itself: nothing but the packing
    me = json.loads(run_cli(["quant", "ppl", "-m", str(base), "--kld", str(kfile), "--json"]).stdout)
    assert me["kld"]["mean"] < 1e-4 and me["same_top_p"]["value"] > 0.999  # near-ties can share a level
    # the file floors log-probabilities at (max logit - 16): on this random model many true tokens lie
    # below it, so PPL(base) read back is lower than the model's own (llama-perplexity's file does this too)
    assert me["ppl_base"]["value"] <= me["ppl"]["value"] * (1 + 1e-6)


def test_bad_base_files(setup, tmp_path):
    d, base, text = setup
    kfile = tmp_path / "base.kld"
    assert run_cli(["quant", "ppl", "-m", str(base), "--save-logits", str(kfile), str(text), "-c", str(N_CTX)]).exit_code == 0
    other = write_tiny_llama(tmp_path / "other.gguf", seed=1, extra_tokens=("Ġt", "he", "Ġthe", "Ġa"),
                             merges=(("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a")))
    r = run_cli(["quant", "ppl", "-m", str(other), "--kld", str(kfile)])
    assert r.exit_code == 1 and "vocabulary" in r.stderr
    cut = tmp_path / "cut.kld"
    cut.write_bytes(kfile.read_bytes()[:-100])
    r = run_cli(["quant", "ppl", "-m", str(base), "--kld", str(cut)])
    assert r.exit_code == 1 and "truncated" in r.stderr
    junk = tmp_path / "junk.kld"
    junk.write_bytes(b"not a logits file at all")
    r = run_cli(["quant", "ppl", "-m", str(base), "--kld", str(junk)])
    assert r.exit_code == 1 and "_logits_" in r.stderr
    short = tmp_path / "short.txt"
    short.write_text("too short")
    r = run_cli(["quant", "ppl", "-m", str(base), "--save-logits", str(tmp_path / "x.kld"), str(short)])
    assert r.exit_code == 1 and "fewer than one chunk" in r.stderr
    assert not (tmp_path / "x.kld").exists()
