"""Batch generation across a pool of llama-servers.

Items come from JSONL (`id`, then `prompt` — a raw completion, no chat template — or `messages` —
the chat endpoint; optional per-item `n_predict`/`max_tokens`, `temperature`, `seed`, `top_k`,
`top_p`, `min_p`, `repeat_penalty`, `stop`). Each server gets as many requests in flight as it has
slots (`GET /props` total_slots, else `GET /slots`); llama-server's continuous batching does the
rest. A request that fails because its server went away goes back to the queue for another server;
a server that went away is probed (GET /health) and takes requests again once it is back (restarted
on the same address); the batch gives up only when every server has been down for REJOIN_S. Results
are handed out in input order as soon as every earlier item is done, so an output file is
always a prefix-closed, resumable record.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from llmkit.errors import BadFileFormat, BadInput
from llmkit.bounded import LimitExceeded, json_limits, load_json_line
from llmkit.llama.server import RETRY_CODES, LlamaServer, RequestFailed, ServerDown

REJOIN_S = 60.0  # how long a batch waits for a server to come back when all of them are down
PROBE_S = 0.5  # between health probes of a server that went away

OPTION_KEYS = {"n_predict": "n_predict", "max_tokens": "n_predict", "n": "n_predict", "temperature": "temperature",
               "temp": "temperature", "seed": "seed", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
               "repeat_penalty": "repeat_penalty", "stop": "stop"}


@dataclass
class Item:
    """One request of the batch: its position in the input, id, prompt or messages, options."""
    index: int
    id: object
    line: int
    prompt: str | None = None
    messages: list | None = None
    options: dict = field(default_factory=dict)
    tries: int = 0


@dataclass
class BadLine:
    line: int
    reason: str


def parse_items(lines: Iterable[str]) -> tuple[list[Item], list[BadLine]]:
    """Items of a JSONL batch and the lines that are not valid items (with their line numbers)."""
    items, bad, seen, caps = [], [], set(), json_limits()
    for no, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = load_json_line(raw, f"line {no}", caps)
        except LimitExceeded as e:
            bad.append(BadLine(no, e.reason))
            continue
        except ValueError as e:
            bad.append(BadLine(no, f"not JSON ({e.msg})"))
            continue
        if not isinstance(obj, dict):
            bad.append(BadLine(no, "not a JSON object"))
            continue
        if "id" not in obj or not isinstance(obj["id"], (str, int)) or isinstance(obj["id"], bool):
            bad.append(BadLine(no, "no \"id\" (a string or an integer)"))
            continue
        key = json.dumps(obj["id"])
        if key in seen:
            bad.append(BadLine(no, f"id {key} appears twice"))
            continue
        prompt, messages = obj.get("prompt"), obj.get("messages")
        if (prompt is None) == (messages is None):
            bad.append(BadLine(no, "needs exactly one of \"prompt\" (text) or \"messages\" (a chat list)"))
            continue
        if prompt is not None and not isinstance(prompt, str):
            bad.append(BadLine(no, "\"prompt\" must be a string"))
            continue
        if messages is not None and not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages)):
            bad.append(BadLine(no, "\"messages\" must be a list of {\"role\", \"content\"} objects"))
            continue
        opts, problem = {}, None
        for k, name in OPTION_KEYS.items():
            if k in obj:
                v = obj[k]
                if name == "stop":
                    v = [v] if isinstance(v, str) else v
                    if not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
                        problem = "\"stop\" must be a string or a list of strings"
                elif isinstance(v, bool) or not isinstance(v, (int, float)):
                    problem = f"\"{k}\" must be a number"
                opts[name] = v
        if problem:
            bad.append(BadLine(no, problem))
            continue
        seen.add(key)
        items.append(Item(len(items), obj["id"], no, prompt, messages, opts))
    return items, bad


class Server(LlamaServer):
    """One llama-server of the pool: how many requests it takes at once, and whether it is alive.
    A 502/503/504 (loading, or a proxy in front of a dead one) counts as down, not as a refusal."""

    def __init__(self, url: str, timeout: float):
        super().__init__(url, timeout)
        self.alive = True
        self.slots = 1
        self._probe_lock = threading.Lock()
        self._next_probe = 0.0

    def came_back(self) -> bool:
        """For a server that went away: is it up again? (one probe per PROBE_S across its workers)"""
        with self._probe_lock:
            if self.alive:
                return True
            now = time.monotonic()
            if now < self._next_probe:
                return False
            self._next_probe = now + PROBE_S
            if not self.healthy():
                return False
            try:
                self.discover()
            except ServerDown:
                return False
            self.alive = True
            return True

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        try:
            return super().request(method, path, body, timeout)
        except RequestFailed as e:
            if e.code in RETRY_CODES:
                raise ServerDown(self.url, f"HTTP {e.code}") from None
            raise

    def discover(self) -> int:
        """Number of parallel slots (llama-server -np)."""
        try:
            n = self.total_slots()
        except RequestFailed:
            n = 1
        self.slots = max(1, int(n or 1))
        return self.slots

    def run(self, item: Item, defaults: dict) -> dict:
        """Send one item; the server's answer as an output record (without id)."""
        o = {**defaults, **item.options}
        common = {k: o[k] for k in ("temperature", "seed", "top_k", "top_p", "min_p", "repeat_penalty") if k in o}
        if o.get("stop"):
            common["stop"] = o["stop"]
        if item.prompt is not None:
            body = {"prompt": item.prompt, "n_predict": o["n_predict"], "cache_prompt": True, **common}
            r = self.request("POST", "/completion", body)
            text, stop = r.get("content", ""), r.get("stop_type") or ("eos" if r.get("stopped_eos") else "limit")
        else:
            body = {"messages": item.messages, "max_tokens": o["n_predict"], "cache_prompt": True, **common}
            r = self.request("POST", "/v1/chat/completions", body)
            try:
                choice = r["choices"][0]
                text, stop = choice["message"]["content"] or "", choice.get("finish_reason")
            except (KeyError, IndexError, TypeError):
                raise RequestFailed(f"{self.url} answered the chat request without a message") from None
        t = r.get("timings", {}) or {}
        return {"text": text, "server": self.url,
                "stats": {"prompt_tokens": t.get("prompt_n"), "cached_tokens": t.get("cache_n"),
                          "generated_tokens": t.get("predicted_n"), "prompt_ms": t.get("prompt_ms"),
                          "decode_ms": t.get("predicted_ms"), "tokens_per_s": t.get("predicted_per_second"),
                          "stop": stop}}


