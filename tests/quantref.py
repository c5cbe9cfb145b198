"""llama.cpp's quantizer as the reference of the quant tests: the `llama-quantize` binary run one way
(llamatools.run_tool, 2 threads), its refusals, its --dry-run type log and its own list of file
types, plus the module fixtures several test_quant* files share."""

from __future__ import annotations

import re
import subprocess

import pytest

from llamatools import run_tool, tool


def quantize_args(src, dst, ftype: str, imatrix=None, extra=()) -> list[str]:
    """llama-quantize's arguments: [EXTRA] [--imatrix FILE] SRC DST FTYPE 2 (DST None: --dry-run)."""
    out = ["--dry-run", str(src)] if dst is None else [str(src), str(dst)]
    return [*map(str, extra), *(["--imatrix", str(imatrix)] if imatrix else []), *out, ftype, "2"]


def binary_quantize(src, dst, ftype: str, imatrix=None, extra=()) -> subprocess.CompletedProcess:
    """llama-quantize SRC DST FTYPE with 2 threads; a failure fails the test with its stderr."""
    return run_tool("llama-quantize", *quantize_args(src, dst, ftype, imatrix, extra), timeout=600)


def binary_refuses(src, dst, ftype: str, imatrix=None, extra=()) -> str:
    """Run llama-quantize where it must fail: the test fails if it succeeds; returns its log."""
    p = subprocess.run([tool("llama-quantize"), *quantize_args(src, dst, ftype, imatrix, extra)], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode != 0, f"llama-quantize {ftype} succeeded where it should refuse"
    return p.stdout + p.stderr


def dry_run_types(src, ftype: str, imatrix=None, extra=()) -> tuple[dict, bool]:
    """llama-quantize --dry-run: {tensor: type} from its per-tensor log (nothing is quantized), and
    whether it warns that the real run would need an imatrix."""
    p = binary_quantize(src, None, ftype, imatrix, extra)
    log = p.stdout + p.stderr
    types = {}
    for m in re.finditer(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s*(\S+), size =[^(\n]*(?:\((\S+)\))?$",
                         log, re.M):
        types[m.group(1)] = (m.group(3) or m.group(2)).upper()
    assert types, log[-2000:]
    return types, "will require an imatrix" in log


def listed_file_types() -> tuple[dict[str, int], dict[str, str]]:
    """The file types `llama-quantize --help` offers: {name: llama_ftype number} and {alias: target}
    (its lines `  15  or  Q4_K_M  : ...` and `  15  or  Q4_K    : alias for Q4_K_M`). The help exits
    with status 1, so it is run directly rather than through run_tool."""
    p = subprocess.run([tool("llama-quantize"), "--help"], capture_output=True, text=True, timeout=60)
    types, aliases = {}, {}
    for m in re.finditer(r"^\s*(\d+)\s+or\s+(\S+)\s*:\s*(.*)$", p.stdout + p.stderr, re.M):
        alias = re.match(r"alias for (\S+)", m.group(3))
        if alias:
            aliases[m.group(2)] = alias.group(1)
        else:
            types[m.group(2)] = int(m.group(1))
    assert len(types) > 30, (p.stdout + p.stderr)[-2000:]
    return types, aliases


@pytest.fixture(scope="module")
def tools():
    """The folder holding llama.cpp's tools (found or built once)."""
    from llamatools import tool_dir

    return tool_dir()
