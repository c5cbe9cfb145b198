"""Run the benchmarks and write benchmarks/RESULTS.md (not a test).

    python benchmarks/run.py                       # every area, full sizes
    python benchmarks/run.py --quick               # every area but the quality ones (about 90 min on 2 cores)
    python benchmarks/run.py --area quant --quick  # one area: only its section of RESULTS.md is replaced
    python benchmarks/run.py --smoke               # tiny inputs: proves the plumbing, figures mean nothing
    python benchmarks/run.py --area scale --part query --work DIR  # one group of rows, inputs kept in DIR

How each figure is measured is in harness.py: whole processes timed from outside, alternating,
median of >= 3 runs (>= 5 under a second) with min and max. Areas: tokenize rag quant generate kv scale,
endpoint (rag through llama-server's OpenAI-compatible API against the in-process paths; about 10
minutes), rag-quality (llmkit's retrieval quality against the naive baseline; about 40 minutes with an
empty vector cache), quant-quality (size budgets against llama.cpp's mixes on a real model,
--quant-model/--quant-imatrix; about 45 minutes) and quant-gptq (GPTQ against llama.cpp's rounding,
also --quant-calib; about 70 minutes) and setup (the README's install and test commands on a fresh
clone of HEAD, about 20 minutes): --quick leaves those five out (and long), `--area NAME` runs them. The long
area (contexts to 128k, a 20k-token prompt and slot, speculation as whole processes) takes about 70
minutes with the Qwen models of scripts/fetch_models.sh. Areas whose groups of rows stand alone (their
script's PARTS) write RESULTS.md after each group, so a killed run keeps the groups it finished.
quant_sections.py writes three more areas (quant-formats, quant-startup, quant-7b); this script
keeps their sections when it rewrites the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import os
import re
import shutil
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

AREAS = {"tokenize": "tokenize_bench", "rag": "rag_bench", "quant": "quant_bench", "generate": "generate_bench",
         "kv": "kv_bench", "long": "longctx_bench", "scale": "scale_bench", "rag-quality": "quality_bench",
         "quant-quality": "quant_quality_bench", "quant-gptq": "gptq_bench", "setup": "setup_bench",
         "endpoint": "endpoint_bench"}
# long runs: only with --area (or a full run), not in --quick
NOT_QUICK = {"rag-quality", "quant-quality", "quant-gptq", "setup", "long", "endpoint"}
QUALITY = {"rag-quality"}  # areas of quality figures only (no clock)
BEGIN, END = "<!-- area:{} -->", "<!-- /area:{} -->"


def section(area: str, title: str, setup: list[str], rows: list[harness.Row], took: float, load: tuple,
            cfg: harness.Config) -> str:
    """One area's Markdown: setup notes, the table, then every row's commands."""
    m = harness.machine()
    out = [BEGIN.format(area), f"## {area}: {title}", "",
           f"{cfg.mode} mode, {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, "
           f"{m['cpu']} ({m['cores']} cores); took "
           f"{took:.0f} s; load average before {load[0]}, after {load[1]} " + (
               "(quality figures: load changes none of them)." if area in QUALITY
               else "(figures taken under load are not valid)."),
           ""]
    out += [f"- {s}" for s in setup]
    out += ["", "| row | measure | anchor | llmkit | llmkit vs anchor | check |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| `{r.id}` | {r.what} | {r.anchor} | {r.llmkit} | {r.ratio} | {r.check} |")
    out += ["", "<details><summary>commands per row</summary>", ""]
    for r in rows:
        if r.commands:
            out.append(f"- `{r.id}`")
            out += [f"  - {c}" for c in r.commands]
    out += ["", "</details>", END.format(area), ""]
    return "\n".join(out).replace(cfg.work, "$WORK")


def header(cfg: harness.Config) -> str:
    m, v = harness.machine(), harness.versions()
    lines = []
    if cfg.smoke:
        lines += ["> **SMOKE RUN — tiny inputs on a busy machine. These figures mean nothing; they only show that",
                  "> every row's commands run end to end. Run `python benchmarks/run.py --quick` on a quiet machine.**", ""]
    lines += ["# Benchmark results", "",
              f"Written by `python benchmarks/run.py` ({cfg.mode} mode) on "
              f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}. How figures are "
              "measured: [harness.py](harness.py) (whole processes, clock outside, alternating, median of >= 3 runs, "
              ">= 5 under a second, min–max in brackets).", "",
              f"- machine of this run: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM; {m['os']}; Python "
              f"{m['python']} (areas kept from earlier runs name their CPU in their own section when they were "
              "written on 2026-12-03 or later)",
              "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
              "- `$WORK` in the commands is the run's work directory (inputs and outputs; `--keep` keeps it); "
              "each area's setup line says how its inputs were made", ""]
    return "\n".join(lines)


_ROW = re.compile(r"^\| `([^`]+)` \|")


def _rows_of(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """A section's table lines and its commands per row id."""
    table = {m.group(1): line for line in text.splitlines() if (m := _ROW.match(line))}
    cmds = {}
    for block in re.split(r"\n(?=- `)", text.split("<summary>commands per row</summary>", 1)[-1]):
        m = re.match(r"- `([^`]+)`\n", block)
        if m:
            cmds[m.group(1)] = block.split("\n</details>")[0].rstrip("\n")
    return table, cmds


