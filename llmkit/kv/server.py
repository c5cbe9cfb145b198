"""A small client for llama.cpp's llama-server: KV slots and cached-prompt completions."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Callable, Iterator

from llmkit.errors import BadInput
from llmkit.llama.batch import http_error_message


class LlamaServer:
    """llama-server's HTTP API: GET /slots, POST /slots/{id}?action=save|restore|erase, POST /completion."""

    def __init__(self, url: str, timeout: float = 600.0):
        if not url.startswith(("http://", "https://")):
            raise BadInput(f"server URL '{url}' must start with http:// or https://, e.g. http://127.0.0.1:8080.")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _open(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise BadInput(f"llama-server at {self.url} refused {method} {path}: {http_error_message(e)}.") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise BadInput(f"cannot reach llama-server at {self.url} ({reason}). Start it, or check --server.") from None

    def _json(self, method: str, path: str, body: dict | None = None):
        with self._open(method, path, body) as r:
            raw = r.read()
        try:
            return json.loads(raw)
        except ValueError:
            raise BadInput(f"{self.url}{path} did not answer with JSON; is this a llama-server?") from None

    def slots(self) -> list[dict]:
        return self._json("GET", "/slots")

    def slot_action(self, slot_id: int, action: str, filename: str | None = None) -> dict:
        if slot_id < 0:
            raise BadInput(f"--slot must be a slot number >= 0, got {slot_id}.")
        body = {"filename": filename} if filename is not None else {}
        return self._json("POST", f"/slots/{slot_id}?action={action}", body)

    def completion(self, prompt: str, n_predict: int, slot_id: int | None = None, temperature: float = 0.0,
                   seed: int | None = None, on_text: Callable[[str], None] | None = None) -> dict:
        """Stream a completion with cache_prompt on; returns the final message (timings, tokens_cached)."""
        body = {"prompt": prompt, "n_predict": n_predict, "cache_prompt": True, "temperature": temperature,
                "stream": True}
        if slot_id is not None:
            body["id_slot"] = slot_id
        if seed is not None:
            body["seed"] = seed
        text, last = [], {}
        with self._open("POST", "/completion", body) as r:
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

