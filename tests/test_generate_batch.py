"""`llmkit generate --server URL,URL --batch` against real llama-servers started here."""

import json
import subprocess
import time

import pytest

from conftest import run_cli, start_subprocess
from serverutil import free_port, server_binary, start_server, stop_server

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
    r = run_cli(["server", "batch", "--server", ",".join(pool), _batch_file(tmp_path, items), "-n", "8",
                 "--temp", "0"])
    assert r.exit_code == 0, r.stderr
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["id"] for x in recs] == [f"p{i}" for i in range(len(PROMPTS))]
    assert recs[2]["stats"]["generated_tokens"] <= 3 and recs[0]["stats"]["generated_tokens"] > 3
    assert {x["server"] for x in recs} <= set(pool)
    for rec, item in zip(recs, items):
        one = run_cli(["server", "generate", "--server", pool[1], "-n", str(item.get("n_predict", 8)), "--temp", "0", "--json",
                       item["prompt"]])
        assert one.exit_code == 0, one.stderr
        # (the random model emits byte tokens: a non-streamed answer ends a cut UTF-8 character with
        # U+FFFD where the streamed one leaves it out)
        assert rec["text"].rstrip("\ufffd") == json.loads(one.stdout)["text"].rstrip("\ufffd"), rec["id"]
    assert "5 items" in r.stderr and "on 3 slots" in r.stderr


def test_batch_chat_messages(pool, tmp_path):
    items = [{"id": 1, "messages": [{"role": "user", "content": "hi"}]}, {"id": 2, "prompt": "hi"}]
    r = run_cli(["server", "batch", "--server", pool[0], _batch_file(tmp_path, items), "-n", "4", "--temp", "0"])
    assert r.exit_code == 0, r.stderr
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["id"] for x in recs] == [1, 2] and all(x["stats"]["generated_tokens"] for x in recs)


def test_batch_resumes_from_output_file(pool, tmp_path):
    items = [{"id": i, "prompt": p} for i, p in enumerate(PROMPTS)]
    batch = _batch_file(tmp_path, items)
    out = tmp_path / "out.jsonl"
    r = run_cli(["server", "batch", "--server", ",".join(pool), batch, "-o", str(out), "-n", "6", "--temp", "0"])
    assert r.exit_code == 0, r.stderr
    first = out.read_text().splitlines()
    assert [json.loads(x)["id"] for x in first] == list(range(5))
    # a killed run leaves a cut line: it is dropped, that item and the missing ones are run again
    out.write_text("\n".join(first[:2]) + "\n" + first[2][:10])
    r = run_cli(["server", "batch", "--server", ",".join(pool), batch, "-o", str(out), "-n", "6", "--temp", "0"])
    assert r.exit_code == 0, r.stderr
    assert "2 of 5 items already done, running 3" in r.stderr
    assert out.read_text().splitlines() == first or [json.loads(x)["text"] for x in out.read_text().splitlines()] == \
        [json.loads(x)["text"] for x in first]
    r = run_cli(["server", "batch", "--server", ",".join(pool), batch, "-o", str(out), "-n", "6", "--temp", "0"])
    assert r.exit_code == 0 and "5 of 5 items already done, running 0" in r.stderr
    assert len(out.read_text().splitlines()) == 5


def test_malformed_lines_are_reported_with_line_numbers(pool, tmp_path):
    batch = _batch_file(tmp_path, [{"id": "a", "prompt": "x"}, "{not json", {"prompt": "no id"},
                                   {"id": "a", "prompt": "dup"}, {"id": "b", "prompt": "y", "temperature": "hot"},
                                   {"id": "c", "prompt": "z"}])
    r = run_cli(["server", "batch", "--server", pool[0], batch, "-n", "2", "--temp", "0"])
    assert r.exit_code == 1 and r.stdout == ""
    assert "line 2: not JSON" in r.stderr and "--on-error skip" in r.stderr
    r = run_cli(["server", "batch", "--server", pool[0], batch, "-n", "2", "--temp", "0", "--on-error", "skip"])
    assert r.exit_code == 0, r.stderr
    assert [json.loads(x)["id"] for x in r.stdout.splitlines()] == ["a", "c"]
    for frag in ("line 2: not JSON", "line 3: no \"id\"", "line 4: id \"a\" appears twice", "line 5: \"temperature\" must be a number"):
        assert frag in r.stderr


def test_unreachable_servers_and_usage(tmp_path):
    batch = _batch_file(tmp_path, [{"id": 1, "prompt": "x"}])
    out = tmp_path / "out.jsonl"
    r = run_cli(["server", "batch", "--server", f"http://127.0.0.1:{free_port()}", batch, "-o", str(out)])
    assert r.exit_code == 1 and "no llama-server answers" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()  # a failed run leaves no empty output behind
    assert run_cli(["server", "batch", batch]).exit_code == 2  # --server is required
    assert run_cli(["server", "batch", "--server", "ftp://x", batch]).exit_code == 1
    # options of the in-process model are not options of the server commands: usage errors, not dropped
    url = f"http://127.0.0.1:{free_port()}"
    for extra in (["--draft-model", "d.gguf"], ["--chat"], ["--prompt-cache", str(tmp_path)], ["--lookup", "3"]):
        r = run_cli(["server", "generate", "--server", url, *extra, "hello"])
        assert r.exit_code == 2 and extra[0] in r.stderr, r.stderr


