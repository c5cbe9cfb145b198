"""The one way every benchmark here is measured (not a test).

- Whole processes: each side (the anchor and llmkit) runs as its own child process on the same
  input files; the clock is `time.perf_counter()` around the child in *this* process, so start-up,
  imports and writing the output are inside the figure on both sides. Peak RSS is the child's
  own `ru_maxrss`, read by GNU time (/usr/bin/time -f %M; see GNU_TIME for why not wait4 here):
  the largest of the child and the grandchildren it waited for, not a sum.
- Alternation: the sides run A B A B ... (one untimed warm-up round first, so page cache and
  compiled-kernel caches are warm for both), at least 3 rounds, 5 when a run takes under a second.
- In-process figures (ms per query, tok/s, passages/s) come from child processes that time the
  same span on both sides and print it as the last line of stdout (one JSON object); the harness
  alternates those children the same way and takes the median over runs.
- Every row keeps the exact command lines that produced it; `run.py` writes them into RESULTS.md.

    wall = compare([Cmd("HF", [...]), Cmd("llmkit", [...])], cfg)   # -> {label: [Run, ...]}
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BENCH = os.path.join(ROOT, "benchmarks")
PY = sys.executable
# single-threaded HF tokenizers (NOTES.md); OpenMP keeps its default: each side chooses as users get it
BASE_ENV = {"PYTHONPATH": ROOT, "RAYON_NUM_THREADS": "1", "RAYON_RS_NUM_CPUS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


@dataclass
class Config:
    """How big and how often: `quick` for the 20-minute run, `smoke` only proves the plumbing."""

    quick: bool = False
    smoke: bool = False
    work: str = ""
    quant_model: str = ""  # a real F16/F32 GGUF for the quant area's real-size rows (run.py --quant-model)
    quant_imatrix: str = ""  # its imatrix (run.py --quant-imatrix), for the rows that need one
    quant_calib: str = ""  # calibration text for GPTQ's Hessians (run.py --quant-calib; area quant-gptq)
    parts: frozenset = frozenset()  # run.py --part: only these groups of an area's rows (empty: all)

    @property
    def mode(self) -> str:
        return "smoke" if self.smoke else "quick" if self.quick else "full"

    def pick(self, full, quick, smoke):
        """The setting for this mode."""
        return smoke if self.smoke else quick if self.quick else full

    def wants(self, part: str) -> bool:
        """Whether this run makes the area's group of rows called `part` (run.py --part)."""
        return not self.parts or part in self.parts

    def tmp(self, name: str) -> str:
        """A fresh directory under this run's work directory."""
        path = os.path.join(self.work, name)
        os.makedirs(path, exist_ok=True)
        return path


@dataclass
class Cmd:
    """One side's whole command: argv, extra environment, optional stdin/stdout files."""

    label: str
    argv: list
    env: dict = field(default_factory=dict)
    stdin: str | None = None
    stdout: str | None = None
    stderr: str | None = None  # keep the child's stderr here (some anchors print their result there)

    def shell(self) -> str:
        """The command as one could paste it into a shell (paths shortened to the repo root)."""
        env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in self.env.items())
        argv = [("python" if a == PY else os.path.relpath(a, ROOT) if isinstance(a, str) and a.startswith(ROOT + "/")
                 else str(a)) for a in self.argv]
        s = " ".join(_quote(a) for a in argv)
        if self.stdin:
            s += f" < {self.stdin}"
        if self.stdout:
            s += f" > {self.stdout}"
        return f"{env} {s}".strip()


def _quote(arg: str) -> str:
    """Shell quoting that keeps a command on one line (bash $'...' for newlines and tabs)."""
    if "\n" in arg or "\t" in arg:
        return "$'" + arg.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\t", "\\t") + "'"
    return shlex.quote(arg)


@dataclass
class Run:
    wall_s: float
    rss_mb: float
    report: dict  # the child's stdout (or its last line) if that was JSON
    cpu_s: float = 0.0  # user + system CPU seconds of the child (and the grandchildren it waited for)