def merge_part(old: str, new: str, parts: list[str]) -> str:
    """A section of some groups of rows (--part): the new rows take the place of those with the same id,
    the others stay as the earlier run wrote them, and the header says so."""
    if not old:
        return new
    old_table, old_cmds = _rows_of(old)
    new_table, new_cmds = _rows_of(new)
    kept = [r for r in old_table if r not in new_table]
    if not kept:
        return new
    head, rest = new.split("\n| row |", 1)
    table_end = rest.index("\n\n")
    # the dates of every run whose rows stay: the old section's own and those its --part note named
    earlier = re.search(r"\n\n\w+ mode, (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", old)
    kept_note = re.search(r"^- this run made the rows of .*$", old, re.M)
    dates = sorted(set(re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", kept_note.group(0) if kept_note else ""))
                   | ({earlier.group(1)} if earlier else set()))
    note = (f"- this run made the rows of {', '.join(parts)} (`--part`); the other rows are kept from earlier runs"
            + (f" ({', '.join(dates)})" if dates else ""))
    lines = ["| row |" + rest[:table_end]] + [old_table[r] for r in kept]
    details = "\n".join([new_cmds[r] for r in new_table if r in new_cmds] + [old_cmds[r] for r in kept if r in old_cmds])
    tail = rest[table_end:].split("<summary>commands per row</summary>", 1)[0]
    return (head.rstrip("\n") + "\n" + note + "\n\n" + "\n".join(lines) + tail + "<summary>commands per row</summary>\n\n"
            + details + "\n\n</details>\n" + new.rstrip("\n").rsplit("\n", 1)[-1] + "\n")


def _sections_of(text: str) -> dict[str, str]:
    return {m.group(1): m.group(0).rstrip("\n") + "\n"
            for m in re.finditer(r"<!-- area:([\w.-]+) -->.*?<!-- /area:\1 -->\n?", text, re.S)}


def merge(path: str, head: str, sections: dict[str, str], smoke: bool, before: str | None = None) -> str:
    """Replace the sections just run; keep the others (unless the old file was a smoke run and this is not).
    A section written in groups merges onto `before` (the file as this run found it), not onto its own
    earlier writes."""
    old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    if ("SMOKE RUN" in old) != smoke:
        old = ""
    base = old if before is None or ("SMOKE RUN" in before) != smoke else before
    # every section of the old file, this script's areas and those other scripts write (quant_sections.py)
    kept, found = _sections_of(old), _sections_of(base)
    for area, text in sections.items():
        parts = re.search(r"<!-- parts:([\w,.-]+) -->", text)
        if parts:
            text = merge_part(found.get(area, ""), text.replace(parts.group(0) + "\n", ""), parts.group(1).split(","))
        kept[area] = text
    order = [a for a in AREAS if a in kept] + [a for a in kept if a not in AREAS]
    return head + "\n" + "\n".join(kept[a] for a in order)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--area", action="append", choices=list(AREAS), help="run only this area (repeatable)")
    ap.add_argument("--quick", action="store_true", help="small inputs, 3 runs (5 under a second)")
    ap.add_argument("--smoke", action="store_true", help="tiny inputs: check the plumbing, figures are meaningless")
    ap.add_argument("-o", "--output", default=os.path.join(harness.BENCH, "RESULTS.md"))
    ap.add_argument("--quant-model", default="", metavar="GGUF",
                    help="quant area: also time both quantizers on this real F16/F32 model (rows quant-real-*)")
    ap.add_argument("--quant-imatrix", default="", metavar="IMATRIX",
                    help="the imatrix of --quant-model (its i-quant and Q3_K_M rows use it)")
    ap.add_argument("--quant-calib", default="", metavar="TEXT",
                    help="calibration text for --quant-model's GPTQ Hessians (area quant-gptq)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (inputs and outputs of every row)")
    ap.add_argument("--part", action="append", default=[], metavar="NAME",
                    help="only this group of rows of the area (repeatable; names in each area script's module doc); "
                         "the section's other rows are kept")
    ap.add_argument("--work", default="", metavar="DIR",
                    help="use and keep this work directory: untimed inputs an earlier run built there are reused")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="llmkit-bench-")
    if a.work:
        os.makedirs(work, exist_ok=True)
        a.keep = True
    cfg = harness.Config(quick=a.quick or a.smoke, smoke=a.smoke, work=work, quant_model=a.quant_model,
                         quant_imatrix=a.quant_imatrix, quant_calib=a.quant_calib, parts=frozenset(a.part))
    sections, failed = {}, []
    before = open(a.output, encoding="utf-8").read() if os.path.exists(a.output) else ""
    t_all = time.perf_counter()
    try:
        for area in a.area or [x for x in AREAS if not (cfg.quick and x in NOT_QUICK)]:
            mod = importlib.import_module(AREAS[area])
            print(f"[{area}] running ({cfg.mode})", file=sys.stderr, flush=True)
            # an area whose groups of rows stand alone (PARTS) runs them one by one and writes after each,
            # so a run killed in its last hour keeps the rows of the groups it finished
            steps = [p for p in getattr(mod, "PARTS", ()) if cfg.wants(p)] or [""]
            t0, l0, rows, done, errors, title, setup = time.perf_counter(), harness.load(), [], [], [], "failed", []
            for step in steps:
                try:
                    title, setup, got = mod.rows(dataclasses.replace(cfg, parts=frozenset([step])) if step else cfg)
                    rows += got
                except Exception as e:  # one broken group or area must not lose the others' figures
                    failed.append(area)
                    traceback.print_exc()
                    errors.append(f"{'the group ' + step if step else 'the area'} raised {type(e).__name__}: "
                                  f"{str(e)[:300]}")
                done.append(step)
                took = time.perf_counter() - t0
                sections[area] = section(area, title, setup + errors, rows, took, (l0, harness.load()), cfg)
                if a.part or done != steps:  # only some groups ran: merged with the section's other rows
                    sections[area] = f"<!-- parts:{','.join(done if step else a.part)} -->\n" + sections[area]
                tmp = a.output + ".tmp"
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(merge(a.output, header(cfg), sections, cfg.smoke, before))
                os.replace(tmp, a.output)
            print(f"[{area}] {len(rows)} rows in {took:.0f} s", file=sys.stderr, flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory kept: {work}", file=sys.stderr)
    print(f"wrote {a.output} in {time.perf_counter() - t_all:.0f} s", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
