"""Start real llama-server processes for tests (the binary the install builds with the binding)."""

import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from llamatools import tool

ROOT = Path(__file__).parent.parent


def server_binary() -> str:
    return tool("llama-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model, *args: str) -> tuple[subprocess.Popen, str]:
    """A healthy llama-server on a free port: (process, base URL)."""
    port = free_port()
    proc = subprocess.Popen([server_binary(), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.3)
    proc.kill()
    pytest.fail("llama-server did not become healthy in 120 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