class NoServerAnswers(BadInput):
    def __init__(self, urls: list[str]):
        super().__init__(f"no llama-server answers at {', '.join(urls)}. Start one (llama-server -m MODEL --port 8080 -np 4).")
        self.urls = urls


class ItemFailed(BadInput):
    """A refused item stopped the batch (on_error='fail')."""

    def __init__(self, item: Item, error: str):
        self.what = f"item {json.dumps(item.id)} (line {item.line}): {error}."
        super().__init__(f"{self.what} Fix it, or pass on_error='skip'.")


class ServersLost(BadInput):
    """Every server went away before the batch was done."""

    def __init__(self, lost: list[str], missing: int):
        self.what = (f"every server failed ({', '.join(lost)}) and none came back within {REJOIN_S:.0f} s; "
                     f"{missing} items were not generated.")
        super().__init__(f"{self.what} Restart a server and run again.")


class NotAnOutputFile(BadInput):
    def __init__(self, path: str, line: int):
        super().__init__(f"'{path}' line {line} is not an output record of llmkit server batch; write to another "
                         "file with -o.")
        self.path, self.line = path, line


@dataclass
class BatchReport:
    done: int = 0
    failed: list = field(default_factory=list)  # (id, line, reason)
    retried: int = 0
    servers_lost: list = field(default_factory=list)
    servers_back: list = field(default_factory=list)  # lost servers that answered again and took requests
    generated_tokens: int = 0
    wall_s: float = 0.0
    slots: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"done": self.done, "failed": [{"id": i, "line": ln, "error": r} for i, ln, r in self.failed],
                "retried": self.retried, "servers_lost": self.servers_lost, "servers_back": self.servers_back,
                "generated_tokens": self.generated_tokens,
                "wall_s": round(self.wall_s, 3),
                "tokens_per_s": round(self.generated_tokens / self.wall_s, 2) if self.wall_s else None,
                "slots": self.slots}


class _Pool:
    """Worker threads, one per server slot, taking items from one queue; results go to another."""

    def __init__(self, servers: list[Server], defaults: dict, max_tries: int, report: BatchReport):
        self.servers, self.defaults, self.max_tries, self.report = servers, defaults, max_tries, report
        self.todo: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()  # (item, record | None, error | None)
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def start(self, items: list[Item]) -> None:
        for it in items:
            self.todo.put(it)
        for s in self.servers:  # a server down at the start gets one thread, to rejoin
            for _ in range(s.slots if s.alive else 1):
                threading.Thread(target=self.worker, args=(s,), daemon=True).start()

    def worker(self, server: Server) -> None:
        while not self.stop.is_set():
            if not server.alive and not self._back(server):
                self.stop.wait(0.1)
                continue
            try:
                it = self.todo.get(timeout=0.1)
            except queue.Empty:
                continue
            done = self._run(server, it)
            if done is not None:  # None: requeued for another try
                self.results.put(done)

    def _back(self, server: Server) -> bool:
        """A lost server that answers again takes requests (and is reported once)."""
        if not server.came_back():
            return False
        with self.lock:
            if server.url not in self.report.servers_back:
                self.report.servers_back.append(server.url)
        return True

    def _run(self, server: Server, it: Item):
        """(item, record, None) on success, (item, None, why) when it failed; a dropped item is requeued."""
        try:
            return it, server.run(it, self.defaults), None
        except ServerDown as e:
            with self.lock:
                server.alive = False
                if server.url not in self.report.servers_lost:
                    self.report.servers_lost.append(server.url)
            it.tries += 1
            if it.tries >= self.max_tries:
                return it, None, f"its server dropped it {it.tries} times (last {server.url}: {e.reason})"
            self.report.retried += 1
            self.todo.put(it)  # another server takes it, or this one once it is back
            return None
        except RequestFailed as e:
            return it, None, f"{server.url} refused it: {e.detail}"
        except Exception as e:  # noqa: BLE001 -- an item must never vanish with its thread
            return it, None, f"{server.url}: {type(e).__name__}: {e}"


