"""GPTQ on a 7-8B model within this machine's memory (area quant-7b-gptq of quant_sections.py; not a test).

The Llama-3-8B-shaped F16 model of quant_7b.py (15 GiB, written once into --model-dir), `llmkit quant
--method gptq` to Q4_K_M with Hessians from 4 x 256 tokens of the kernel docs, 2 threads, one run
(over an hour on 2 cores), clock outside. Memory is sampled every second over the whole process group
(the command and its rounding workers): the peak of their summed anonymous RSS (what the run itself
holds; the model's pages are file-backed and shared) and of the machine's used memory (MemTotal -
MemAvailable, page cache excluded). `q7b-gptq` says how it ended: refused in its first seconds with the
memory it needs, completed (the output loads in llama.cpp and evaluates tokens), or stopped at the limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BASE_ENV, PY, ROOT, Cmd, Row, cmds_of  # noqa: E402
from quant_7b import model_and_text  # noqa: E402

ME = os.path.abspath(__file__)


def _kb(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _group_anon_kb(pgid: int) -> int:
    """Summed RssAnon of every process in process group `pgid`."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # pgrp is the 5th field of stat, the 3rd after the name
                total += _kb(f"/proc/{pid}/status", "RssAnon:")
        except (OSError, ValueError, IndexError):
            continue
    return total


def limited(cmd: Cmd, limit: float, err_path: str) -> tuple[str, float, float, float, str]:
    """Run `cmd` in its own process group with a time limit: (how it ended, seconds, peak summed
    anonymous GiB of the group, peak machine-used GiB, its stderr's last line, kept in `err_path`)."""
    env = {**os.environ, **BASE_ENV, **{k: str(v) for k, v in cmd.env.items()}}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as harness.run_once: an installed program's bytecode cache
    used = lambda: _kb("/proc/meminfo", "MemTotal:") - _kb("/proc/meminfo", "MemAvailable:")  # noqa: E731
    with open(err_path, "wb") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen([str(a) for a in cmd.argv], stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT,
                             start_new_session=True)
        anon = machine = 0
        while p.poll() is None and time.perf_counter() - t0 < limit:
            anon, machine = max(anon, _group_anon_kb(p.pid)), max(machine, used())
            time.sleep(1)
        ended = "exit 0" if p.returncode == 0 else f"exit {p.returncode}" if p.returncode is not None else "stopped"
        if p.returncode is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        wall = time.perf_counter() - t0
    last = (open(err_path, errors="replace").read().strip().splitlines() or [""])[-1]
    return ended, wall, anon / 2**20, machine / 2**20, last


def child(argv):
    if argv[0] == "load":  # PATH: llama.cpp loads the file and evaluates a few tokens
        from llama_cpp import Llama

        llm = Llama(argv[1], n_ctx=64, n_threads=2, verbose=False)
        llm.eval(llm.tokenize(b"The kernel manages memory", add_bos=True))
        print("evaluated", llm.n_tokens, "tokens")
    else:
        raise SystemExit(f"unknown child {argv[0]}")


def rows(cfg):
    model, text, n_layer = model_and_text(cfg)
    out_path = os.path.join(cfg.work, "gptq.gguf")
    chunks, n_ctx = cfg.pick(4, 4, 1), 256
    limit = cfg.pick(14400, 7200, 600)
    what = f"{n_layer}-layer Llama-3-8B-shaped F16 ({os.path.getsize(model) / 2**30:.1f} GiB)"
    b = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "quant", model, "--type", "Q4_K_M", "--method", "gptq", "--calib", text,
                       "-c", n_ctx, "--chunks", chunks, "-o", out_path, "-t", "2"])
    ended, wall, anon, machine, last = limited(b, limit, os.path.join(cfg.work, "gptq.err"))
    check = last[:200]
    if ended == "exit 0":
        r = subprocess.run([PY, ME, "load", out_path], capture_output=True, text=True, cwd=ROOT)
        check = r.stdout.strip() or f"LOAD FAILED: {r.stderr.strip()[-200:]}"
    if os.path.exists(out_path):
        os.unlink(out_path)
    rows = [Row("q7b-gptq", f"--method gptq to Q4_K_M, the {what}, H from {chunks} x {n_ctx} tokens, 2 threads, "
                f"limit {limit} s", "–", f"{ended} after {wall:.0f} s; peak {anon:.2f} GiB anonymous memory "
                f"(command and workers), machine used {machine:.2f} GiB", "–", check, cmds_of(b))]
    setup = [f"model: {what}, tests/ggufmake.write_llama_shaped (random weights)",
             "one run; clock outside; memory sampled every second over the process group"]
    return "GPTQ on a 7-8B model (Llama-3-8B shapes, F16) within 24 GB", setup, rows


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    child(sys.argv[1:])
