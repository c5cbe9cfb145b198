"""llama.cpp's command-line tools for tests: where the install put them (llmkit.llama.tools), else built
once by scripts/build_llama_server.sh (a wheel pip had cached without them)."""

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@functools.lru_cache(maxsize=None)
def tool_dir() -> Path:
    """The directory holding llama-server, llama-quantize, llama-perplexity and llama-imatrix."""
    from llmkit.llama import tools

    found = [tools.find(t) for t in tools.TOOLS]
    if all(found) and len({p.parent for p in found}) == 1:
        return found[0].parent
    p = subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_server.sh")], capture_output=True, text=True,
                       env={**os.environ, "PYTHON": sys.executable}, timeout=3600)
    if p.returncode != 0:
        pytest.fail(f"llama.cpp's tools could not be built: {p.stderr[-2000:]}")
    return Path(p.stdout.strip().splitlines()[-1]).parent


def tool(name: str) -> str:
    """The path of one tool (llama-server, llama-quantize, llama-perplexity, llama-imatrix)."""
    return str(tool_dir() / name)


def run_tool(name: str, *args, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run a tool to completion with text output; a failure fails the test with its stderr."""
    p = subprocess.run([tool(name), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        pytest.fail(f"{name} {' '.join(map(str, args))} failed ({p.returncode}): {p.stderr[-2000:]}")
    return p
