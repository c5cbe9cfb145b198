"""Token sequences to run a model over when measuring it: cut from calibration text, or written by the
model itself when there is none (data-free calibration, as in LLM-QAT: the model's own samples stand
for the text it was trained on).

Self-written sequences start at the document boundary (BOS, or EOS where the vocabulary has no BOS:
what the model saw between training documents) and are sampled side by side in one batch per step,
temperature 1 with min-p 0.05 (the tail of the distribution cut, so a sampled token is one the model
finds plausible), from a seeded generator: the same model, seed and threads give the same tokens.
"""

from __future__ import annotations

import numpy as np

from llmkit.errors import BadInput


def text_sequences(llm, text: str, n_seq: int, n_tokens: int) -> list[list[int]]:
    """The first n_seq consecutive pieces of n_tokens tokens of `text` (each led by BOS where the
    model's prompts start with one)."""
    from llmkit.llama import runtime

    toks = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    bos = [llm.token_bos()] if runtime.add_bos(llm) else []
    body = n_tokens - len(bos)
    if len(toks) < body:
        raise BadInput(f"the calibration text has {len(toks)} tokens, fewer than one probe sequence of {n_tokens}; "
                       "give more text or shorter sequences.")
    return [bos + toks[i * body:(i + 1) * body] for i in range(min(n_seq, len(toks) // body))]


def sample_sequences(llm, n_seq: int, n_tokens: int, seed: int = 0, threads: int | None = None) -> list[list[int]]:
    """n_seq sequences of n_tokens tokens the model writes itself from the document boundary."""
    from llmkit.llama.evalcb import Decoder
    from llmkit.llama.sampling import SamplingParams, distribution, sample

    start = llm.token_bos() if llm.token_bos() >= 0 else llm.token_eos()
    if start < 0:
        raise BadInput("the model's vocabulary has neither a BOS nor an EOS token to start its own text from; "
                       "give calibration text.")
    params = SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.05)
    rng = np.random.default_rng(seed)
    seqs = [[start] for _ in range(n_seq)]
    with Decoder(llm, n_seq * n_tokens, n_seq, threads) as dec:
        for pos in range(n_tokens - 1):
            logits = dec.decode([(s[-1], pos, i, True) for i, s in enumerate(seqs)])
            for s, row in zip(seqs, logits):
                s.append(sample(distribution(row, params), rng))
    return seqs
