import gzip
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(Path(__file__).parent))


_SESSION_DIRS: list[str] = []


def pytest_configure(config):
    """A cache of the session's own (LLMKIT_CACHE: embedding exports, probes), removed when it ends, so
    tests never read or fill the user's; compiled numba kernels and llama.cpp's tools are still found
    where the user's install keeps them."""
    import tempfile

    if os.environ.get("LLMKIT_CACHE"):  # given by the caller: used as it is
        return
    from llmkit import config
    from llmkit.llama import tools

    os.environ.setdefault("NUMBA_CACHE_DIR", str(config.cache_dir("numba")))
    found = tools.find("llama-quantize")
    if found and not os.environ.get("LLMKIT_LLAMA_BIN"):
        os.environ["LLMKIT_LLAMA_BIN"] = str(found.parent)
    os.environ["LLMKIT_CACHE"] = tempfile.mkdtemp(prefix="llmkit-cache-")
    _SESSION_DIRS.append(os.environ["LLMKIT_CACHE"])


def pytest_unconfigure(config):
    import shutil

    while _SESSION_DIRS:
        shutil.rmtree(_SESSION_DIRS.pop(), ignore_errors=True)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: absent under -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    """With pytest-xdist (the default: pyproject's addopts), each `test_quant*` file runs on one
    worker: its module fixtures (models, imatrices) are built once and its numba kernels compiled
    once, while the other tests spread one by one over the workers. xdist's own `xdist_group` marks
    cannot do this here: on pytest >= 9.2 its loadgroup scheduler silently stops grouping
    (pytest-xdist issue #1386), so the grouping is this scheduler's, by file name."""
    try:
        from xdist.scheduler import LoadGroupScheduling
    except ImportError:  # a future xdist that moved it: its own scheduler, ungrouped
        return None
    if config.getvalue("dist") != "loadgroup" or not hasattr(LoadGroupScheduling, "_split_scope"):
        return None

    class QuantFilesTogether(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if os.path.basename(path).startswith("test_quant"):
                return path
            return super()._split_scope(nodeid)

    return QuantFilesTogether(config, log)


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """Under CI every extra is installed, so a skipped test means a reference check silently did not run."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if _under_ci() and skipped and session.exitstatus == 0:
        session.config._llmkit_ci_skips = skipped
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = getattr(config, "_llmkit_ci_skips", [])
    if skipped:
        terminalreporter.write_sep("=", "CI: skipped tests fail the run (CI installs every extra)", red=True)
        for rep in skipped:
            reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            terminalreporter.write_line(f"{rep.nodeid}: {reason}", red=True)


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(args, input: str | bytes | None = None) -> Result:
    """Run `llmkit ARGS` in-process through the real entry point (error mapping included)."""
    from click.testing import CliRunner

    from llmkit.cli import main

    runner = CliRunner()
    code = 0
    with runner.isolation(input=input) as streams:
        out_stream, err_stream = streams[0], streams[1]
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        out = out_stream.getvalue().decode("utf-8", "replace")
        err = err_stream.getvalue().decode("utf-8", "replace")
    return Result(code, out, err)


def llmkit_env(**extra: str) -> dict:
    """The environment for an `llmkit` child process: this checkout first on the path, plus `extra`."""
    return {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), **extra}


def llmkit_argv(*args) -> list[str]:
    """The command line of `llmkit ARGS` as a process, for a caller that starts it itself (an MCP client)."""
    return [sys.executable, "-m", "llmkit", *map(str, args)]


def run_subprocess(args, input: bytes | str | None = None, timeout=60, env: dict | None = None,
                   text: bool = False, **run) -> subprocess.CompletedProcess:
    """Run `llmkit ARGS` as a whole process to completion (output captured; bytes unless `text`; `env`
    added to `llmkit_env()`; `run` passed on to subprocess.run, e.g. stdin or cwd)."""
    return subprocess.run(llmkit_argv(*args), input=input, capture_output=True, timeout=timeout,
                          env=llmkit_env(**(env or {})), text=text, **run)


def start_subprocess(args, env: dict | None = None, **popen) -> subprocess.Popen:
    """Start `llmkit ARGS` as a whole process (stdout and stderr piped unless `popen` says otherwise)."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(llmkit_argv(*args), env=llmkit_env(**(env or {})), **popen)


@pytest.fixture(scope="module")
def kernels():
    """The compiled tokenizer kernels, compiled here if this cache has none yet (LLMKIT_JIT=1)."""
    from llmkit.tokenize import native

    mp = pytest.MonkeyPatch()
    mp.setenv("LLMKIT_JIT", "1")
    k = native.kernels()
    mp.undo()
    assert k is not None, "numba is installed, so the kernels must compile"
    return k


@pytest.fixture(scope="session")
def kernel_docs(tmp_path_factory) -> Path:
    """~2.2 MB of real English text (Linux kernel documentation, GPL-2.0), see fixtures/README.md."""
    p = tmp_path_factory.mktemp("corpus") / "kernel-docs.txt"
    p.write_bytes(gzip.decompress((FIXTURES / "kernel-docs.txt.gz").read_bytes()))
    return p


@pytest.fixture(scope="session")
def kernel_small(kernel_docs, tmp_path_factory) -> Path:
    """The first ~300 kB of the kernel docs, for slower trainers."""
    p = tmp_path_factory.mktemp("corpus") / "kernel-small.txt"
    text = kernel_docs.read_text(encoding="utf-8")[:300_000]
    p.write_text(text[: text.rindex("\n") + 1], encoding="utf-8")
    return p


@pytest.fixture(scope="session")
def tang300(tmp_path_factory) -> Path:
    """300 Tang poems in Simplified Chinese (Debian fortunes-zh, GPL-3.0+)."""
    p = tmp_path_factory.mktemp("corpus") / "tang300.txt"
    p.write_bytes(gzip.decompress((FIXTURES / "tang300.txt.gz").read_bytes()))
    return p
