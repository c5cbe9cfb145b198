"""OpenAI-compatible HTTP endpoints (llama-server, vLLM, TEI, Ollama...) that `rag` embeds and
answers through: what an endpoint spec names, and one JSON request with retries, a timeout and
one-line errors that name the URL and what came back.

A spec is `http(s)://HOST[:PORT][/PATH][#MODEL]`: the server's base URL (a trailing `/v1` names the
same server) and, after `#`, the model sent with each request (default: the only model the server's
`/v1/models` lists). The key comes from LLMKIT_API_KEY, else OPENAI_API_KEY, and is sent only as a
header: it is never part of a spec (a URL with credentials or a query string is refused), so never
stored in an index or written in an error, and a redirect is refused rather than followed, since
following it would send the header to wherever the server points.

>>> parse_spec("http://gpu:8080/v1/#bge-small")
Endpoint(base='http://gpu:8080', model='bge-small')
>>> is_endpoint("https://gpu:8080"), is_endpoint("model.gguf"), is_endpoint(None)
(True, False, False)
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, replace

from llmkit.errors import BadInput

RETRY_CODES = (429, 500, 502, 503, 504)  # busy or restarting: worth asking again
NO_API = (404, 405)  # the server has no such route
NO_TOKENIZE = (400, 404, 405, 422)  # vLLM and TEI have a /tokenize of another schema, refused as 400 or 422
ERROR_BODY_BYTES = 64 << 10  # of an error answer: enough for its message
TRIES = 4
BACKOFF = 0.5  # seconds before the first retry, doubled after each
MAX_RETRY_AFTER = 30.0  # a server's Retry-After is followed up to this many seconds


@dataclass(frozen=True)
class Endpoint:
    base: str  # scheme://host[:port][/path], no trailing slash or /v1
    model: str = ""

    @property
    def spec(self) -> str:
        """The spec as an index records it (`base#model`)."""
        return self.base + (f"#{self.model}" if self.model else "")


def is_endpoint(name: str | None) -> bool:
    """Does this model name point at an HTTP endpoint rather than a local model?"""
    return bool(name) and str(name).lower().startswith(("http://", "https://"))


def parse_spec(spec: str) -> Endpoint:
    """The endpoint a spec names (module doc); credentials, a query string or a second '#' in the
    URL are refused (and not quoted: they may hold a key)."""
    url, _, model = spec.partition("#")
    parts = urllib.parse.urlsplit(url)
    if parts.username or parts.password or "?" in url or "#" in model:
        what = "credentials" if parts.username or parts.password else "a query string" if "?" in url else \
            "a second '#'"
        raise BadInput(f"an endpoint URL must not hold {what}; put the key in LLMKIT_API_KEY (or OPENAI_API_KEY) "
                       "and write http://HOST:PORT[/v1][#MODEL].")
    if not parts.hostname:
        raise BadInput(f"'{url}' is not an endpoint URL; write http://HOST:PORT[#MODEL].")
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return Endpoint(base, model.strip())


def resolve(spec: str, timeout: float | None = None) -> Endpoint:
    """The endpoint with its model named: the spec's, else the only one the server lists. The server
    is asked either way, so one that is down is reported here, before any work starts."""
    ep = parse_spec(spec)
    listed = request(ep.base + "/v1/models", timeout=timeout, absent=NO_API if ep.model else ())
    if ep.model:
        return ep
    ids = [m.get("id") for m in (listed or {}).get("data", []) if isinstance(m, dict) and m.get("id")]
    if len(ids) != 1:
        which = f"it lists {', '.join(map(str, ids))}" if ids else "it lists none"
        raise BadInput(f"{ep.base}/v1/models does not say which model to use ({which}). Name it after '#': "
                       f"{ep.base}#MODEL.")
    return replace(ep, model=str(ids[0]))


def timeout_seconds() -> float:
    from llmkit import config

    return float(config.size("LLMKIT_ENDPOINT_SECONDS"))


def _headers() -> dict:
    from llmkit import config

    h = {"Content-Type": "application/json", "Accept": "application/json"}
    key = config.text("LLMKIT_API_KEY") or os.environ.get("OPENAI_API_KEY", "").strip()
    if key:
        h["Authorization"] = f"Bearer {key}"
    return h


def _snippet(raw: bytes) -> str:
    """What came back, in a few words on one line."""
    text = " ".join(raw.decode("utf-8", "replace").split())
    return repr(text[:120] + ("..." if len(text) > 120 else "")) if text else "an empty body"


def _detail(raw: bytes) -> str:
    """An error body's message (OpenAI's {"error": {"message": ...}}), else its first words."""
    try:
        d = json.loads(raw)
        err = d.get("error", d) if isinstance(d, dict) else d
        msg = err.get("message") if isinstance(err, dict) else err
        if isinstance(msg, str) and msg.strip():
            return " ".join(msg.split())[:200]
    except ValueError:
        pass
    return _snippet(raw)


def _fix(code: int) -> str:
    if code in (401, 403):
        return "Set LLMKIT_API_KEY (or OPENAI_API_KEY) to the server's key."
    if code == 404:
        return "Check the URL (the server's base, e.g. http://HOST:8080) and that the server offers this API."
    return "Check the model name and the server's log."


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Leaves a redirect as the HTTPError it is: urllib would copy the Authorization header to the new host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _redirected(url: str, e: urllib.error.HTTPError) -> BadInput:
    """The error for a redirect, naming where it points (without its query, which may hold a token)."""
    to = urllib.parse.urlsplit(urllib.parse.urljoin(url, e.headers.get("Location") or ""))
    where = urllib.parse.urlunsplit((to.scheme, to.netloc.rpartition("@")[2], to.path, "", ""))
    return BadInput(f"{url} answered HTTP {e.code}, a redirect to {where}, which is not followed (it would send the "
                    "key there too). Give the server's final URL.")


def _retry_after(e: urllib.error.HTTPError, wait: float) -> float:
    try:
        return min(max(float(e.headers.get("Retry-After", "")), 0.0), MAX_RETRY_AFTER)
    except (TypeError, ValueError):
        return wait


def open_url(url: str, body: dict | None = None, timeout: float | None = None, absent: tuple[int, ...] = ()):
    """The HTTP response to a POST of `body` (a GET without one), after up to TRIES tries with
    exponential backoff on 429 and 5xx; None for a status in `absent` (the server has no such API).
    Redirects are refused. Errors are one line: the URL and what came back."""
    t = timeout if timeout is not None else timeout_seconds()
    data = None if body is None else json.dumps(body).encode()
    wait = BACKOFF
    for attempt in range(1, TRIES + 1):
        req = urllib.request.Request(url, data=data, headers=_headers(), method="GET" if data is None else "POST")
        try:
            return _OPENER.open(req, timeout=t)
        except urllib.error.HTTPError as e:
            with e:  # its connection is let go before a retry
                try:
                    raw = e.read(ERROR_BODY_BYTES)
                except OSError:
                    raw = b""
            if e.code in absent:
                return None
            if 300 <= e.code < 400:
                raise _redirected(url, e) from None
            if e.code in RETRY_CODES and attempt < TRIES:
                time.sleep(_retry_after(e, wait))
                wait *= 2
                continue
            tries = f" after {attempt} tries" if attempt > 1 else ""
            raise BadInput(f"{url} answered HTTP {e.code}{tries}: {_detail(raw)}. {_fix(e.code)}") from None
        except (TimeoutError, socket.timeout):
            raise BadInput(f"{url} did not answer within {t:g} s. Check the server, or raise "
                           "LLMKIT_ENDPOINT_SECONDS.") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise BadInput(f"{url} did not answer within {t:g} s. Check the server, or raise "
                               "LLMKIT_ENDPOINT_SECONDS.") from None
            why = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
            raise BadInput(f"cannot reach {url} ({why}). Check that the server is running and the URL is "
                           "right.") from None
    raise AssertionError("unreachable")  # the loop returns or raises


def request(url: str, body: dict | None = None, timeout: float | None = None, absent: tuple[int, ...] = ()):
    """The JSON answer to a POST of `body` (a GET without one), as `open_url` asks; None as it says.
    The answer is held to LLMKIT_MAX_JSON_BYTES and LLMKIT_MAX_JSON_DEPTH, as a JSON file is."""
    from llmkit.bounded import CountingStream, LimitExceeded, json_limits, load_json

    t = timeout if timeout is not None else timeout_seconds()
    resp = open_url(url, body, t, absent)
    if resp is None:
        return None
    caps = json_limits()
    try:
        with resp:
            raw = CountingStream(resp, [caps[0]], url, "LLMKIT_MAX_JSON_BYTES").read()  # in steps, not all at once
    except LimitExceeded:
        raise BadInput(f"{url} answered more than {caps[0]} bytes (LLMKIT_MAX_JSON_BYTES). Check that the URL is "
                       "an OpenAI-compatible server, or raise LLMKIT_MAX_JSON_BYTES.") from None
    except (TimeoutError, socket.timeout):
        raise BadInput(f"{url} did not answer within {t:g} s. Check the server, or raise "
                       "LLMKIT_ENDPOINT_SECONDS.") from None
    except OSError as e:
        raise BadInput(f"{url} dropped the connection ({e}). Check the server's log.") from None
    try:
        return load_json(raw, f"the answer of {url}", caps)
    except ValueError:
        raise BadInput(f"{url} answered with something that is not JSON: {_snippet(raw)}. Check that the URL is "
                       "an OpenAI-compatible server.") from None


def events(url: str, body: dict, timeout: float | None = None):
    """The JSON events of a streamed answer (server-sent `data:` lines, up to `[DONE]`), each line
    held to LLMKIT_MAX_LINE_BYTES."""
    from llmkit.bounded import limit

    t = timeout if timeout is not None else timeout_seconds()
    cap = limit("LLMKIT_MAX_LINE_BYTES")
    resp = open_url(url, body, t)
    try:
        with resp:
            while raw := resp.readline(cap + 1):
                if len(raw) > cap:
                    raise BadInput(f"{url} streamed a line of more than {cap} bytes (LLMKIT_MAX_LINE_BYTES). Check "
                                   "that the URL is an OpenAI-compatible server, or raise LLMKIT_MAX_LINE_BYTES.")
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                try:
                    yield json.loads(payload)
                except ValueError:
                    raise BadInput(f"{url} streamed something that is not JSON: {_snippet(payload.encode())}. "
                                   "Check that the URL is an OpenAI-compatible server.") from None
    except (TimeoutError, socket.timeout):
        raise BadInput(f"{url} stopped answering for {t:g} s. Check the server, or raise "
                       "LLMKIT_ENDPOINT_SECONDS.") from None
    except OSError as e:
        raise BadInput(f"{url} dropped the connection ({e}). Check the server's log.") from None
