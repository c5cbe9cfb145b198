"""Run llmkit quant's own benchmark areas and write each as its section of RESULTS.md (not a test).

    python benchmarks/quant_sections.py --area quant-formats [--quick | --smoke]
    python benchmarks/quant_sections.py --area quant-startup [--quick | --smoke]
    python benchmarks/quant_sections.py --area quant-7b --model-dir /path/with/room [--quick | --smoke]
    python benchmarks/quant_sections.py --area quant-7b-gptq --model-dir /path/with/room [--quick | --smoke]

Each area module has run.py's shape (`rows(cfg)` -> title, setup lines, rows); the section is written
as run.py writes one (run.section) and replaces that area's earlier section, or is appended. The areas:
`quant-formats` (quant_formats.py: what each compiled kernel saves, numba's start-up, the error of the
low-bit types), `quant-startup` (quant_startup.py: the whole command on a small model against
llama.cpp's quantizer called in-process), `quant-7b` (quant_7b.py: a Llama-3-8B-shaped F16 model), `quant-7b-gptq` (quant_7b_gptq.py: GPTQ on that model,
over an hour).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import run  # noqa: E402

AREAS = {"quant-formats": "quant_formats", "quant-startup": "quant_startup", "quant-7b": "quant_7b",
         "quant-7b-gptq": "quant_7b_gptq"}


def put_section(path: str, area: str, text: str) -> None:
    """Replace `area`'s section of the results file, or append it (written atomically)."""
    old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    pat = re.escape(run.BEGIN.format(area)) + r".*?" + re.escape(run.END.format(area)) + r"\n?"
    new = re.sub(pat, lambda _: text.rstrip("\n") + "\n", old, flags=re.S) if re.search(pat, old, re.S) \
        else old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(new)
    os.replace(path + ".tmp", path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--area", action="append", choices=list(AREAS), required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny inputs: the plumbing only, figures mean nothing")
    ap.add_argument("--model-dir", default="", help="quant-7b, quant-7b-gptq: where to write the 15 GB model and its outputs")
    ap.add_argument("-o", "--output", default=os.path.join(harness.BENCH, "RESULTS.md"))
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    work = a.model_dir or tempfile.mkdtemp(prefix="llmkit-bench-")
    os.makedirs(work, exist_ok=True)
    cfg = harness.Config(quick=a.quick or a.smoke, smoke=a.smoke, work=work)
    try:
        for area in a.area:
            mod = importlib.import_module(AREAS[area])
            t0, l0 = time.perf_counter(), harness.load()
            title, setup, rows = mod.rows(cfg)
            text = run.section(area, title, setup, rows, time.perf_counter() - t0, (l0, harness.load()), cfg)
            print(text)
            if not a.smoke:
                put_section(a.output, area, text)
    finally:
        if not (a.keep or a.model_dir):
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