def test_server_killed_mid_batch_loses_and_duplicates_nothing(model, tmp_path):
    a, b = start_server(model, "-np", "1", "-c", "512", "-t", "1"), start_server(model, "-np", "1", "-c", "512", "-t", "1")
    try:
        items = [{"id": i, "prompt": f"{PROMPTS[i % 5]} {i}"} for i in range(40)]
        out = tmp_path / "out.jsonl"
        proc = start_subprocess(["server", "batch", "--server", f"{a[1]},{b[1]}",
                                 _batch_file(tmp_path, items), "-o", str(out), "-n", "400", "--temp", "0"])
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


def _start_on(model, url: str, *args: str) -> subprocess.Popen:
    """A llama-server started again on the address of one that died (healthy when this returns)."""
    import urllib.request

    port = url.rsplit(":", 1)[1]
    proc = subprocess.Popen([server_binary(), "-m", str(model), "--host", "127.0.0.1", "--port", port, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            assert proc.poll() is None, "llama-server could not start again on its port"
            time.sleep(0.1)
    proc.kill()
    pytest.fail("the restarted llama-server did not become healthy in 60 s")


def _lines(out) -> list[dict]:
    return [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []


def test_server_restarted_mid_batch_loses_and_duplicates_nothing(model, tmp_path):
    """A dies with a request in flight and comes back on the same port; then B dies: the batch goes
    on on the restarted A. Every item is answered exactly once, in input order."""
    n = 120
    args = ("-np", "1", "-c", "512", "-t", "1")
    a, b = start_server(model, *args), start_server(model, *args)
    again = None
    try:
        items = [{"id": i, "prompt": f"{PROMPTS[i % 5]} {i}"} for i in range(n)]
        out = tmp_path / "out.jsonl"
        proc = start_subprocess(["server", "batch", "--server", f"{a[1]},{b[1]}",
                                 _batch_file(tmp_path, items), "-o", str(out), "-n", "400", "--temp", "0"])
        deadline = time.time() + 60
        while time.time() < deadline and len(_lines(out)) < 5:
            time.sleep(0.05)
        a[0].kill()  # A dies with a request in flight
        a[0].wait()
        again = _start_on(model, a[1], *args)
        done_at_restart = len(_lines(out))
        assert done_at_restart < n - 20, "the batch finished before the restart: give it more items"
        b[0].kill()  # now B dies too: only the restarted A is left
        b[0].wait()
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()
        recs = _lines(out)
        assert [r["id"] for r in recs] == list(range(n))  # every item once, in input order
        assert recs[-1]["server"] == a[1]  # the last ones ran on the restarted server
        assert f"{n} items" in err.decode() and f"servers lost: {a[1]}, {b[1]}" in err.decode()
    finally:
        stop_server(a[0])
        stop_server(b[0])
        if again is not None:
            stop_server(again)


def test_retries_must_be_positive(tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_text('{"id": 1, "prompt": "hi"}\n')
    r = run_cli(["server", "batch", "--server", f"http://127.0.0.1:{free_port()}", str(f), "--retries", "0"])
    assert r.exit_code == 1 and "--retries must be a positive number" in r.stderr


class _Flaky:
    """A stand-in llama-server on loopback: drops the first `drops` completions (as a server that
    dies does), answers /health 503 while `down`, then answers every completion."""

    def __init__(self, drops: int):
        import http.server
        import threading

        self.drops, self.down, self.served = drops, True, 0
        flaky = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _json(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/props":
                    self._json(200, {"total_slots": 1})
                else:
                    self._json(503 if flaky.down else 200, {"status": "loading" if flaky.down else "ok"})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if flaky.drops > 0:
                    flaky.drops -= 1
                    self.close_connection = True  # no answer: the connection just ends
                    return
                flaky.served += 1
                self._json(200, {"content": "ok", "timings": {"predicted_n": 1}})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_server_that_comes_back_rejoins_and_one_that_does_not_ends_the_batch(monkeypatch):
    import threading

    from llmkit.llama import batch

    monkeypatch.setattr(batch, "REJOIN_S", 1.5)
    monkeypatch.setattr(batch, "PROBE_S", 0.05)
    items, _ = batch.parse_items([json.dumps({"id": i, "prompt": "x"}) for i in range(6)])
    s = _Flaky(drops=2)
    try:  # the only server drops two requests, says 503 for a while, then is back: nothing is lost
        threading.Timer(0.5, lambda: setattr(s, "down", False)).start()
        got = []
        rep = batch.run_batch(items, [s.url], {"n_predict": 1}, got.append, max_tries=5)
        assert [r["id"] for r in got] == list(range(6)) and s.served == 6
        assert rep.servers_lost == [s.url] and rep.servers_back == [s.url] and rep.retried == 2
    finally:
        s.close()
    s = _Flaky(drops=1)
    try:  # it never comes back: the batch ends after REJOIN_S with what is missing
        t = time.monotonic()
        with pytest.raises(batch.ServersLost, match="none came back within 2 s; 6 items were not generated"):
            batch.run_batch(items, [s.url], {"n_predict": 1}, lambda r: None, max_tries=5)
        assert time.monotonic() - t < 10
    finally:
        s.close()


def test_output_that_is_not_a_batch_record_is_refused_before_any_request(tmp_path):
    """-o naming a file that holds something else: one line, exit 1, the file untouched, no server asked."""
    out = tmp_path / "notes.jsonl"
    out.write_text('{"not": "a record"}\n')
    r = run_cli(["server", "batch", "--server", "http://127.0.0.1:9", _batch_file(tmp_path, [{"id": 1, "prompt": "x"}]),
                 "-o", str(out)])
    assert r.exit_code == 1 and "line 1 is not an output record of llmkit server batch" in r.stderr
    assert out.read_text() == '{"not": "a record"}\n'