def _discover(urls: list[str], timeout: float, report: BatchReport) -> list[Server]:
    """The servers with their slot counts; those that do not answer start as lost."""
    servers = [Server(u, timeout) for u in urls]
    for s in servers:
        try:
            report.slots[s.url] = s.discover()
        except ServerDown:
            s.alive = False
            report.servers_lost.append(s.url)
            report.slots[s.url] = 0
    if not any(s.alive for s in servers):
        raise NoServerAnswers(urls)
    return servers


def run_batch(items: list[Item], urls: list[str], defaults: dict, emit: Callable[[dict], None],
              on_error: str = "fail", max_tries: int = 3, timeout: float = 600.0,
              progress: Callable[[int, int], None] | None = None) -> BatchReport:
    """Run every item on the servers; `emit` gets each finished record in input order (from the
    calling thread). A refused item stops the batch (on_error='fail') or is reported and left out
    ('skip'); an item is retried on another server when its server drops, up to `max_tries`."""
    t0 = time.perf_counter()
    report = BatchReport()
    pool = _Pool(_discover(urls, timeout, report), defaults, max_tries, report)
    pool.start(items)
    waiting: dict[int, tuple] = {}  # finished out of order, by input index
    next_out = finished = 0
    fatal = None
    all_down_since = None
    try:
        while finished < len(items):
            try:
                got = pool.results.get(timeout=0.2)
            except queue.Empty:
                if any(s.alive for s in pool.servers):
                    all_down_since = None
                elif all_down_since is None:
                    all_down_since = time.monotonic()
                elif time.monotonic() - all_down_since > REJOIN_S:
                    fatal = ServersLost(report.servers_lost, len(items) - finished)
                    break
                continue
            finished += 1
            waiting[got[0].index] = got
            if got[2] and on_error == "fail":
                fatal = ItemFailed(got[0], got[2])
                break
            next_out = _emit_in_order(waiting, next_out, report, emit)
            if progress:
                progress(finished, len(items))
    finally:
        pool.stop.set()
    report.wall_s = time.perf_counter() - t0
    if fatal:
        raise fatal
    return report


def _emit_in_order(waiting: dict[int, tuple], next_out: int, report: BatchReport, emit) -> int:
    """Emit the finished items that continue the input order; the next index to wait for."""
    while next_out in waiting:
        it, rec, err = waiting.pop(next_out)
        next_out += 1
        if err:
            report.failed.append((it.id, it.line, err))
            continue
        report.done += 1
        report.generated_tokens += rec["stats"].get("generated_tokens") or 0
        emit({"id": it.id, **rec})
    return next_out


def open_resumable(path: str) -> tuple[int, set]:
    """Open an output JSONL for appending: the ids already in it (a rerun skips them) and a file
    descriptor. A last line cut short by a killed run is dropped first, so every line is whole."""
    import os

    done: set = set()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        data = b""
        size = os.fstat(fd).st_size
        if size:
            data = os.pread(fd, size, 0)
        end = data.rfind(b"\n") + 1
        if end < len(data):
            os.ftruncate(fd, end)
        for no, raw in enumerate(data[:end].splitlines(), 1):
            if not raw.strip():
                continue
            try:
                done.add(json.dumps(load_json_line(raw, f"line {no} of '{path}'")["id"]))
            except (ValueError, KeyError, TypeError, BadFileFormat):
                raise NotAnOutputFile(path, no) from None
        os.lseek(fd, 0, os.SEEK_END)
    except BaseException:
        os.close(fd)
        raise
    return fd, done


def resume(items: list[Item], path: str) -> tuple[int, list[Item], int]:
    """Open `path` to append results to (open_resumable): a descriptor, the items whose ids it does not
    hold yet (renumbered in input order) and how many it already holds."""
    fd, done = open_resumable(path)
    left = [it for it in items if json.dumps(it.id) not in done]
    for i, it in enumerate(left):
        it.index = i
    return fd, left, len(items) - len(left)


def append_record(fd: int, record: dict) -> None:
    """One whole line per write(2) on an append-only descriptor, synced: a crash loses at most the
    line being written, never half of an earlier one."""
    import os

    os.write(fd, (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))
    os.fsync(fd)
