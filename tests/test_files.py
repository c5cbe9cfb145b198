"""Files llmkit writes: the mode a plain open() would give (not mkstemp's 0600), the replaced file's
mode kept, SIGTERM/SIGHUP removing the temp file (exit 143/129), kill -9 leftovers removed by the
next write to the same path."""

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli, run_subprocess, start_subprocess

ROOT = Path(__file__).parent.parent


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_new_files_get_0666_minus_umask(tmp_path, umask022):
    from llmkit.io import atomic_write_bytes

    atomic_write_bytes(tmp_path / "a.bin", b"x")
    assert _mode(tmp_path / "a.bin") == 0o644
    os.umask(0o027)
    atomic_write_bytes(tmp_path / "b.bin", b"x")
    assert _mode(tmp_path / "b.bin") == 0o640


def test_replacing_a_file_keeps_its_mode(tmp_path, umask022):
    from llmkit.io import atomic_write_bytes

    p = tmp_path / "keep.bin"
    p.write_bytes(b"old")
    os.chmod(p, 0o604)
    atomic_write_bytes(p, b"new")
    assert p.read_bytes() == b"new" and _mode(p) == 0o604


def test_cli_outputs_are_readable_by_others(tmp_path, kernel_small, umask022):
    out = tmp_path / "tok.json"
    r = run_cli(["tokenize", "train", "--algo", "bpe", "--vocab-size", "300", "-o", str(out), str(kernel_small)])
    assert r.exit_code == 0, r.stderr
    assert _mode(out) == 0o644


def test_stale_temps_of_dead_processes_are_removed(tmp_path):
    from llmkit.io import atomic_write_bytes

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        stale = tmp_path / f".out.gguf.{dead.pid}.abcd1234.tmp"
        live = tmp_path / f".out.gguf.{alive.pid}.efgh5678.tmp"
        other = tmp_path / f".other.gguf.{dead.pid}.abcd1234.tmp"
        for p in (stale, live, other):
            p.write_bytes(b"leftover")
        atomic_write_bytes(tmp_path / "out.gguf", b"new")
        assert not stale.exists()  # its writer is gone
        assert live.exists()  # a writer still running: not ours to remove
        assert other.exists()  # another output's temp
    finally:
        alive.kill()
        alive.wait()


def _default_handlers(*sigs) -> None:
    """In the child: the default action for these signals; a run under nohup inherits SIGHUP ignored,
    and the child then finished instead of being stopped (seen on a fresh-clone run launched with nohup)."""
    for s in sigs:
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_during_quantize_removes_the_temp_file(tmp_path, sig, code):
    from ggufmake import write_tiny_llama

    src = write_tiny_llama(tmp_path / "big.gguf", n_embd=512, n_layer=8, n_ff=1536, n_head=8, n_head_kv=8)
    out = tmp_path / "out.gguf"
    out.write_bytes(b"previous output")
    # numpy kernels: what is tested is the temp file's removal on a signal, and a first numba
    # compilation under way (30-60 s on a fresh install, two test workers compiling at once) delayed
    # the exit past the timeout on a loaded machine
    p = start_subprocess(["quant", src, "--type", "Q4_K_M", "-o", out, "--threads", "1"], env={"LLMKIT_NO_JIT": "1"},
                         preexec_fn=lambda: _default_handlers(signal.SIGINT, sig))
    deadline = time.time() + 60
    while time.time() < deadline and not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]:
        time.sleep(0.02)
    assert p.poll() is None, "quantization finished before the signal could be sent"
    time.sleep(0.2)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == code, err.decode()[-500:]
    assert not [f.name for f in tmp_path.iterdir() if f.name.endswith(".tmp")]
    assert out.read_bytes() == b"previous output"
    assert b"Traceback" not in err


def test_a_killed_gptq_run_leaves_no_scratch_folder_after_the_next_run(tmp_path, kernel_small):
    """GPTQ keeps its Hessians in TMPDIR/llmkit-gptq-PID-*; `kill -9` runs no handler, so the next
    run removes the folders of processes that are gone (and never a live run's)."""
    from ggufmake import write_tiny_llama

    src = write_tiny_llama(tmp_path / "m.gguf", n_embd=256, n_ff=512, n_layer=3, n_head=4, n_head_kv=2, seed=3)
    calib = tmp_path / "calib.txt"
    calib.write_text(kernel_small.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    live = tmp / f"llmkit-gptq-{alive.pid}-keep"  # another run still at work
    live.mkdir()
    args = ["quant", str(src), "--type", "Q4_K_M", "--method", "gptq", "--calib", str(calib), "-c", "128",
            "--chunks", "4", "-t", "1"]
    env = {"TMPDIR": str(tmp)}
    try:
        p = start_subprocess([*args, "-o", str(tmp_path / "a.gguf")], env=env)
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None and len(list(tmp.glob("llmkit-gptq-*"))) < 2:
            time.sleep(0.02)
        assert p.poll() is None, "the run ended before it could be killed"
        p.kill()
        p.communicate(timeout=60)
        assert [d for d in tmp.glob("llmkit-gptq-*") if d != live]  # what kill -9 leaves behind
        r = run_subprocess([*args, "-o", str(tmp_path / "b.gguf")], env=env, timeout=300, text=True)
        assert r.returncode == 0, r.stderr
        assert sorted(tmp.glob("llmkit-gptq-*")) == [live]
    finally:
        alive.kill()
        alive.wait()
