"""Opt-in tests on real models assembled by scripts/fetch_models.sh (run: pytest -m realmodel).

They are deselected by default (see pyproject addopts) because the models are 1.6 GB.
"""

import os

import pytest

from llmkit.llama.sampling import SamplingParams

pytestmark = pytest.mark.realmodel
ROOT = os.path.join(os.path.dirname(__file__), "..", "models")
QWEN_S = os.path.join(ROOT, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
QWEN_L = os.path.join(ROOT, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")


@pytest.fixture(scope="module")
def pair():
    if not (os.path.exists(QWEN_S) and os.path.exists(QWEN_L)):
        pytest.fail("real models missing: run scripts/fetch_models.sh first")
    from llmkit.llama.runtime import ModelOptions, open_model

    return open_model(QWEN_L, ModelOptions(n_ctx=1024)), open_model(QWEN_S, ModelOptions(n_ctx=1024))


def test_qwen_pair_speculative_accepts_and_matches_tokenizer(pair):
    from llmkit import tokenize
    from llmkit.llama.generate import Generator

    target, draft = pair
    prompt = "<|im_start|>user\nWrite a Python function is_prime(n).<|im_end|>\n<|im_start|>assistant\n"
    toks = target.tokenize(prompt.encode(), add_bos=False, special=True)
    g = Generator(target, SamplingParams(temp=0), draft=draft, adaptive=False, draft_max=4, ignore_eos=True)
    text, st = g.run(toks, 32)
    assert st.acceptance > 0.5 and "def" in text
    ours = tokenize.load(QWEN_L)
    body = "def is_prime(n):\n    if n < 2:\n        return False  # 你好 🙂"
    assert ours.encode(body) == target.tokenize(body.encode(), add_bos=False, special=False)
