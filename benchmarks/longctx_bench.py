"""Long-context and speculative rows for run.py (not a test): memory against kv plan, a 20k-token prompt,
a 20k-token slot, and what --draft-model / --lookup cost as whole processes.

    scripts/fetch_models.sh                         # once, for the Qwen rows (models/)
    python benchmarks/run.py --area long [--quick] [--part contexts|prompt|speculation]

- Contexts of 4k / 32k / 128k tokens (SmolLM2-135M, packaged): the same ~1,500-token prompt of real text
  (kernel documentation), 16 tokens greedy, 2 threads on both sides, no flash attention on both sides
  (llama-cpp-python's default): llama-cpp-python (`logits_all=False`, its default) and `llmkit generate`,
  whole processes, alternating; wall time and peak RSS, beside `kv plan`'s weights + KV and process figure.
- A 20k-token prompt (SmolLM2, context 24,576, flash attention on both sides): prefill and decode rates
  in-process from each side's own timestamps (children alternating).
- A 20k-token slot: `llmkit kv save --json` (peak RSS and slot size), then the time to first token of
  `generate --prompt-cache SLOT` against the same prompt prefilled (`--json` stats); `--lookup 3` on that
  context reports its Python time per round.
- Speculation as a user runs it (Qwen2.5-Coder 1.5B, draft 0.5B; models/ needed): `llmkit generate` plain,
  `--draft-model` (adaptive, the default) and `--lookup 3` (adaptive), whole processes alternating, over
  24, 128 and 512 tokens on both speculative tasks; greedy output must equal plain decoding.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_bench import CODE_PROMPT, PROMPTS, QWEN_L, QWEN_S  # noqa: E402
from harness import PY, ROOT, Cmd, Row, Stat, cmds_of, compare, field_stat, ratio, rss, run_once, walls  # noqa: E402

ME = os.path.abspath(__file__)
KERNEL = os.path.join(ROOT, "tests", "fixtures", "kernel-docs.txt.gz")

PARTS = ("contexts", "prompt", "speculation")  # groups of rows that stand alone (run.py --part)


def real_text(n_chars: int) -> str:
    """The first n_chars of the kernel documentation fixture (real prose, shipped with the tests)."""
    with gzip.open(KERNEL, "rt", encoding="utf-8") as f:
        return f.read(n_chars)


def anchor_child(model: str, prompt_file: str, n_ctx: int, n: int, threads: int, flash: int) -> None:
    """llama-cpp-python as its users run it: prefill, then n greedy tokens; rates from its timestamps."""
    import llama_cpp

    m = llama_cpp.Llama(model, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, flash_attn=bool(flash),
                        verbose=False)
    toks = m.tokenize(open(prompt_file, encoding="utf-8").read().encode(), add_bos=True, special=False)
    t0 = time.perf_counter()
    t_first, k = 0.0, 0
    for chunk in m.create_completion(toks, max_tokens=n, temperature=0, stream=True):
        if chunk["choices"][0].get("finish_reason") is None:
            k += 1
            if k == 1:
                t_first = time.perf_counter()
    t_end = time.perf_counter()
    print(json.dumps({"prompt": len(toks), "prefill_tps": len(toks) / (t_first - t0),
                      "decode_tps": (k - 1) / (t_end - t_first) if k > 1 else 0.0}))


def llmkit_child(model: str, prompt_file: str, n_ctx: int, n: int, threads: int, flash: int) -> None:
    """llmkit's Generator on the same prompt and settings; rates from the same timestamps."""
    from llmkit.llama.generate import Generator
    from llmkit.llama.runtime import ModelOptions, open_model
    from llmkit.llama.sampling import SamplingParams

    m = open_model(model, ModelOptions(n_ctx=n_ctx, n_threads=threads, flash_attn=bool(flash)))
    toks = m.tokenize(open(prompt_file, encoding="utf-8").read().encode(), add_bos=True, special=False)
    t0 = time.perf_counter()
    _, st = Generator(m, SamplingParams(temp=0), ignore_eos=True).run(toks, n)
    t_end = time.perf_counter()
    t_first = t0 + st.ttft_s
    print(json.dumps({"prompt": len(toks), "prefill_tps": len(toks) / st.ttft_s,
                      "decode_tps": (st.generated_tokens - 1) / (t_end - t_first)}))


