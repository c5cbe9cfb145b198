"""KV slot benchmark (not a test): time to first token with re-prefill vs restoring a saved slot.

    python benchmarks/kv_bench.py [-m MODEL.gguf] [--tokens 1200]

Uses the packaged SmolLM2-135M-Instruct by default; compares the slot file size with the KV
bytes `llmkit kv plan` computes for the same number of tokens.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main():
    from llmkit.kv.plan import plan
    from llmkit.kv.slots import restore_slot, save_slot
    from llmkit.llama import runtime
    from llmkit.llama.generate import Generator
    from llmkit.llama.sampling import SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--tokens", type=int, default=1200)
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    a = ap.parse_args()
    path = a.model or runtime.default_model_path()
    opts = runtime.ModelOptions(n_ctx=a.ctx)
    model = runtime.open_model(path, opts)
    rules = "".join(f"Rule {i}: answer in one short sentence, cite rule {i}, and never invent facts.\n" for i in range(400))
    toks = model.tokenize(rules.encode(), add_bos=True, special=True)[: a.tokens]
    question = model.tokenize(b"\nQuestion: what is a hash map?\nAnswer:", add_bos=False)
    prompt = toks + question
    gen = Generator(model, SamplingParams(temp=0))
    _, cold = gen.run(prompt, 8)  # re-prefill everything
    _, cold = gen.run(prompt, 8)
    from llmkit.llama.cache import eval_no_logits

    model.reset()
    eval_no_logits(model, toks)
    slot = os.path.join(tempfile.mkdtemp(), "system.slot")
    save_slot(model, slot, path, opts)
    t = time.perf_counter()
    restore_slot(model, slot, path, opts)
    t_restore = time.perf_counter() - t
    _, warm = gen.run(prompt, 8, reuse_cache=True)
    p = plan(path, a.ctx)
    kv_for_tokens = p.kv_bytes_per_token * len(toks)
    print(f"model {os.path.basename(path)}, cached prompt {len(toks)} tokens + question {len(question)}")
    print(f"TTFT re-prefill {cold.ttft_s * 1000:.0f} ms   restore {t_restore * 1000:.0f} ms + TTFT {warm.ttft_s * 1000:.0f} ms "
          f"(reused {warm.prefill_reused})   speed-up {cold.ttft_s / (t_restore + warm.ttft_s):.1f}x")
    print(f"slot file {os.path.getsize(slot) / 2**20:.2f} MiB vs plan's KV bytes for {len(toks)} tokens "
          f"{kv_for_tokens / 2**20:.2f} MiB (ratio {os.path.getsize(slot) / kv_for_tokens:.3f})")


if __name__ == "__main__":
    main()
