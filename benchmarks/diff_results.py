"""Does a new run reproduce RESULTS.md? Compare two results files row by row (not a test).

    python benchmarks/run.py --quick -o /tmp/again.md [--quant-model ...]
    python benchmarks/diff_results.py benchmarks/RESULTS.md /tmp/again.md [--tolerance 0.15]

For every row id in both files: the first ratio (else the first number) of the "llmkit vs anchor" column (a speed ratio,
a KLD ratio, an nDCG difference ...) in each, and their relative difference; rows whose figure moved
by more than the tolerance are marked. Rows in only one file are listed. Exit status 0 always: noise
on 2 shared cores is judged by a person reading the min-max ranges, not by this script.
"""

from __future__ import annotations

import argparse
import re

NUM = re.compile(r"[-+]?\d+(?:\.\d+)?")
RATIO = re.compile(r"([-+]?\d+(?:\.\d+)?)×")


def rows(path: str) -> dict[str, tuple[str, str]]:
    """{row id: (ratio column, check column)} from the Markdown tables of a results file."""
    out = {}
    for line in open(path, encoding="utf-8"):
        m = re.match(r"\| `([^`]+)` \|(.*)\|\s*$", line)
        if m:
            cells = [c.strip() for c in m.group(2).split(" | ")]
            if len(cells) >= 5:
                out[m.group(1)] = (cells[3], cells[4])
    return out


def first_number(text: str) -> float | None:
    """The first ratio ("1.23×") in the text, else its first number."""
    m = RATIO.search(text) or NUM.search(text)
    return float(m.group(1) if m.re is RATIO else m.group(0)) if m else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--tolerance", type=float, default=0.15, help="relative change that gets a mark (default 0.15)")
    a = ap.parse_args()
    old, new = rows(a.old), rows(a.new)
    both = [r for r in old if r in new]
    moved = 0
    print(f"| row | {a.old} | {a.new} | change |\n|---|---|---|---|")
    for r in both:
        x, y = first_number(old[r][0]), first_number(new[r][0])
        if x is None or y is None:
            change = "–"
        else:
            rel = (y - x) / abs(x) if x else float("inf") if y else 0.0
            flag = abs(rel) > a.tolerance
            moved += flag
            change = f"{rel:+.0%}" + (" **moved**" if flag else "")
        print(f"| `{r}` | {old[r][0]} | {new[r][0]} | {change} |")
    print(f"\n{len(both)} rows in both; {moved} moved by more than {a.tolerance:.0%}")
    for name, only in (("only in " + a.old, [r for r in old if r not in new]), ("only in " + a.new, [r for r in new if r not in old])):
        if only:
            print(f"{name}: " + ", ".join(only))


if __name__ == "__main__":
    main()
