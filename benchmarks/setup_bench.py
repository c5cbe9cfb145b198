"""The README's two set-up commands on a fresh clone (area setup of run.py; not a test; ~20 min).

`benchmarks/install_time.sh DIR` clones this checkout's HEAD and runs scripts/install.sh with empty
pip and llmkit caches (packages still come from the configured index), then the README's test
command runs in that clone as CI runs it (`CI=true`, so a skipped test fails). Both timed outside,
once each: a fresh install cannot be repeated without emptying the caches again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, Row  # noqa: E402


def rows(cfg):
    clone = os.path.join(cfg.tmp("setup"), "clone")
    t0 = time.perf_counter()
    p = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "install_time.sh"), clone],
                       capture_output=True, text=True)
    install_s = time.perf_counter() - t0
    line = (p.stdout.strip().splitlines() or [""])[-1]
    out = [Row("setup-install", "`scripts/install.sh` on a fresh clone, empty pip and llmkit caches (llama.cpp and "
               "its four tools compiled), whole script", "goal: 8 min", f"{install_s / 60:.1f} min ({install_s:.0f} s)",
               "–", line or p.stderr[-200:], ["`bash benchmarks/install_time.sh $WORK/setup/clone`"])]
    if p.returncode != 0:
        return "the README's install and test commands on a fresh clone", [], out
    env = {**os.environ, "CI": "true"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.perf_counter()
    t = subprocess.run([os.path.join(clone, ".venv", "bin", "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                       cwd=clone, capture_output=True, text=True, env=env)
    test_s = time.perf_counter() - t0
    summary = next((x for x in reversed(t.stdout.splitlines()) if re.search(r"\d+ (passed|failed)", x)), "no summary")
    out.append(Row("setup-tests", "the README's test command in that clone under `CI=true` (a skip fails the run)",
                   "goal: 10 min", f"{test_s / 60:.1f} min ({test_s:.0f} s)", "–",
                   f"exit {t.returncode}: {summary.strip('= ')}",
                   ["`CI=true .venv/bin/python -m pytest -q` (in the clone)"]))
    setup = ["a fresh clone of this checkout's HEAD; empty PIP_CACHE_DIR and LLMKIT_CACHE for the install; "
             "the tests then run with the caches the install left (as CI does)"]
    return "the README's install and test commands on a fresh clone", setup, out
