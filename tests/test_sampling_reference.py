"""llmkit's sampling distribution against llama.cpp's own sampler chain (llama-cpp-python's
`llama_sampler_*` API) on the same logits: the chain llama.cpp (llama-server, llama-cli) and
llama-cpp-python build by default is penalties -> top-k -> top-p -> min-p -> temperature -> dist."""

import ctypes

import numpy as np
import pytest

from llmkit.llama.sampling import SamplingParams, distribution

llama_cpp = pytest.importorskip("llama_cpp")

N_VOCAB = 300


def llama_cpp_distribution(logits, params: SamplingParams, history=()) -> np.ndarray:
    """What llama.cpp's dist sampler draws from: its chain applied, then softmax over the survivors."""
    lc = llama_cpp
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_penalties(len(logits), params.repeat_last_n,
                                                                      params.repeat_penalty, 0.0, 0.0))
    if params.greedy:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(0.0))  # keeps only the argmax
    else:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(params.top_k))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(params.top_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(params.min_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(params.temp))
    try:
        for t in history:  # what the chain has seen (llama-server feeds it the prompt and every output token)
            lc.llama_sampler_accept(chain, int(t))
        data = (lc.llama_token_data * len(logits))(*[lc.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits)])
        arr = lc.llama_token_data_array(data, len(logits), -1, False)
        lc.llama_sampler_apply(chain, ctypes.byref(arr))
        ids = np.array([data[i].id for i in range(arr.size)])
        kept = np.array([data[i].logit for i in range(arr.size)], dtype=np.float64)
    finally:
        lc.llama_sampler_free(chain)
    p = np.zeros(len(logits))
    e = np.exp(kept - kept.max())
    p[ids] = e / e.sum()
    return p


GRID = [
    SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0),
    SamplingParams(temp=0.7, top_k=0, top_p=1.0, min_p=0.0),
    SamplingParams(temp=1.3, top_k=20, top_p=1.0, min_p=0.0),
    SamplingParams(temp=0.5, top_k=0, top_p=0.9, min_p=0.0),
    SamplingParams(temp=2.0, top_k=0, top_p=0.5, min_p=0.0),
    SamplingParams(temp=0.6, top_k=0, top_p=1.0, min_p=0.1),
    SamplingParams(temp=1.8, top_k=0, top_p=1.0, min_p=0.02),
    SamplingParams(),  # llmkit's defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05
    SamplingParams(temp=1.5, top_k=50, top_p=0.8, min_p=0.05, repeat_penalty=1.3, repeat_last_n=16),
    SamplingParams(temp=0.9, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=0.8, repeat_last_n=64),
    SamplingParams(temp=0, repeat_penalty=1.5, repeat_last_n=8),
]


@pytest.mark.parametrize("params", GRID, ids=lambda p: f"t{p.temp}-k{p.top_k}-p{p.top_p}-m{p.min_p}-r{p.repeat_penalty}")
def test_distribution_equals_llama_cpp_sampler_chain(params):
    rng = np.random.default_rng(7)
    for trial in range(5):
        logits = (rng.standard_normal(N_VOCAB) * 3).astype(np.float32)  # float32, as llama.cpp holds them
        history = rng.integers(0, N_VOCAB, size=40).tolist()
        history += [int(np.argmax(logits)), int(np.argmin(logits))]  # penalise a positive and a negative logit
        ours = distribution(logits, params, history)
        ref = llama_cpp_distribution(logits, params, history)
        assert np.array_equal(ours > 0, ref > 0), (trial, np.flatnonzero(ours), np.flatnonzero(ref))
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)  # llama.cpp divides by temp in float32


def test_temperature_is_applied_after_truncation():
    """The order matters: at temp 0.5 top-p 0.9 keeps the set chosen on the untempered probabilities."""
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    p = distribution(logits, SamplingParams(temp=0.5, top_k=0, top_p=0.9, min_p=0.0))
    # untempered: 0.5 + 0.3 < 0.9 <= 0.5 + 0.3 + 0.15, so three tokens stay, then temp 0.5 squares the odds
    sq = np.array([0.25, 0.09, 0.0225])
    assert p == pytest.approx(list(sq / sq.sum()) + [0.0])
    np.testing.assert_allclose(p, llama_cpp_distribution(logits.astype(np.float32), SamplingParams(
        temp=0.5, top_k=0, top_p=0.9, min_p=0.0)), rtol=1e-6)
