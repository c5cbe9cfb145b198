"""Generation rows for run.py (not a test): llmkit's decoding loop vs plain llama-cpp-python, speculation.

    scripts/fetch_models.sh                         # once, for the Qwen rows (models/)
    python benchmarks/run.py --area generate [--quick]

- Plain decoding, SmolLM2-135M (packaged), greedy, 1 thread: llama-cpp-python `create_completion`
  (streamed) and llmkit's `Generator`, each in its own child process, alternating, >= 3 runs. Both
  sides: the prompt tokenized before the clock, one short untimed warm-up generation, the cache
  reset, then one timed generation. From the same timestamps on both sides: the rate AFTER the
  first token ((n - 1) / (last token - first token): decoding only) and the rate from the request
  to the last token (n / total: prefill included), and the time to the first token.
- Speculative decoding and prompt lookup (Qwen2.5-Coder 1.5B target, 0.5B draft; only with
  models/ from scripts/fetch_models.sh): llmkit against llmkit plain decoding in one process, modes
  interleaved over >= 3 rounds; decode rate after prefill for every mode; acceptance; the verify
  cost curve T(b)/T(1); bytes read per second against this machine's measured read bandwidth.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Cmd, Row, Stat, cmds_of, compare, field_stat, ratio, run_once  # noqa: E402

ME = os.path.abspath(__file__)
# the speculative pair; the environment may name another target/draft pair sharing a vocabulary
QWEN_S = os.environ.get("LLMKIT_BENCH_DRAFT", os.path.join(ROOT, "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
QWEN_L = os.environ.get("LLMKIT_BENCH_TARGET", os.path.join(ROOT, "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
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
PROMPTS = {"code-edit": CODE_PROMPT, "write": STORY_PROMPT}


def rates(t0: float, t_first: float, t_end: float, n: int) -> dict:
    """The same three figures for both sides, from request time, first-token time and last-token time."""
    return {"after_first": (n - 1) / (t_end - t_first) if n > 1 else 0.0, "incl_prefill": n / (t_end - t0),
            "ttft_ms": 1000 * (t_first - t0), "n": n}


def plain_child(impl: str, model: str, prompt_name: str, n: int, threads: int) -> None:
    prompt = PROMPTS[prompt_name]
    if impl == "llama-cpp-python":
        import llama_cpp

        # n_threads_batch too: llama-cpp-python's default (every core) would give its prefill more
        # threads than llmkit's -t gives both phases
        m = llama_cpp.Llama(model, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
        toks = m.tokenize(prompt.encode(), add_bos=False, special=True)
        m.create_completion(toks, max_tokens=4, temperature=0)  # warm-up
        m.reset()
        t0 = time.perf_counter()
        t_first, k, finish = 0.0, 0, None
        for chunk in m.create_completion(toks, max_tokens=n, temperature=0, stream=True):
            finish = chunk["choices"][0].get("finish_reason")
            if finish is None:  # one chunk per token; the last chunk only carries the finish reason
                k += 1
                if k == 1:
                    t_first = time.perf_counter()
        t_end = time.perf_counter()
        print(json.dumps(rates(t0, t_first, t_end, n if finish == "length" else k)))
        return
    from llmkit.llama.generate import Generator
    from llmkit.llama.runtime import ModelOptions, open_model
    from llmkit.llama.sampling import SamplingParams

    m = open_model(model, ModelOptions(n_ctx=2048, n_threads=threads))
    toks = m.tokenize(prompt.encode(), add_bos=False, special=True)
    g = Generator(m, SamplingParams(temp=0), ignore_eos=False)
    g.run(toks, 4)  # warm-up
    t0 = time.perf_counter()
    _, st = g.run(toks, n)
    t_end = time.perf_counter()
    # st.ttft_s counts from the start of prefill, which run() begins right after t0
    print(json.dumps(rates(t0, t0 + st.ttft_s, t_end, st.generated_tokens)))


def modes_child(prompt_name: str, n: int, threads: int, rounds: int) -> None:
    from llmkit.kv.plan import measure_read_bandwidth
    from llmkit.llama.generate import Generator
    from llmkit.llama.runtime import ModelOptions, open_model
    from llmkit.llama.sampling import SamplingParams

    tgt = open_model(QWEN_L, ModelOptions(n_ctx=2048, n_threads=threads))
    dft = open_model(QWEN_S, ModelOptions(n_ctx=2048, n_threads=threads))
    toks = tgt.tokenize(PROMPTS[prompt_name].encode(), add_bos=False, special=True)
    modes = {"plain": {}, "draft 0.5B K=4": dict(draft=dft, adaptive=False), "draft 0.5B adaptive": dict(draft=dft),
             "lookup 3 K=4": dict(lookup=3, adaptive=False), "lookup 3 adaptive": dict(lookup=3)}
    runs: dict = {k: [] for k in modes}
    for _ in range(rounds):
        for label, kw in modes.items():
            g = Generator(tgt, SamplingParams(temp=0), draft_max=4, ignore_eos=True, **kw)
            _, st = g.run(toks, n)
            runs[label].append(st)
    out = {}
    for label, sts in runs.items():
        tps = [s.tokens_per_s for s in sts]
        med = sorted(sts, key=lambda s: s.tokens_per_s)[len(sts) // 2]
        out[label] = {"tps": [statistics.median(tps), min(tps), max(tps), len(tps)], "accept": med.acceptance,
                      "per_step": med.accepted / med.target_steps if med.target_steps else 0.0}
    tgt.reset()
    tgt.eval(toks)
    base, curve = tgt.n_tokens, {}
    for b in range(1, 9):
        ts = []
        for _ in range(3):
            tgt.n_tokens = base
            t = time.perf_counter()
            tgt.eval(toks[:b])
            ts.append(time.perf_counter() - t)
        curve[b] = min(ts)
    out["curve"] = {b: curve[b] / curve[1] for b in curve}
    out["t1_ms"] = 1000 * curve[1]
    out["bandwidth_gbs"] = measure_read_bandwidth()
    print(json.dumps(out))


def child(argv):
    if argv[0] == "plain":
        plain_child(argv[1], argv[2], argv[3], int(argv[4]), int(argv[5]))
    elif argv[0] == "modes":
        modes_child(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
    else:
        raise SystemExit(f"unknown child {argv[0]}")


def rows(cfg):
    from llmkit.llama.runtime import default_model_path

    smol = default_model_path()
    n = cfg.pick(128, 48, 8)
    out = []
    for threads in (1, 2):
        sides = [Cmd(impl, [PY, ME, "plain", impl, smol, "write", n, threads]) for impl in ("llama-cpp-python", "llmkit")]
        runs = compare(sides, cfg, warmup=False, min_runs=cfg.pick(5, 3, 3))
        f = {c.label: {k: field_stat(runs[c.label], k) for k in ("after_first", "incl_prefill", "ttft_ms")} for c in sides}
        toks = {c.label: sorted({r.report["n"] for r in runs[c.label]}) for c in sides}
        a, b = f["llama-cpp-python"], f["llmkit"]
        out.append(Row(f"gen-plain-smollm2-t{threads}", f"SmolLM2-135M Q4_1, greedy, {n} tokens, {threads} thread(s), "
                       "in-process: decode rate after the first token; rate including prefill; time to first token",
                       f"{a['after_first'].fmt('tok/s', 1)}; {a['incl_prefill'].fmt('tok/s', 1)}; "
                       f"TTFT {a['ttft_ms'].fmt('ms', 0)}",
                       f"{b['after_first'].fmt('tok/s', 1)}; {b['incl_prefill'].fmt('tok/s', 1)}; "
                       f"TTFT {b['ttft_ms'].fmt('ms', 0)}",
                       f"decode {ratio(b['after_first'].median, a['after_first'].median)}, incl. prefill "
                       f"{ratio(b['incl_prefill'].median, a['incl_prefill'].median)} of llama-cpp-python",
                       f"tokens generated: llama-cpp-python {toks['llama-cpp-python']}, llmkit {toks['llmkit']}",
                       cmds_of(*sides)))
    if not (os.path.exists(QWEN_S) and os.path.exists(QWEN_L)):
        out.append(Row.skipped("gen-spec-qwen", "speculative decoding / lookup, Qwen2.5-Coder 1.5B + 0.5B",
                               "models/ missing: run scripts/fetch_models.sh"))
        return "llmkit generate vs llama-cpp-python", [f"model: {smol}"], out
    for name in cfg.pick(["code-edit", "write"], ["code-edit", "write"], ["code-edit"]):
        c = Cmd("llmkit modes", [PY, ME, "modes", name, cfg.pick(48, 24, 8), 1, cfg.pick(3, 3, 1)])
        rep = run_once(c).report
        base = rep["plain"]["tps"][0]
        for label in ("plain", "draft 0.5B K=4", "draft 0.5B adaptive", "lookup 3 K=4", "lookup 3 adaptive"):
            r = rep[label]
            st = Stat(*r["tps"])
            out.append(Row(f"gen-qwen-{name}-{label.replace(' ', '-').replace('=', '').replace('.', '').lower()}",
                           f"Qwen2.5-Coder-1.5B {name}, {label}: decode tok/s after prefill (in-process, modes "
                           "interleaved)", "plain decoding" if label != "plain" else "–", st.fmt("tok/s", 1),
                           f"{st.median / base:.2f}× plain", f"acceptance {100 * r['accept']:.0f}%, accepted per "
                           f"target step {r['per_step']:.2f}" if label != "plain" else "", cmds_of(c)))
        size = os.path.getsize(QWEN_L)
        out.append(Row(f"gen-qwen-{name}-verify-cost", "verify cost T(b)/T(1), b = 1…8; bandwidth wall", "–",
                       "  ".join(f"{b}:{v:.2f}" for b, v in rep["curve"].items()) + f" (T(1) {rep['t1_ms']:.0f} ms)",
                       "–", f"plain reads {size * base / 1e9:.1f} GB/s of {rep['bandwidth_gbs']:.1f} GB/s measured",
                       cmds_of(c)))
    return "llmkit generate vs llama-cpp-python; speculation", [f"SmolLM2: {smol}"], out


if __name__ == "__main__":
    child(sys.argv[1:])
