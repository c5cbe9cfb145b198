"""`llmkit kv ... --server` and `generate --server` against a real llama-server (built by
scripts/build_llama_server.sh, which the README's install command runs)."""

import json
from pathlib import Path

import pytest

from conftest import run_cli
from serverutil import free_port, start_server, stop_server

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from ggufmake import write_tiny_llama

    d = tmp_path_factory.mktemp("server")
    model = write_tiny_llama(d / "tiny.gguf", seed=1)
    slots = d / "slots"
    slots.mkdir()
    proc, url = start_server(model, "--slot-save-path", str(slots) + "/", "-np", "1", "-c", "512", "-t", "1")
    yield {"url": url, "slots": slots, "model": str(model)}
    stop_server(proc)


PROMPT = "You are a helpful assistant. Answer briefly. " * 4


def test_generate_on_server_reuses_cached_prompt(server):
    r1 = run_cli(["generate", "--server", server["url"], "--slot-id", "0", "-n", "8", "--temp", "0", "--json", PROMPT + "Q1"])
    assert r1.exit_code == 0, r1.stderr
    r2 = run_cli(["generate", "--server", server["url"], "--slot-id", "0", "-n", "8", "--temp", "0", "--json", PROMPT + "Q2"])
    s1, s2 = json.loads(r1.stdout)["stats"], json.loads(r2.stdout)["stats"]
    assert s2["prompt_tokens"] < s1["prompt_tokens"]  # the shared prefix came from the slot's cache


def test_server_slot_verbs(server):
    url = server["url"]
    assert run_cli(["generate", "--server", url, "--slot-id", "0", "-n", "4", "--temp", "0", PROMPT]).exit_code == 0
    r = run_cli(["kv", "save", "--server", url, "--slot", "0", "sys.bin"])
    assert r.exit_code == 0, r.stderr
    assert (server["slots"] / "sys.bin").stat().st_size > 1000
    r = run_cli(["kv", "erase", "--server", url, "--slot", "0"])
    assert r.exit_code == 0 and "erased" in r.stderr
    r = run_cli(["kv", "restore", "--server", url, "--slot", "0", "sys.bin"])
    assert r.exit_code == 0 and "restored" in r.stderr
    r = run_cli(["kv", "ls", "--server", url, "--json"])
    rec = json.loads(r.stdout.splitlines()[0])
    assert rec["id"] == 0 and rec["n_ctx"] >= 512


def test_server_errors_are_clear(server):
    url = server["url"]
    r = run_cli(["kv", "restore", "--server", url, "--slot", "0", "missing.bin"])
    assert r.exit_code == 1 and "llama-server" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(["kv", "save", "--server", url, "--slot", "0", "../escape.bin"])
    assert r.exit_code == 1 and "400" in r.stderr
    r = run_cli(["kv", "ls", "--server", f"http://127.0.0.1:{free_port()}"])
    assert r.exit_code == 1 and "cannot reach llama-server" in r.stderr
    r = run_cli(["kv", "ls", "--server", "localhost:8080"])
    assert r.exit_code == 1 and "http://" in r.stderr


def test_slot_files_interchange_with_embedded_mode(server):
    """llama-server's slot files restore in-process (flash attention on, as the server runs), and
    llmkit's --raw files restore in the server."""
    url, model = server["url"], server["model"]
    assert run_cli(["generate", "--server", url, "--slot-id", "0", "-n", "2", "--temp", "0", PROMPT]).exit_code == 0
    assert run_cli(["kv", "save", "--server", url, "--slot", "0", "from_server.bin"]).exit_code == 0
    r = run_cli(["kv", "restore", "-m", model, "--flash-attn", "-c", "512", str(server["slots"] / "from_server.bin"),
                 "Q:", "-n", "4", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["prefill_reused"] > 50
    out = server["slots"] / "from_llmkit.bin"
    r = run_cli(["kv", "save", "-m", model, "--flash-attn", "-c", "512", "--raw", "-o", str(out), PROMPT])
    assert r.exit_code == 0, r.stderr
    r = run_cli(["kv", "restore", "--server", url, "--slot", "0", "from_llmkit.bin"])
    assert r.exit_code == 0 and "restored" in r.stderr
