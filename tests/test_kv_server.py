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
    r1 = run_cli(["server", "generate", "--server", server["url"], "--slot", "0", "-n", "8", "--temp", "0", "--json", PROMPT + "Q1"])
    assert r1.exit_code == 0, r1.stderr
    r2 = run_cli(["server", "generate", "--server", server["url"], "--slot", "0", "-n", "8", "--temp", "0", "--json", PROMPT + "Q2"])
    s1, s2 = json.loads(r1.stdout)["stats"], json.loads(r2.stdout)["stats"]
    assert s2["prompt_tokens"] < s1["prompt_tokens"]  # the shared prefix came from the slot's cache
    # cached_tokens counts the prompt's tokens taken from the cache (llama-server's cache_n), as in `server batch`
    assert s2["cached_tokens"] + s2["prompt_tokens"] == s1["cached_tokens"] + s1["prompt_tokens"]


def test_server_slot_verbs(server):
    url = server["url"]
    assert run_cli(["server", "generate", "--server", url, "--slot", "0", "-n", "4", "--temp", "0", PROMPT]).exit_code == 0
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
    assert run_cli(["server", "generate", "--server", url, "--slot", "0", "-n", "2", "--temp", "0", PROMPT]).exit_code == 0
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


def _server_gen(url, prompt, *args):
    r = run_cli(["server", "generate", "--server", url, "--slot", "0", "--json", *args, prompt])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_restored_slot_continues_exactly_as_without_save_restore(server):
    """Greedy on an F32 model: the continuation after save -> erase -> other prompt -> restore equals the
    continuation computed from scratch, and the restored KV was used (few prompt tokens evaluated)."""
    url = server["url"]
    question = PROMPT + "Q: the"
    assert run_cli(["kv", "erase", "--server", url, "--slot", "0"]).exit_code == 0
    fresh = _server_gen(url, question, "-n", "24", "--temp", "0", "--ignore-eos")
    _server_gen(url, PROMPT, "-n", "1", "--temp", "0")
    assert run_cli(["kv", "save", "--server", url, "--slot", "0", "cont.bin"]).exit_code == 0
    assert run_cli(["kv", "erase", "--server", url, "--slot", "0"]).exit_code == 0
    _server_gen(url, "something else entirely, " * 6, "-n", "4", "--temp", "0")  # the slot now holds other KV
    r = run_cli(["kv", "restore", "--server", url, "--slot", "0", "cont.bin"])
    assert r.exit_code == 0 and "restored" in r.stderr, r.stderr
    again = _server_gen(url, question, "-n", "24", "--temp", "0", "--ignore-eos")
    assert again["text"] == fresh["text"] and len(fresh["text"]) > 0
    assert again["stats"]["prompt_tokens"] < fresh["stats"]["prompt_tokens"] / 4  # the prefix came from the file


def test_generate_on_server_passes_sampling_settings_and_stop(server):
    """--top-k 1 makes temperature irrelevant (equals greedy); --stop cuts the server's text."""
    url = server["url"]
    greedy = _server_gen(url, PROMPT, "-n", "24", "--temp", "0", "--ignore-eos")["text"]
    top1 = [_server_gen(url, PROMPT, "-n", "24", "--temp", "5", "--top-k", "1", "--seed", str(s), "--ignore-eos")["text"]
            for s in (1, 2)]
    assert top1 == [greedy, greedy]
    hot = {_server_gen(url, PROMPT, "-n", "24", "--temp", "5", "--top-k", "0", "--top-p", "1", "--min-p", "0",
                       "--seed", str(s), "--ignore-eos")["text"] for s in (1, 2)}
    assert greedy not in hot  # without top-k 1 the same temperature samples other text
    stop = next(c for c in greedy[1:] if c.isascii() and c.isprintable() and c != " ")
    cut = _server_gen(url, PROMPT, "-n", "24", "--temp", "0", "--ignore-eos", "--stop", stop)["text"]
    assert cut == greedy[: greedy.index(stop)]


def test_generate_on_server_passes_grammar_and_schema(server, tmp_path):
    url = server["url"]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    d = json.loads(_server_gen(url, "Answer as JSON:", "-n", "128", "--seed", "1", "--json-schema", json.dumps(schema))["text"])
    assert set(d) == {"ok"} and isinstance(d["ok"], bool)
    (tmp_path / "g.gbnf").write_text('root ::= "yes" | "no"\n')
    assert _server_gen(url, "Answer:", "-n", "8", "--seed", "1", "--grammar-file", str(tmp_path / "g.gbnf"))["text"] in ("yes", "no")
    r = run_cli(["server", "generate", "--server", url, "--slot", "0", "-n", "6", "--seed", "2", "--grammar",
                 "root ::= [0-9]+", "--json", "A number:"])
    assert r.exit_code == 0 and json.loads(r.stdout)["text"].isdigit(), r.stderr
    r = run_cli(["server", "generate", "--server", url, "--json-schema", "{not json", "hi"])
    assert r.exit_code == 1 and "--json-schema is not JSON" in r.stderr
