"""A full disk and a read-only one: `rag index`, `quant` and `kv save` writing into a small tmpfs that
fills up (or is remounted read-only) fail with one line (exit 1, no traceback), and what was there
before is intact: the same bytes, the same query results, no temp files left behind.

Where the platform refuses `mount` (not root), the same tests run against a simulation at the write
layer: files created or opened for writing under the directory fail with ENOSPC (or EROFS); set
LLMKIT_TEST_SIMULATE_DISK=1 to run the simulation where mount works."""

from __future__ import annotations

import builtins
import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import run_cli

SIZE = "8m"


class Disk:
    """A small filesystem at `path` that can be filled up and made read-only, then restored."""

    def __init__(self, path: Path, real: bool, monkeypatch):
        self.path, self.real, self.mp = path, real, monkeypatch
        self.filler = path / "filler"
        self.mode = None  # simulation: None, "full" or "ro"

    def fill(self) -> None:
        if not self.real:
            self._simulate("full")
            return
        for name, size in (("filler", 64 << 10), ("filler2", 512)):  # then the last partial block
            with open(self.path / name, "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC

    def read_only(self) -> None:
        if not self.real:
            self._simulate("ro")
            return
        import gc

        gc.collect()  # index views of earlier queries: SQLite keeps their WAL files open for writing
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)

    def restore(self) -> None:
        if not self.real:
            self.mp.undo()
            self.mode = None
            return
        subprocess.run(["mount", "-o", "remount,rw", str(self.path)], check=True)
        for p in (self.filler, self.path / "filler2"):
            if p.exists():
                p.unlink()

    def _simulate(self, mode: str) -> None:
        """Patch the write layer: opening a file under the directory for writing fails (ENOSPC for a
        new file on a full disk, EROFS for anything on a read-only one), as do renames into it."""
        self.mode = mode
        root = str(self.path.resolve())
        code = errno.ENOSPC if mode == "full" else errno.EROFS
        real_open, real_os_open, real_replace = builtins.open, os.open, os.replace

        def under(p) -> bool:
            try:
                return os.path.abspath(os.fspath(p)).startswith(root + os.sep)
            except TypeError:
                return False

        def refuse(p):
            raise OSError(code, os.strerror(code), os.fspath(p))

        def fake_open(file, mode="r", *a, **kw):
            if isinstance(file, (str, os.PathLike)) and under(file) and any(c in mode for c in "wax+"):
                if code == errno.EROFS or not os.path.exists(file) or "w" in mode:
                    refuse(file)
            return real_open(file, mode, *a, **kw)

        def fake_os_open(path, flags, *a, **kw):
            writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if under(path) and writing and (code == errno.EROFS or not os.path.exists(path)):
                refuse(path)
            return real_os_open(path, flags, *a, **kw)

        def fake_replace(src, dst, *a, **kw):
            if under(dst):
                refuse(dst)
            return real_replace(src, dst, *a, **kw)

        self.mp.setattr(builtins, "open", fake_open)
        self.mp.setattr(os, "open", fake_os_open)
        self.mp.setattr(os, "replace", fake_replace)


@pytest.fixture
def disk(tmp_path):
    d = tmp_path / "fs"
    d.mkdir()
    mounted = not os.environ.get("LLMKIT_TEST_SIMULATE_DISK") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(d)], capture_output=True).returncode == 0
    mp = pytest.MonkeyPatch()
    try:
        yield Disk(d, mounted, mp)
    finally:
        mp.undo()
        if mounted:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _snapshot(d: Path) -> dict[str, bytes]:
    """Every file under d with its bytes (fillers and SQLite's shared-memory index left out)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and not p.name.startswith("filler") and not p.name.endswith("-shm")}


def _one_line_error(r, *words) -> None:
    assert r.exit_code == 1, (r.exit_code, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def _temps(d: Path) -> list[str]:
    return [p.name for p in d.rglob("*.tmp")]


def _docs(d: Path, tag: str, n: int) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (d / f"{tag}{i}.md").write_text(f"# {tag} {i}\nDocument zq{tag}{i} is about kernel pages and memory {i}.\n" * 20)
    return d


def _query(idx, word):
    r = run_cli(["rag", "query", str(idx), word, "--mode", "bm25", "-k", "3", "--jsonl"])
    assert r.exit_code == 0, r.stderr
    return [json.loads(x)["doc"] for x in r.stdout.splitlines()]


@pytest.mark.parametrize("how", ["full", "read-only"])
def test_rag_index_on_a_full_or_read_only_disk(disk, tmp_path, how):
    idx = disk.path / "idx"
    assert run_cli(["rag", "index", str(idx), str(_docs(tmp_path / "a", "a", 3))]).exit_code == 0
    before, hits = _snapshot(idx), _query(idx, "zqa1")
    big = _docs(tmp_path / "b", "b", 40)
    disk.fill() if how == "full" else disk.read_only()
    r = run_cli(["rag", "index", str(idx), str(big)])
    words = ["No space left on device" if how == "full" else "Read-only file system"]
    _one_line_error(r, *words, "free some space or choose a writable directory")
    if how == "read-only":
        assert _query(idx, "zqa1") == hits  # a read-only index still answers
    disk.restore()
    assert _query(idx, "zqa1") == hits
    after = _snapshot(idx)
    assert json.loads(after["manifest.json"]) == json.loads(before["manifest.json"])
    assert {k for k in after if k.startswith("gen-")} == {k for k in before if k.startswith("gen-")}
    assert not _temps(idx)
    r = run_cli(["rag", "index", str(idx), str(big)])  # with space again the run goes through
    assert r.exit_code == 0, r.stderr
    assert _query(idx, "zqb7")[0].endswith("b7.md") and _query(idx, "zqa1") == hits


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from ggufmake import write_tiny_llama

    return str(write_tiny_llama(tmp_path_factory.mktemp("disk") / "tiny.gguf", seed=5, n_embd=256, n_ff=512))


@pytest.mark.parametrize("how", ["full", "read-only"])
def test_quant_on_a_full_or_read_only_disk(disk, tiny_model, how):
    out = disk.path / "out.gguf"
    assert run_cli(["quant", tiny_model,"--type", "Q8_0", "-o", str(out)]).exit_code == 0
    before = out.read_bytes()
    disk.fill() if how == "full" else disk.read_only()
    r = run_cli(["quant", tiny_model,"--type", "Q4_0", "-o", str(out)])
    _one_line_error(r, "No space left on device" if how == "full" else "Read-only file system", "is intact")
    disk.restore()
    assert out.read_bytes() == before and not _temps(disk.path)
    assert run_cli(["quant", tiny_model,"--type", "Q4_0", "-o", str(out)]).exit_code == 0
    assert out.read_bytes() != before


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("how", ["full", "read-only"])
def test_kv_save_on_a_full_or_read_only_disk(disk, tiny_model, how, raw):
    slot = disk.path / "a.slot"
    flags = ["--raw"] if raw else []
    prompt = "the quick brown fox jumps over the lazy dog " * 8
    assert run_cli(["kv", "save", "-m", tiny_model, "-o", str(slot), *flags, prompt]).exit_code == 0
    before = slot.read_bytes()
    disk.fill() if how == "full" else disk.read_only()
    r = run_cli(["kv", "save", "-m", tiny_model, "-o", str(slot), *flags, prompt + "and more"])
    _one_line_error(r, "No space left on device" if how == "full" else "Read-only file system")
    disk.restore()
    assert slot.read_bytes() == before and not _temps(disk.path)
    assert not [p for p in disk.path.iterdir() if p.name.startswith(".a.slot")]
