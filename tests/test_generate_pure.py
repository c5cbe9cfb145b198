"""Pure sampling and speculative-decoding functions (numpy only: runs without llama_cpp)."""

import numpy as np
import pytest

from chisquare import CHI2_DF5_P001, chi2
from llmkit.llama.sampling import SamplingParams, distribution, sample
from llmkit.llama.speculative import expected_tokens, lookup_draft, verify, verify_greedy, verify_sample_and_match

def test_distribution_known_answers():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert distribution(logits, SamplingParams(temp=1, top_k=0, top_p=1, min_p=0)) == pytest.approx([0.5, 0.3, 0.15, 0.05])
    assert distribution(logits, SamplingParams(temp=1, top_k=2, top_p=1, min_p=0)) == pytest.approx([0.625, 0.375, 0, 0])
    assert distribution(logits, SamplingParams(temp=1, top_k=0, top_p=0.75, min_p=0)) == pytest.approx([0.625, 0.375, 0, 0])
    assert distribution(logits, SamplingParams(temp=1, top_k=0, top_p=1, min_p=0.2)) == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])
    assert distribution(logits, SamplingParams(temp=0)).tolist() == [1, 0, 0, 0]


def test_rejection_sampling_preserves_target_distribution():
    """Over many seeded draws the first emitted token follows p exactly, for any draft q and K. The
    fixed q far from p makes a wrong residual visible (resampling from max(0, p - q/2) instead of
    max(0, p - q) gives a chi-square of ~360 here); random drafts average such errors away."""
    rng = np.random.default_rng(123)
    p_first = np.array([0.35, 0.25, 0.2, 0.1, 0.07, 0.03])
    fixed = np.array([0.05, 0.1, 0.15, 0.2, 0.25, 0.25])
    for k, draft_q in ((1, fixed), (1, None), (3, None)):
        counts = np.zeros(6)
        for _ in range(20000):
            qs = [draft_q if draft_q is not None else rng.dirichlet(np.ones(6)) for _ in range(k)]
            ps = [p_first] + [rng.dirichlet(np.ones(6)) for _ in range(k)]
            draft = [sample(q, rng) for q in qs]
            n_acc, nxt = verify(draft, qs, ps, rng)
            first = draft[0] if n_acc > 0 else nxt
            counts[first] += 1
        assert chi2(counts, p_first) < CHI2_DF5_P001


def test_rejection_sampling_accepts_more_than_sample_and_match():
    rng = np.random.default_rng(5)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.3, 0.4, 0.2, 0.1])
    acc_rs = acc_sm = 0
    for _ in range(20000):
        x = sample(q, rng)
        acc_rs += verify([x], [q], [p, p], rng)[0]
        acc_sm += verify_sample_and_match([x], [p, p], rng)[0]
    assert acc_rs / 20000 == pytest.approx(np.minimum(p, q).sum(), abs=0.02)  # 0.9
    assert acc_sm / 20000 == pytest.approx((p * q).sum(), abs=0.02)  # 0.29
    assert acc_rs > 2 * acc_sm


def test_greedy_verify_is_argmax_match():
    one = lambda i: np.eye(5)[i]  # noqa: E731
    rng = np.random.default_rng(0)
    assert verify([1, 2, 3], [one(1), one(2), one(3)], [one(1), one(2), one(3), one(4)], rng) == (3, 4)
    assert verify([1, 2, 3], [one(1), one(2), one(3)], [one(1), one(0), one(3), one(4)], rng) == (1, 0)


@pytest.mark.parametrize("seed", range(20))
def test_verify_greedy_equals_rejection_sampling_on_one_hot_distributions(seed):
    """The greedy shortcut (argmax of the logits, no distributions) accepts and continues exactly as
    rejection sampling does with greedy p and one-hot q, ties included (the first maximum wins)."""
    rng = np.random.default_rng(seed)
    vocab, k = 6, int(rng.integers(0, 5))
    logits = rng.integers(0, 3, (k + 1, vocab)).astype(np.float32)  # few values: many ties
    best = logits.argmax(axis=1)
    drafts = [int(best[i]) if rng.random() < 0.6 else int(rng.integers(vocab)) for i in range(k)]
    greedy = SamplingParams(temp=0)
    ps = [distribution(row, greedy) for row in logits]
    qs = [np.eye(vocab)[x] for x in drafts]
    assert verify_greedy(drafts, logits) == verify(drafts, qs, ps, rng)


def test_lookup_and_expected_tokens():
    assert lookup_draft([1, 2, 3, 4, 1, 2], 2, 2) == [3, 4]
    assert lookup_draft([1, 2, 3], 2, 2) == []
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0


