"""KV rows for run.py (not a test): time to first token with and without a cached prompt (`--prompt-cache DIR`).

    python benchmarks/run.py --area kv [--quick]

The README's prefix-cache example, as whole processes: a long shared system prompt, then a
question. Anchor: `llmkit generate` with no cache (the whole prompt is prefilled). llmkit cached:
`llmkit generate --prompt-cache DIR` for question 2 after question 1 filled DIR (that priming run is
not timed; it runs again before every timed run, in a fresh DIR). Figures: wall time of the whole
process, and the in-process TTFT from `--json`'s stats. Check: both answers identical, slot file
size against `llmkit kv plan`'s KV bytes for the cached tokens.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, Cmd, Row, Stat, cmds_of, run_once, speed, walls  # noqa: E402


def rows(cfg):
    from llmkit.llama.runtime import default_model_path

    model = default_model_path()
    work = cfg.tmp("kv")
    n_rules = cfg.pick(80, 54, 10)  # ~22 tokens a rule: ~1800 / ~1200 tokens, inside the 2048 context
    system = "".join(f"Rule {i}: answer in one short sentence, cite rule {i}, and never invent facts.\n"
                     for i in range(n_rules))
    paths = {}
    for i in (1, 2):
        paths[i] = os.path.join(work, f"prompt{i}.txt")
        open(paths[i], "w").write(system + f"Question {i}: what is a hash map?\nAnswer:")
    slots = os.path.join(work, "slots")
    base = [PY, "-m", "llmkit", "-q", "generate", "-m", model, "-n", 8, "--temp", 0, "-t", 1, "--json"]
    outs = {k: os.path.join(work, f"out-{k}.json") for k in ("nocache", "cached")}
    cold = Cmd("no cache", [*base, "-"], stdin=paths[2], stdout=outs["nocache"])
    warm = Cmd("--prompt-cache", [*base, "--prompt-cache", slots, "-"], stdin=paths[2], stdout=outs["cached"])
    prime = Cmd("prime: question 1 into a fresh DIR (not timed)", [*base, "--prompt-cache", slots, "-"], stdin=paths[1],
                stdout=os.devnull)
    ttft: dict = {"no cache": [], "--prompt-cache": []}
    runs: dict = {"no cache": [], "--prompt-cache": []}
    for _ in range(3):  # alternating; each run's own --json stats read right after it
        for c, key in ((cold, "nocache"), (warm, "cached")):
            if c is warm:
                shutil.rmtree(slots, ignore_errors=True)
                os.makedirs(slots)
                run_once(prime)
            runs[c.label].append(run_once(c))
            ttft[c.label].append(json.load(open(outs[key]))["stats"]["ttft_s"])
    a, b = walls(runs[cold.label]), walls(runs[warm.label])
    ta, tb = Stat.of(ttft["no cache"]), Stat.of(ttft["--prompt-cache"])
    ja, jb = json.load(open(outs["nocache"])), json.load(open(outs["cached"]))
    slot_files = glob.glob(os.path.join(slots, "**", "*"), recursive=True)
    slot_bytes = max((os.path.getsize(p) for p in slot_files if os.path.isfile(p)), default=0)
    plan = run_once(Cmd("kv plan", [PY, "-m", "llmkit", "-q", "kv", "plan", "-m", model, "-c", 2048, "--json"])).report
    per_tok = plan_bytes_per_token(plan)
    cached = jb["stats"].get("prefill_reused", 0)
    kv_check = (f"; slot file {slot_bytes / 2**20:.2f} MiB vs plan's KV for {cached} tokens "
                f"{per_tok * cached / 2**20:.2f} MiB" if per_tok and cached else "")
    return "prefix cache across processes (generate --prompt-cache DIR)", [
        f"model: {model}; system prompt of {n_rules} rules ({ja['stats']['prompt_tokens']} prompt tokens with the "
        "question); 8 tokens generated, greedy, 1 thread"], [
        Row("kv-prompt-cache-ttft", "time to first token of question 2, in-process (`--json` stats)",
            f"no cache {ta.fmt('ms', 0, 1000)}", f"--prompt-cache {tb.fmt('ms', 0, 1000)}", speed(ta.median, tb.median, "no cache"),
            f"answers identical: {ja['text'] == jb['text']}; reused {cached} cached tokens" + kv_check,
            cmds_of(cold, prime, warm)),
        Row("kv-prompt-cache-process", "question 2, whole process (the --prompt-cache run also restores and saves its slot)",
            f"no cache {a.fmt()}", f"--prompt-cache {b.fmt()}", speed(a.median, b.median, "no cache"), "", cmds_of(cold, warm))]


def plan_bytes_per_token(plan: dict) -> float:
    """KV bytes per token from `kv plan --json` (whatever shape: the first matching key)."""
    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "kv_bytes_per_token" and isinstance(v, (int, float)):
                    return v
                got = walk(v)
                if got:
                    return got
        if isinstance(x, list):
            for v in x:
                got = walk(v)
                if got:
                    return got
        return 0

    return walk(plan)
