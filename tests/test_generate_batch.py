"""`llmkit generate --server URL,URL --batch` against real llama-servers started here."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import run_cli
from serverutil import free_port, start_server, stop_server

PROMPTS = ["the quick brown fox", "once upon a time", "def main():", "hello world", "the the the"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from ggufmake import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("batch") / "tiny.gguf", seed=3)


@pytest.fixture(scope="module")
def pool(model):
    a = start_server(model, "-np", "2", "-c", "1024", "-t", "1")
    b = start_server(model, "-np", "1", "-c", "512", "-t", "1")
    yield [a[1], b[1]]
    stop_server(a[0])
    stop_server(b[0])


def _batch_file(tmp_path, lines) -> str:
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" if not isinstance(x, str) else x + "\n" for x in lines))
    return str(p)


def test_batch_output_in_input_order_equals_single_requests(pool, tmp_path):
    items = [{"id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)]
    items[2]["n_predict"] = 3  # per-item option overrides -n
    r = run_cli(["generate", "--server", ",".join(pool), "--batch", _batch_file(tmp_path, items), "-n", "8",
                 "--temp", "0"])
    assert r.exit_code == 0, r.stderr
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["id"] for x in recs] == [f"p{i}" for i in range(len(PROMPTS))]
    assert recs[2]["stats"]["generated_tokens"] <= 3 and recs[0]["stats"]["generated_tokens"] > 3
    assert {x["server"] for x in recs} <= set(pool)
    for rec, item in zip(recs, items):
        one = run_cli(["generate", "--server", pool[1], "-n", str(item.get("n_predict", 8)), "--temp", "0", "--json",
                       item["prompt"]])
        assert one.exit_code == 0, one.stderr
        # (the random model emits byte tokens: a non-streamed answer ends a cut UTF-8 character with
        # U+FFFD where the streamed one leaves it out)
        assert rec["text"].rstrip("\ufffd") == json.loads(one.stdout)["text"].rstrip("\ufffd"), rec["id"]
    assert "5 items" in r.stderr and "on 3 slots" in r.stderr


def test_batch_chat_messages(pool, tmp_path):
    items = [{"id": 1, "messages": [{"role": "user", "content": "hi"}]}, {"id": 2, "prompt": "hi"}]
    r = run_cli(["generate", "--server", pool[0], "--batch", _batch_file(tmp_path, items), "-n", "4", "--temp", "0"])
    assert r.exit_code == 0, r.stderr
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["id"] for x in recs] == [1, 2] and all(x["stats"]["generated_tokens"] for x in recs)


def test_batch_resumes_from_output_file(pool, tmp_path):
    items = [{"id": i, "prompt": p} for i, p in enumerate(PROMPTS)]
    batch = _batch_file(tmp_path, items)
    out = tmp_path / "out.jsonl"
    r = run_cli(["generate", "--server", ",".join(pool), "--batch", batch, "-o", str(out), "-n", "6", "--temp", "0"])
    assert r.exit_code == 0, r.stderr
    first = out.read_text().splitlines()
    assert [json.loads(x)["id"] for x in first] == list(range(5))
    # a killed run leaves a cut line: it is dropped, that item and the missing ones are run again
    out.write_text("\n".join(first[:2]) + "\n" + first[2][:10])
    r = run_cli(["generate", "--server", ",".join(pool), "--batch", batch, "-o", str(out), "-n", "6", "--temp", "0"])
    assert r.exit_code == 0, r.stderr
    assert "2 of 5 items already done, running 3" in r.stderr
    assert out.read_text().splitlines() == first or [json.loads(x)["text"] for x in out.read_text().splitlines()] == \
        [json.loads(x)["text"] for x in first]
    r = run_cli(["generate", "--server", ",".join(pool), "--batch", batch, "-o", str(out), "-n", "6", "--temp", "0"])
    assert r.exit_code == 0 and "5 of 5 items already done, running 0" in r.stderr
    assert len(out.read_text().splitlines()) == 5


def test_malformed_lines_are_reported_with_line_numbers(pool, tmp_path):
    batch = _batch_file(tmp_path, [{"id": "a", "prompt": "x"}, "{not json", {"prompt": "no id"},
                                   {"id": "a", "prompt": "dup"}, {"id": "b", "prompt": "y", "temperature": "hot"},
                                   {"id": "c", "prompt": "z"}])
    r = run_cli(["generate", "--server", pool[0], "--batch", batch, "-n", "2", "--temp", "0"])
    assert r.exit_code == 1 and r.stdout == ""
    assert "line 2: not JSON" in r.stderr and "--on-error skip" in r.stderr
    r = run_cli(["generate", "--server", pool[0], "--batch", batch, "-n", "2", "--temp", "0", "--on-error", "skip"])
    assert r.exit_code == 0, r.stderr
    assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == ["a", "c"]
    for frag in ("line 2: not JSON", "line 3: no \"id\"", "line 4: id \"a\" appears twice", "line 5: \"temperature\" must be a number"):
        assert frag in r.stderr


def test_unreachable_servers_and_usage(tmp_path):
    batch = _batch_file(tmp_path, [{"id": 1, "prompt": "x"}])
    r = run_cli(["generate", "--server", f"http://127.0.0.1:{free_port()}", "--batch", batch])
    assert r.exit_code == 1 and "no llama-server answers" in r.stderr and "Traceback" not in r.stderr
    assert run_cli(["generate", "--batch", batch]).exit_code == 2
    assert run_cli(["generate", "--server", "ftp://x", "--batch", batch]).exit_code == 1


def test_server_killed_mid_batch_loses_and_duplicates_nothing(model, tmp_path):
    a, b = start_server(model, "-np", "1", "-c", "512", "-t", "1"), start_server(model, "-np", "1", "-c", "512", "-t", "1")
    try:
        items = [{"id": i, "prompt": f"{PROMPTS[i % 5]} {i}"} for i in range(40)]
        out = tmp_path / "out.jsonl"
        proc = subprocess.Popen([sys.executable, "-m", "llmkit", "generate", "--server", f"{a[1]},{b[1]}", "--batch",
                                 _batch_file(tmp_path, items), "-o", str(out), "-n", "400", "--temp", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})
        deadline = time.time() + 60
        while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 3):
            time.sleep(0.05)
        a[0].kill()  # server A dies with a request in flight
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()
        ids = [json.loads(x)["id"] for x in out.read_text().splitlines()]
        assert sorted(ids) == list(range(40)) and len(ids) == 40
        assert "servers lost" in err.decode()
    finally:
        stop_server(a[0])
        stop_server(b[0])


def test_retries_must_be_positive(tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_text('{"id": 1, "prompt": "hi"}\n')
    r = run_cli(["generate", "--server", f"http://127.0.0.1:{free_port()}", "--batch", str(f), "--retries", "0"])
    assert r.exit_code == 1 and "--retries must be positive" in r.stderr
