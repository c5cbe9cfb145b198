"""The one client for llama.cpp's llama-server (HTTP, JSON): completions, chat, slots, properties.

Failures come in two kinds, because a caller with several servers treats them differently:
`ServerDown` (could not connect, the connection dropped, or a 502/503/504 from a loading server or
a proxy in front of a dead one: try another server) and `RequestFailed` (the server answered but
refused this request, or did not answer with JSON: another server would refuse it too).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Callable, Iterator

from llmkit.errors import BadInput

RETRY_CODES = (502, 503, 504)


class ServerDown(BadInput):
    """The server could not be reached or dropped the connection."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"cannot reach llama-server at {url} ({reason}).")
        self.url, self.reason = url, reason


class RequestFailed(BadInput):
    """The server answered but refused the request; `detail` is its reason in a few words."""

    def __init__(self, message: str, detail: str | None = None, code: int | None = None):
        super().__init__(message)
        self.detail = detail if detail is not None else message
        self.code = code


class BadSlotId(BadInput):
    def __init__(self, slot_id: int):
        super().__init__(f"a server slot id must be >= 0, got {slot_id}.")
        self.slot_id = slot_id


def http_error_message(e: urllib.error.HTTPError) -> str:
    """llama-server's error answer in a few words: '400 the prompt is too long' (or 'HTTP 503')."""
    try:
        d = json.loads(e.read())
        err = d.get("error", d)
        return f"{e.code} {err.get('message', err) if isinstance(err, dict) else err}"
    except (ValueError, AttributeError):
        return f"HTTP {e.code}"


class LlamaServer:
    """llama-server's HTTP API: GET /props, GET /slots, POST /slots/{id}?action=save|restore|erase,
    POST /completion (plain or streamed), POST /v1/chat/completions."""

    def __init__(self, url: str, timeout: float = 600.0):
        if not url.startswith(("http://", "https://")):
            raise BadInput(f"server URL '{url}' must start with http:// or https://, e.g. http://127.0.0.1:8080.")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def open(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        """The HTTP response (a context manager to read or iterate); raises ServerDown or RequestFailed."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            detail = http_error_message(e)
            raise RequestFailed(f"llama-server at {self.url} refused {method} {path}: {detail}.", detail, e.code) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:  # refused, reset, timed out
            raise ServerDown(self.url, str(getattr(e, "reason", e)) or type(e).__name__) from None

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        """The server's JSON answer to one request."""
        with self.open(method, path, body, timeout) as r:
            try:
                raw = r.read()
            except (OSError, http.client.HTTPException) as e:  # closed, cut short or timed out mid-answer
                raise ServerDown(self.url, str(getattr(e, "reason", e)) or type(e).__name__) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise RequestFailed(f"{self.url}{path} did not answer with JSON; is this a llama-server?") from None

    def total_slots(self) -> int:
        """Number of parallel slots (llama-server -np): /props total_slots, else the length of /slots."""
        props = self.request("GET", "/props", timeout=10)
        n = props.get("total_slots") if isinstance(props, dict) else None
        if not n:
            n = len(self.request("GET", "/slots", timeout=10))
        return n

    def healthy(self) -> bool:
        """Does the server answer GET /health with 200 (up, model loaded)?"""
        try:
            with self.open("GET", "/health", timeout=2) as r:
                return r.status == 200
        except (ServerDown, RequestFailed):
            return False

    def slots(self) -> list[dict]:
        return self.request("GET", "/slots")

    def slot_action(self, slot_id: int, action: str, filename: str | None = None) -> dict:
        """Save, restore or erase one slot's KV cache (files live in the server's --slot-save-path)."""
        if slot_id < 0:
            raise BadSlotId(slot_id)
        body = {"filename": filename} if filename is not None else {}
        return self.request("POST", f"/slots/{slot_id}?action={action}", body)

    def completion(self, prompt: str, n_predict: int, slot_id: int | None = None, temperature: float = 0.0,
                   seed: int | None = None, on_text: Callable[[str], None] | None = None, **options) -> dict:
        """Stream a completion with cache_prompt on; returns the final message (timings, tokens_cached).

        `options` are further /completion fields (top_k, top_p, min_p, repeat_penalty, stop, ignore_eos,
        grammar, json_schema); None values are left out."""
        body = {"prompt": prompt, "n_predict": n_predict, "cache_prompt": True, "temperature": temperature,
                "stream": True, **{k: v for k, v in options.items() if v is not None}}
        if slot_id is not None:
            body["id_slot"] = slot_id
        if seed is not None:
            body["seed"] = seed
        text, last = [], {}
        with self.open("POST", "/completion", body) as r:
            for msg in _sse(r):
                piece = msg.get("content", "")
                if piece:
                    text.append(piece)
                    if on_text:
                        on_text(piece)
                last = msg
        last["content"] = "".join(text)
        return last


def _sse(resp) -> Iterator[dict]:
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if line.startswith("data:"):
            payload = line[5:].strip()
            if payload and payload != "[DONE]":
                yield json.loads(payload)