def test_draft_min_above_zero_always_drafts_like_llama_cpp():
    """--draft-min 0 lets the chooser skip drafting where a batch costs as much as its tokens; with
    --draft-min N >= 1 it drafts at least N every round (llama.cpp's meaning), N = --draft-max is fixed."""
    from llmkit.llama.draft import DraftLengthChooser

    def linear(c):  # verifying b tokens costs b single steps: drafting never pays
        for b in range(1, 10):
            c.observe_batch(b, 0.01 * b)
        c.observe_draft(0.002)
        c.observe_acceptance(1, 10)
        return c

    assert linear(DraftLengthChooser(0, 8, adaptive=True)).choose(100) == 0
    assert 2 <= linear(DraftLengthChooser(2, 8, adaptive=True)).choose(100) <= 8
    assert linear(DraftLengthChooser(4, 4, adaptive=True)).choose(100) == 4
    assert DraftLengthChooser(3, 8, adaptive=True).choose(100) >= 3  # nothing measured yet: still drafts


@pytest.mark.parametrize("seed", range(40))
def test_ngram_index_drafts_what_the_scan_drafts(seed):
    """The incremental n-gram index proposes exactly what scanning the whole context proposes, as the
    context grows and after a cut (context shift, then reset)."""
    from llmkit.llama.speculative import NgramIndex

    rng = np.random.default_rng(seed)
    n_max = int(rng.integers(1, 5))
    ix, toks = NgramIndex(n_max), [int(t) for t in rng.integers(0, 5, 3)]
    for step in range(80):
        k = int(rng.integers(1, 6))
        assert ix.draft(toks, k) == lookup_draft(toks, n_max, k), (step, toks)
        toks += [int(t) for t in rng.integers(0, 5, int(rng.integers(1, 4)))]
        if step == 40:
            del toks[2:len(toks) // 2]
            ix.reset()


@pytest.mark.parametrize("seed", range(10))
def test_ngram_index_of_a_whole_prompt_equals_one_token_at_a_time(seed):
    """Indexing a prompt in one call (as prefill does) builds the same tables as extending by one token
    at a time, and the rounds after it extend it the same way."""
    from llmkit.llama.speculative import NgramIndex

    rng = np.random.default_rng(seed)
    n_max = int(rng.integers(1, 6))
    toks = [int(t) for t in rng.integers(0, 4, 300)]
    bulk, step = NgramIndex(n_max), NgramIndex(n_max)
    bulk.extend(toks[:250])
    for i in range(1, 251):
        step.extend(toks[:i])
    assert bulk.starts == step.starts
    for i in range(251, 301, 7):
        assert bulk.draft(toks[:i], 4) == step.draft(toks[:i], 4) == lookup_draft(toks[:i], n_max, 4)
    assert bulk.starts == step.starts


def test_linear_batch_costs_never_probe_and_flat_ones_draft():
    """Where verifying b tokens costs b steps no acceptance rate could pay for drafting, so the chooser
    never drafts or probes, however long it runs; where a batch costs one step it drafts; a catch-up
    is spread over the tokens still to generate (a long one is not worth it for the last few)."""
    from llmkit.llama.draft import DraftLengthChooser

    lin = DraftLengthChooser(0, 8, adaptive=True)
    lin.observe_batch(1, 0.01)
    lin.observe_batch(9, 0.09)
    chosen = []
    for _ in range(2000):
        chosen.append(lin.choose(400, behind=300))
        lin.rounds_without_draft += 1
    assert set(chosen) == {0}
    flat = DraftLengthChooser(0, 8, adaptive=True, draft_cost_ratio=0.1)
    flat.observe_batch(1, 0.01)
    flat.observe_batch(9, 0.011)
    flat.observe_round(0.01 * 2000, 2000, 0)  # a long run so far: a loss budget that covers a catch-up
    assert flat.choose(400) > 0
    assert flat.choose(400, behind=500) > 0 and flat.choose(2, behind=500) == 0


def test_drafting_is_held_to_a_loss_budget_that_grows_with_the_run():
    """On costs like a 2-core CPU's (T(2) = 1.72 T(1)) a run does not gamble its first tokens on a guessed
    acceptance rate: it drafts once the plain steps so far make the worst case (every draft rejected)
    a small share of them, and rounds that lost count against the budget until the run grows. Where a
    batch costs about one step the budget allows drafting after a few tokens; --draft-min 1 always drafts."""
    from llmkit.llama.draft import DraftLengthChooser

    cpu = [1.00, 1.72, 2.09, 2.22, 2.86, 3.36, 3.78, 4.53, 5.0]

    def chooser(costs, k_min=0):
        c = DraftLengthChooser(k_min, 8, adaptive=True, draft_cost_known_zero=True)
        for b, t in enumerate(costs, 1):
            c.observe_batch(b, 0.1 * t)
        return c

    c = chooser(cpu)
    c.observe_round(0.1, 1, 0)
    assert c.choose(500) == 0  # one token in: no budget for a round that may lose 0.72 steps
    c.observe_round(0.1 * 60, 60, 0)
    k = c.choose(500)
    assert k >= 1
    c.observe_round(0.1 * cpu[k], 1, k)  # every draft rejected
    assert c.loss == pytest.approx(0.1 * (cpu[k] - 1))
    assert c.choose(500) == 0  # the budget is spent until the run grows
    assert chooser(cpu, k_min=1).choose(500) >= 1
    cheap = chooser([1 + 0.02 * i for i in range(9)])
    cheap.observe_round(0.1 * 8, 8, 0)
    assert cheap.choose(500) >= 1
