"""The fuzz suite's figures: each test adds its format's counts, worst peak memory and worst time,
and the terminal summary prints them as the README's reliability table (also written as JSON to
$LLMKIT_FUZZ_REPORT when that is set). Not a conftest.py: a second module named `conftest` would
shadow tests/conftest.py for the test modules that import from it."""

import json
import os
from pathlib import Path

FIGURES: dict = {}


class Reporter:
    """A plugin registered by the fuzz tests' `figures` fixture."""

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if FIGURES:
            summary(terminalreporter)


def register(config) -> dict:
    """Register the summary plugin once per session; returns the shared figures."""
    if not config.pluginmanager.has_plugin("llmkit-fuzz-figures"):
        config.pluginmanager.register(Reporter(), "llmkit-fuzz-figures")
    return FIGURES


def summary(terminalreporter) -> None:
    rows = sorted(FIGURES.items())
    w = terminalreporter.write_line
    terminalreporter.write_sep("=", "fuzz figures (per format: crafted / mutated files, worst peak RSS, worst time)")
    w("| format | crafted | mutated | refused or skipped cleanly | worst peak RSS | worst time per file |")
    w("|---|---:|---:|---|---:|---:|")
    for fmt, f in rows:
        w(f"| {fmt} | {f.get('crafted', 0)} | {f.get('mutated', 0)} | all | {f.get('peak_mb', 0):.0f} MB | "
          f"{f.get('worst_s', 0):.2f} s |")
    total_c = sum(f.get("crafted", 0) for _, f in rows)
    total_m = sum(f.get("mutated", 0) for _, f in rows)
    w(f"total: {total_c} crafted + {total_m} mutated files")
    if os.environ.get("LLMKIT_FUZZ_REPORT"):
        Path(os.environ["LLMKIT_FUZZ_REPORT"]).write_text(json.dumps(FIGURES, indent=1, sort_keys=True))