class ChildFailed(RuntimeError):
    pass


# A child forked from this (large) process starts with this process's resident pages counted in its
# ru_maxrss (fork copies them; vfork/exec charges the parent's high-water mark): a 2 MB program started
# from a parent that imported torch reports 220 MB. GNU time forks the command from a ~2 MB process
# and reports that grandchild's own peak, so it stands between us and every child when it exists.
GNU_TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None


def run_once(cmd: Cmd, timeout: float = 3600) -> Run:
    """Run `cmd` as a child process; wall time measured here, peak RSS via GNU time (else wait4)."""
    env = {**os.environ, **BASE_ENV, **{k: str(v) for k, v in cmd.env.items()}}
    # children keep Python's bytecode cache as an installed program does (a shell that sets
    # PYTHONDONTWRITEBYTECODE would have every llmkit run compile its modules again)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    argv = [str(a) for a in cmd.argv]
    rss_file = None
    if GNU_TIME:
        fd, rss_file = tempfile.mkstemp(suffix=".rss")
        os.close(fd)
        argv = [GNU_TIME, "-o", rss_file, "-f", "%M %U %S", *argv]
    try:
        run = _run(cmd, argv, env, timeout)
        if rss_file:
            last = (open(rss_file).read().strip().splitlines() or [""])[-1].split()
            if len(last) == 3 and last[0].isdigit():
                run.rss_mb, run.cpu_s = int(last[0]) / 1024, float(last[1]) + float(last[2])
    finally:
        if rss_file:
            os.unlink(rss_file)
    return run


def _run(cmd: Cmd, argv: list[str], env: dict, timeout: float) -> Run:
    with (open(cmd.stderr, "w+b") if cmd.stderr else tempfile.TemporaryFile()) as err, tempfile.TemporaryFile() as cap:
        stdin = open(cmd.stdin, "rb") if cmd.stdin else subprocess.DEVNULL
        out = open(cmd.stdout, "wb") if cmd.stdout else cap
        try:
            t0 = time.perf_counter()
            p = subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=err, env=env, cwd=ROOT)
            killer = threading.Timer(timeout, p.kill)  # a blocking wait4 (no polling delay in the figure)
            killer.start()
            try:
                _, status, ru = os.wait4(p.pid, 0)
                wall = time.perf_counter() - t0
            finally:
                killer.cancel()
            p.returncode = os.waitstatus_to_exitcode(status)
        finally:
            if cmd.stdin:
                stdin.close()
            if cmd.stdout:
                out.close()
        if p.returncode:
            err.seek(0)
            raise ChildFailed(f"{cmd.label} exited {p.returncode}: {cmd.shell()}\n{err.read().decode(errors='replace')[-2000:]}")
        report = {}
        if not cmd.stdout:
            cap.seek(0)
            text = cap.read().decode(errors="replace").strip()
            lines = text.splitlines()
            for cand in (text, lines[-1] if lines else ""):  # one JSON document, or JSON as the last line
                if cand[:1] in "{[" and cand:
                    try:
                        report = json.loads(cand)
                        break
                    except json.JSONDecodeError:
                        pass
    return Run(wall, ru.ru_maxrss / 1024, report, ru.ru_utime + ru.ru_stime)


def compare(cmds: list[Cmd], cfg: Config, warmup: bool = True, min_runs: int = 3, fast_runs: int = 5,
            fast_s: float = 1.0, between=None) -> dict[str, list[Run]]:
    """Alternate the commands A B A B ...: min_runs rounds, fast_runs when the slowest median is under fast_s.

    `between(label)` is called before each run (e.g. to delete an output the previous run left)."""
    runs: dict[str, list[Run]] = {c.label: [] for c in cmds}

    def one_round(keep: bool):
        for c in cmds:
            if between:
                between(c.label)
            r = run_once(c)
            if keep:
                runs[c.label].append(r)

    if warmup:
        one_round(False)
    for _ in range(min_runs):
        one_round(True)
    fast = [c for c in cmds if statistics.median(r.wall_s for r in runs[c.label]) < fast_s]
    for _ in range(max(0, fast_runs - min_runs)):  # runs under a second: more of them (still alternating)
        for c in fast:
            if between:
                between(c.label)
            runs[c.label].append(run_once(c))
    return runs