def context_rows(cfg, smol: str, work: str) -> list[Row]:
    prompt = os.path.join(work, "ctx-prompt.txt")
    open(prompt, "w", encoding="utf-8").write(real_text(cfg.pick(6000, 6000, 800)))
    out = []
    for n_ctx in cfg.pick([4096, 32768, 131072], [4096, 32768, 131072], [4096]):
        gen = [PY, "-m", "llmkit", "-q", "generate", "-m", smol, "-c", n_ctx, "-n", 16, "--temp", 0, "-t", 2,
               "--ignore-eos", "--json", "-"]
        sides = [Cmd("llama-cpp-python", [PY, ME, "anchor", smol, prompt, n_ctx, 16, 2, 0]),
                 Cmd("llmkit", gen, stdin=prompt, stdout=os.path.join(work, f"ctx-{n_ctx}.json"))]
        runs = compare(sides, cfg, warmup=False, min_runs=3)
        plan = run_once(Cmd("kv plan", [PY, "-m", "llmkit", "-q", "kv", "plan", "-m", smol, "-c", n_ctx,
                                        "--json"])).report[0]
        a, b = walls(runs["llama-cpp-python"]), walls(runs["llmkit"])
        wkv = (plan["weights_bytes"] + plan["kv_bytes"]) / 2**20
        out.append(Row(f"long-ctx-smollm2-{n_ctx // 1024}k", f"SmolLM2-135M, context {n_ctx}, ~1,500-token prompt, "
                       "16 tokens, 2 threads: whole process wall; peak RSS",
                       f"{a.fmt()}; {rss(runs['llama-cpp-python']):.0f} MB", f"{b.fmt()}; {rss(runs['llmkit']):.0f} MB",
                       ratio(a.median, b.median), f"kv plan: weights + KV {wkv:.0f} MiB, process "
                       f"{plan['process_bytes'] / 2**20:.0f} MiB (compute buffer {plan['compute_bytes'] / 2**20:.0f} MiB)",
                       cmds_of(*sides)))
    return out


def long_prompt_rows(cfg, smol: str, work: str) -> list[Row]:
    n_ctx = cfg.pick(24576, 24576, 2048)
    prompt = os.path.join(work, "p20k.txt")
    open(prompt, "w", encoding="utf-8").write(real_text(cfg.pick(80000, 80000, 3000)))
    n = cfg.pick(32, 16, 4)
    sides = [Cmd("llama-cpp-python", [PY, ME, "anchor", smol, prompt, n_ctx, n, 2, 1]),
             Cmd("llmkit", [PY, ME, "llmkit", smol, prompt, n_ctx, n, 2, 1])]
    runs = compare(sides, cfg, warmup=False, min_runs=3)
    f = {c.label: {k: field_stat(runs[c.label], k) for k in ("prefill_tps", "decode_tps")} for c in sides}
    a, b = f["llama-cpp-python"], f["llmkit"]
    n_prompt = runs["llmkit"][0].report["prompt"]
    rows = [Row("long-prompt-20k", f"SmolLM2-135M, {n_prompt}-token prompt of real text, context {n_ctx}, flash "
                "attention, 2 threads, in-process: prefill tok/s; decode tok/s",
                f"{a['prefill_tps'].fmt('tok/s', 0)}; {a['decode_tps'].fmt('tok/s', 1)}",
                f"{b['prefill_tps'].fmt('tok/s', 0)}; {b['decode_tps'].fmt('tok/s', 1)}",
                f"prefill {ratio(b['prefill_tps'].median, a['prefill_tps'].median)}, decode "
                f"{ratio(b['decode_tps'].median, a['decode_tps'].median)} of llama-cpp-python",
                f"peak RSS {rss(runs['llama-cpp-python']):.0f} / {rss(runs['llmkit']):.0f} MB", cmds_of(*sides))]
    slot = os.path.join(work, "p20k.slot")
    save = Cmd("kv save", [PY, "-m", "llmkit", "-q", "kv", "save", "-m", smol, "-c", n_ctx, "--flash-attn", "-t", 2,
                           "--prompt-file", prompt, "-o", slot, "--json"])
    saved = [run_once(save) for _ in range(cfg.pick(3, 1, 1))]
    gen = [PY, "-m", "llmkit", "-q", "generate", "-m", smol, "-c", n_ctx, "--flash-attn", "-t", 2, "-n", 8,
           "--temp", 0, "--json"]
    plain = Cmd("no cache", [*gen, "-"], stdin=prompt, stdout=os.path.join(work, "plain.json"))
    cached = Cmd("--prompt-cache", [*gen, "--prompt-cache", slot, "-"], stdin=prompt,
                 stdout=os.path.join(work, "cached.json"))
    lookup = Cmd("--lookup 3", [*gen, "--lookup", 3, "-"], stdin=prompt, stdout=os.path.join(work, "lookup.json"))
    ttft: dict = {"no cache": [], "--prompt-cache": []}
    for _ in range(cfg.pick(3, 1, 1)):
        for c in (plain, cached):
            run_once(c)
            ttft[c.label].append(json.load(open(c.stdout))["stats"]["ttft_s"])
    ta, tb = Stat.of(ttft["no cache"]), Stat.of(ttft["--prompt-cache"])
    size = os.path.getsize(slot) / 2**20
    rep = saved[-1].report
    rows.append(Row("long-slot-20k", f"kv save of that prompt ({rep['tokens']} tokens, {size:.0f} MiB slot): wall; "
                    "peak RSS. Then time to first token without and with --prompt-cache SLOT",
                    f"no cache TTFT {ta.fmt('ms', 0, 1000)}",
                    f"save {walls(saved).fmt()}, {rss(saved):.0f} MB; cached TTFT {tb.fmt('ms', 0, 1000)}",
                    f"TTFT {ta.median / tb.median:.0f}× faster", f"save peak RSS - the evaluation's "
                    f"({rss(runs['llmkit']):.0f} MB) = {rss(saved) - rss(runs['llmkit']):.0f} MB vs slot {size:.0f} MiB",
                    cmds_of(save, plain, cached)))
    run_once(lookup)
    st = json.load(open(lookup.stdout))["stats"]
    rows.append(Row("long-lookup-20k", "--lookup 3 on the same context: Python time per decoding round (`--json`'s "
                    "python_ms_per_round: sampling, acceptance, the n-gram index, streaming)", "–",
                    f"{st['python_ms_per_round']:.2f} ms", "–", f"{st['target_steps']} rounds, {st['drafted']} drafted",
                    cmds_of(lookup)))
    return rows


