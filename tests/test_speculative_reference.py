"""llama-cpp-python's own `draft_model` hook, run for real: its acceptance on a fixed target p and
draft q is sample-and-match's sum(p*q), below llmkit's rejection sampling's sum(min(p, q))."""

import numpy as np
import pytest

from llmkit.llama.speculative import verify

llama_cpp = pytest.importorskip("llama_cpp")

P = np.array([0.4, 0.3, 0.2, 0.1])  # the target's distribution at every position (forced by a logits processor)
Q = np.array([0.3, 0.4, 0.2, 0.1])  # the draft's


def test_llama_cpp_python_draft_hook_accepts_sum_p_q(tmp_path):
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaDraftModel

    from ggufmake import write_tiny_llama

    class SampleFromQ(LlamaDraftModel):
        """Proposes one token drawn from Q; records (position, token) to score against what was kept."""

        def __init__(self):
            self.rng, self.proposed, self.accepted = np.random.default_rng(0), [], 0

        def __call__(self, input_ids, /, **kwargs):
            if self.proposed:
                pos, tok = self.proposed[-1]
                self.accepted += int(len(input_ids) > pos and input_ids[pos] == tok)
            x = int(self.rng.choice(len(Q), p=Q))
            self.proposed.append((len(input_ids), x))
            return np.array([x], dtype=np.intc)

    def force_p(input_ids, scores):
        out = np.full_like(scores, -np.inf)
        out[: len(P)] = np.log(P)
        return out

    draft = SampleFromQ()
    model = write_tiny_llama(tmp_path / "tiny.gguf", seed=1)
    llm = Llama(str(model), n_ctx=4096, n_batch=4096, draft_model=draft, seed=1, verbose=False)
    n, out = 2000, []
    for tok in llm.generate(llm.tokenize(b"the", add_bos=False), temp=1.0, top_k=0, top_p=1.0, min_p=0.0,
                            repeat_penalty=1.0, logits_processor=[force_p]):
        out.append(tok)
        if len(out) == n:
            break
    assert set(out) <= set(range(len(P)))
    freq = np.bincount(out, minlength=len(P)) / n
    assert freq == pytest.approx(P, abs=0.03)  # the hook's output follows the target: it is correct
    drafted = len(draft.proposed) - 1  # the last proposal was never scored
    rate = draft.accepted / drafted
    assert rate == pytest.approx(float((P * Q).sum()), abs=0.03)  # 0.29: sample-and-match

    rng = np.random.default_rng(1)  # llmkit's rejection rule on the same p, q
    acc = sum(verify([int(rng.choice(4, p=Q))], [Q], [P, P], rng)[0] for _ in range(5000)) / 5000
    assert acc == pytest.approx(float(np.minimum(P, Q).sum()), abs=0.02)  # 0.9
    assert acc > 2.5 * rate


@pytest.mark.slow  # ~10 s on an idle 2-core machine: 200 short generations on a 135M model
def test_rejection_sampling_keeps_a_real_models_distribution():
    """The packaged SmolLM2-135M (a trained model, not random weights), prompt-lookup drafts (q one-hot):
    the first emitted token at temperature 1.5 follows the target's own distribution (chi-square)."""
    from llmkit.llama.generate import Generator
    from llmkit.llama.runtime import ModelOptions, default_model_path, open_model
    from llmkit.llama.sampling import SamplingParams, distribution
    from chisquare import CHI2_DF5_P001, chi2

    target = open_model(default_model_path(), ModelOptions(n_ctx=256, n_threads=1))
    prompt = target.tokenize(b"The capital of France is Paris. The capital of Italy is Rome. The capital of France is",
                             add_bos=False)
    params = SamplingParams(temp=1.5, top_k=6, top_p=1.0, min_p=0.0)
    from llmkit.llama.cache import eval_logits

    target.reset()
    p = distribution(eval_logits(target, prompt)[0], params, prompt)
    counts = np.zeros(len(p))
    drafted = 0
    for seed in range(200):
        params.seed = seed
        g = Generator(target, params, lookup=4, adaptive=False, draft_max=2, ignore_eos=True)
        _, st = g.run(prompt, 2, reuse_cache=True)  # the prompt's KV stays: [last token] + 1 draft evaluated
        drafted += st.drafted
        counts[g.generated[0]] += 1
    assert drafted >= 200  # a draft (" Paris" ...) was proposed every time
    assert np.count_nonzero(p) == 6 and 0.05 < p.max() < 0.95  # a real choice among six tokens
    assert chi2(counts, p) < CHI2_DF5_P001