@dataclass
class Stat:
    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, xs) -> Stat:
        xs = list(xs)
        return cls(statistics.median(xs), min(xs), max(xs), len(xs))

    def fmt(self, unit: str = "s", digits: int = 2, scale: float = 1.0) -> str:
        f = f"{{:.{digits}f}}"
        m, lo, hi = (f.format(v * scale) for v in (self.median, self.lo, self.hi))
        return f"{m} {unit} ({lo}–{hi}, n={self.n})"


def walls(runs: list[Run]) -> Stat:
    return Stat.of(r.wall_s for r in runs)


def cpu(runs: list[Run]) -> Stat:
    return Stat.of(r.cpu_s for r in runs)


def rss(runs: list[Run]) -> float:
    return max(r.rss_mb for r in runs)


def field_stat(runs: list[Run], key: str) -> Stat:
    """Median/min/max of one in-process figure the children reported."""
    return Stat.of(float(r.report[key]) for r in runs)


def ratio(a: float, b: float) -> str:
    """a / b as "1.23×"."""
    return f"{a / b:.2f}×" if b else "–"


def speed(anchor_s: float, ours_s: float, anchor: str) -> str:
    """llmkit's speed relative to the anchor's, from two times (> 1: llmkit is faster)."""
    return f"speed {anchor_s / ours_s:.2f}× {anchor}" if ours_s else "–"


@dataclass
class Row:
    """One line of RESULTS.md: an id README text can cite, the figures, a check, the commands."""

    id: str
    what: str
    anchor: str = "–"
    llmkit: str = "–"
    ratio: str = "–"
    check: str = ""
    commands: list = field(default_factory=list)

    @classmethod
    def skipped(cls, id: str, what: str, why: str) -> Row:
        return cls(id, what, check=f"not run: {why}")


def cmds_of(*cmds: Cmd) -> list[str]:
    return [f"{c.label}: `{c.shell()}`" for c in cmds]


# -- machine and versions ---------------------------------------------------------------------------
def machine() -> dict:
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        mem = int([x for x in open("/proc/meminfo") if x.startswith("MemTotal")][0].split()[1]) / 2**20
    except (OSError, IndexError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem, 1), "os": platform.platform(),
            "python": platform.python_version()}


def llama_bin(name: str) -> str | None:
    """A llama.cpp tool: where llmkit itself finds it (the binding's build, then the cache that
    scripts/build_llama_server.sh fills), else None."""
    from llmkit.llama import tools

    found = tools.find(name)
    return str(found) if found else None


def versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("llmkit", "tokenizers", "tiktoken", "rank-bm25", "bm25s", "numba", "numpy", "faiss-cpu", "onnxruntime",
                 "sentence-transformers", "torch", "llama-cpp-python", "pymilvus", "milvus-lite", "ray"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    q = llama_bin("llama-server")
    if q:
        try:
            p = subprocess.run([q, "--version"], capture_output=True, text=True, timeout=30)
            line = [x for x in (p.stdout + p.stderr).splitlines() if x.startswith("version")]
            out["llama.cpp (tools)"] = (line[0].split(":", 1)[1].strip() if line else "?") + f" ({os.path.dirname(q)})"
        except (OSError, subprocess.TimeoutExpired):
            out["llama.cpp (tools)"] = "unreadable"
    else:
        out["llama.cpp (tools)"] = "not built (scripts/build_llama_server.sh)"
    try:
        out["llmkit commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                              text=True).stdout.strip() + (" + uncommitted changes" if subprocess.run(
                                                  ["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                                                  capture_output=True, text=True).stdout.strip() else "")
    except OSError:
        pass
    return out


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())