def speculation_rows(cfg, work: str) -> list[Row]:
    out = []
    for task in cfg.pick(["code-edit", "write"], ["code-edit", "write"], ["code-edit"]):
        prompt = os.path.join(work, f"{task}.txt")
        open(prompt, "w", encoding="utf-8").write(PROMPTS[task])
        for n in cfg.pick([24, 128, 512], [24, 128], [8]):
            base = [PY, "-m", "llmkit", "-q", "generate", "-m", QWEN_L, "-n", n, "--temp", 0, "-t", 2,
                    "--ignore-eos", "--json"]
            outs = {k: os.path.join(work, f"{task}-{n}-{k}.json") for k in ("plain", "draft", "lookup")}
            sides = [Cmd("plain", [*base, "-"], stdin=prompt, stdout=outs["plain"]),
                     Cmd("--draft-model", [*base, "--draft-model", QWEN_S, "-"], stdin=prompt, stdout=outs["draft"]),
                     Cmd("--lookup 3", [*base, "--lookup", 3, "-"], stdin=prompt, stdout=outs["lookup"])]
            runs = compare(sides, cfg, warmup=False, min_runs=3)
            texts = {k: json.load(open(p))["text"] for k, p in outs.items()}
            w = {c.label: walls(runs[c.label]) for c in sides}
            for key, c in (("draft", sides[1]), ("lookup", sides[2])):
                st = json.load(open(outs[key]))["stats"]
                out.append(Row(f"spec-process-{task}-{n}-{key}", f"Qwen2.5-Coder-1.5B {task}, {n} tokens, 2 threads, "
                               f"`generate {c.label}` (adaptive) against plain: whole process",
                               f"plain {w['plain'].fmt()}", f"{w[c.label].fmt()}",
                               ratio(w["plain"].median, w[c.label].median),
                               f"output equals plain: {texts[key] == texts['plain']}; drafted {st['drafted']}, "
                               f"accepted {st['accepted']}", cmds_of(sides[0], c)))
    return out


def rows(cfg):
    from llmkit.llama.runtime import default_model_path

    smol = default_model_path()
    work = cfg.tmp("long")
    out = context_rows(cfg, smol, work) if cfg.wants("contexts") else []
    out += long_prompt_rows(cfg, smol, work) if cfg.wants("prompt") else []
    have_qwen = os.path.exists(QWEN_S) and os.path.exists(QWEN_L)
    if cfg.wants("speculation") and have_qwen:
        out += speculation_rows(cfg, work)
    elif cfg.wants("speculation"):
        out.append(Row.skipped("spec-process", "--draft-model / --lookup against plain, whole process",
                               "models/ missing: run scripts/fetch_models.sh"))
    return "long contexts against llama-cpp-python; speculation as whole processes", [
        f"SmolLM2: {smol}; Qwen pair: {QWEN_L} + {QWEN_S}", f"code-edit prompt starts: {CODE_PROMPT[:60]!r}"], out


def child(argv):
    kind, model, prompt, n_ctx, n, threads, flash = argv[0], argv[1], argv[2], *map(int, argv[3:7])
    (anchor_child if kind == "anchor" else llmkit_child)(model, prompt, n_ctx, n, threads, flash)


if __name__ == "__main__":
    child(sys.argv[1:])
