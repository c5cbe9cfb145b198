"""The budget's sensitivity probes: a tensor's rounding error injected through llama.cpp's eval
callback gives the logits of a model file holding the rounded weights (matrix products and the
embedding lookup), the model's own text is reproducible, and a budget without calibration text
probes on it (cached for the next budget)."""

import json
import shutil

import numpy as np
import pytest

from conftest import run_cli

pytest.importorskip("llama_cpp")
from ggufmake import write_tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe")
    return write_tiny_llama(d / "m.gguf", seed=5, n_embd=128, n_ff=256, n_layer=2, n_head=4, n_head_kv=2, tied=True)


def _rounded_copy(src, dst, kind):
    """A copy of an F32 model whose tensors of `kind` hold their 4-bit rounded weights."""
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.budget.probe import round_error
    from llmkit.quant.plan import rules

    shutil.copy(src, dst)
    g = read_gguf(str(dst))
    mm = np.memmap(dst, np.uint8, "r+")
    names = []
    for t in g.tensors:
        if rules.category(t.name) == kind and len(t.shape) == 2:
            w = mm[g.data_offset + t.offset:g.data_offset + t.offset + t.nbytes].view("<f4").reshape(t.shape[1], t.shape[0])
            w += round_error(np.array(w))
            names.append(t.name)
    mm.flush()
    del mm
    return names


def _logits(path, seqs, names=(), imatrix=None):
    from llmkit.llama import runtime
    from llmkit.llama.evalcb import Decoder
    from llmkit.quant.budget.probe import _Injector

    n = sum(len(s) for s in seqs)
    llm = runtime.open_model(str(path), runtime.ModelOptions(n_ctx=n, n_batch=n, n_threads=1))
    inject = _Injector(str(path), imatrix)
    try:
        with Decoder(llm, n, len(seqs), 1, callback=inject) as dec:
            inject.active = frozenset(names)
            return dec.evaluate(seqs), inject.error
    finally:
        inject.close()
        llm.close()


@pytest.mark.parametrize("kind", ["ffn_down", "attn_v", "token_embd"])
def test_injected_error_equals_a_model_holding_the_rounded_weights(tiny, tmp_path, kind):
    """token_embd (tied: the embedding lookup and the output product) covers GET_ROWS and MUL_MAT."""
    seqs = [[256, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100], [256, 84, 104, 101, 32, 99, 97, 116]]
    names = _rounded_copy(tiny, tmp_path / "r.gguf", kind)
    assert names
    clean, _ = _logits(tiny, seqs)
    injected, err = _logits(tiny, seqs, names)
    rounded, _ = _logits(tmp_path / "r.gguf", seqs)
    scale = np.abs(rounded).max()
    assert np.abs(injected - rounded).max() < 1e-4 * scale
    assert np.abs(injected - clean).max() > 100 * np.abs(injected - rounded).max()  # the change is real
    # the recorded error is the rounded tensors' squared error (no imatrix: unit column weights)
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.formats import load_f32

    g, gr = read_gguf(str(tiny)), read_gguf(str(tmp_path / "r.gguf"))
    with open(tiny, "rb") as f, open(tmp_path / "r.gguf", "rb") as fr:
        for t, tr in zip(g.tensors, gr.tensors):
            if t.name in names:
                want = float(((load_f32(fr, tr, gr.data_offset).astype(np.float64) - load_f32(f, t, g.data_offset)) ** 2).sum())
                # the embedding table's error is estimated from up to 4096 rows (here: all of them)
                assert err[t.name] == pytest.approx(want, rel=1e-5)


def test_the_models_own_text_is_reproducible(tmp_path):
    from llmkit.llama import runtime
    from llmkit.quant.calibration.selfgen import sample_sequences, text_sequences

    m = write_tiny_llama(tmp_path / "u.gguf", seed=5, n_embd=128, n_ff=256, n_layer=2, logit_scale=1.0)
    llm = runtime.open_model(str(m), runtime.ModelOptions(n_ctx=64, n_threads=1))
    try:
        a = sample_sequences(llm, 3, 10, seed=1, threads=1)
        b = sample_sequences(llm, 3, 10, seed=1, threads=1)
        c = sample_sequences(llm, 3, 10, seed=2, threads=1)
        t = text_sequences(llm, "the cat sat on the mat and looked at the hat " * 4, 2, 9)
    finally:
        llm.close()
    assert a == b and a != c
    assert all(len(s) == 10 and s[0] == 256 for s in a)  # from the document boundary (BOS)
    assert len({tuple(s) for s in a}) == 3  # sequences differ from each other
    assert len(t) == 2 and all(len(s) == 9 for s in t) and t[0] != t[1]


def test_budget_without_text_probes_on_the_models_own_text(tiny, tmp_path, monkeypatch):
    """No --calib: the probes run on self-written text; a second budget reuses them; the allocation
    weights the kinds by the measured KLD per unit of error (every kind probed, all positive)."""
    monkeypatch.setenv("LLMKIT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "b.gguf"
    r = run_cli(["quant", str(tiny), "--target-bpw", "4.5", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    a = json.loads(r.stdout)["allocation"]
    assert a["sensitivity_source"] == "probe" and a["probe_text"] == "the model's own text"
    assert set(a["sensitivity"]) == {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                                     "token_embd"}
    assert all(v > 0 for v in a["sensitivity"].values())
    assert "sensitivity probe on the model's own text" in r.stderr
    r = run_cli(["quant", str(tiny), "--target-bpw", "4.2", "-o", str(tmp_path / "c.gguf"), "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["allocation"]["sensitivity_source"] == "cached probe"
    from llmkit.llama import runtime

    llm = runtime.open_model(str(out), runtime.ModelOptions(n_ctx=64, n_threads=1))
    llm.close()
