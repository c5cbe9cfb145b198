"""Bounded readers for untrusted files: JSON with a depth limit, JSONL lines with a length limit, files
read no further than their size limit, zip archives counted as they unpack. Every limit has a default
that normal files never reach and an environment variable that raises it; the error names both."""

from __future__ import annotations

import re
import sys

from llmkit import config
from llmkit.errors import BadFileFormat, BadInput


class LimitExceeded(BadFileFormat):
    """An input passed one of the LIMITS; the message names the limit's variable."""

    def __init__(self, what: str, name: str, found: str = ""):
        n, desc = limit(name), config.VARIABLES[name].meaning
        super().__init__(f"{what} passes the limit of {n} {desc}{f' ({found})' if found else ''}. "
                         f"If the file is trusted, raise the limit with {name}=N.")
        self.name = name
        self.reason = f"over the limit of {n} {desc} (raise it with {name})"  # a skipped file's reason


def limit(name: str) -> int:
    """The value of a limit (llmkit.config.LIMITS): its environment variable (e.g. `512M`) or its default."""
    return config.size(name)


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)  # an unclosed one runs to the end: linear
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_EMPTY_PAIR = re.compile(r"\[\]|\{\}")


def json_depth(text: str) -> int:
    """The deepest nesting of [] and {} outside strings, in linear time without recursion.

    >>> json_depth('{"a": [1, [2, "[[["]]}'), json_depth("3")
    (3, 0)
    """
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    # every deepest point is an adjacent pair: removing all of them lowers the depth by exactly one,
    # and a few passes leave few runs to count (a list of 500k merges becomes one pair)
    passes = 0
    while passes < 8:
        shorter = _EMPTY_PAIR.sub("", brackets)
        if len(shorter) == len(brackets):
            break
        brackets, passes = shorter, passes + 1
    depth = deepest = 0
    for run in re.finditer(r"[\[{]+|[\]}]+", brackets):  # runs, not characters: fast on [[[[...
        if run.group()[0] in "[{":
            depth += len(run.group())
            deepest = max(deepest, depth)
        else:
            depth -= len(run.group())
    return deepest + passes


def json_limits() -> tuple[int, int, int]:
    """(file bytes, line bytes, depth) limits, read once for a loop over many JSONL lines."""
    return limit("LLMKIT_MAX_JSON_BYTES"), limit("LLMKIT_MAX_LINE_BYTES"), limit("LLMKIT_MAX_JSON_DEPTH")


def load_json(text: str | bytes, what: str, caps: tuple[int, int, int] | None = None):
    """json.loads with the depth and size limits; syntax errors stay json.JSONDecodeError (the caller
    words them), a limit passed raises LimitExceeded, bytes that are not UTF-8 raise BadFileFormat."""
    import json

    max_bytes, _, cap = caps or json_limits()
    if len(text) > max_bytes:
        raise LimitExceeded(what, "LLMKIT_MAX_JSON_BYTES", f"{len(text)} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadFileFormat(f"{what} is not UTF-8 text (byte {e.start}). JSON files are UTF-8.") from None
    if text.count("[") + text.count("{") > cap:  # else it cannot be deeper: skip the scan
        depth = json_depth(text)
        if depth > cap:
            raise LimitExceeded(what, "LLMKIT_MAX_JSON_DEPTH", f"it nests {depth} levels deep")
    try:
        return json.loads(text)
    except RecursionError:  # a limit raised past what Python's parser can nest
        raise LimitExceeded(what, "LLMKIT_MAX_JSON_DEPTH", "deeper than Python's JSON parser can read") from None


def load_json_line(line: str | bytes, what: str, caps: tuple[int, int, int] | None = None):
    """One JSONL record: the line-length limit, then load_json (`caps` from json_limits())."""
    caps = caps or json_limits()
    n = len(line) if isinstance(line, bytes) or line.isascii() else len(line.encode("utf-8", "surrogatepass"))
    if n > caps[1]:
        raise LimitExceeded(what, "LLMKIT_MAX_LINE_BYTES", f"{n} bytes")
    return load_json(line, what, caps)


def too_large(size: int, cap: int, name: str) -> str:
    """The reason a file over the size limit `name` (whose value is `cap`) is skipped.

    >>> too_large(3 << 20, 1 << 20, "LLMKIT_MAX_FILE_BYTES")
    'too large (3 MB; the cap is 1 MB, raise it with LLMKIT_MAX_FILE_BYTES)'
    """
    return f"too large ({size >> 20} MB; the cap is {cap >> 20} MB, raise it with {name})"


def read_bounded(path: str, name: str, what: str | None = None) -> bytes:
    """A file's bytes ('-' = stdin), refusing more than the limit `name` allows without reading them
    all (a named pipe or /dev/zero included)."""
    cap = limit(name)
    what = what or ("standard input" if path == "-" else f"'{path}'")
    try:
        if path == "-":
            data = sys.stdin.buffer.read(cap + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(cap + 1)
    except OSError as e:
        raise BadInput(f"cannot read {what}: {e.strerror}. Check the path and permissions.") from None
    if len(data) > cap:
        raise LimitExceeded(what, name, "or more")
    return data


class CountingStream:
    """A read-only stream over another that raises LimitExceeded once more than `budget[0]` bytes
    came through it; several streams can share one budget (all the members of an archive)."""

    def __init__(self, raw, budget: list[int], what: str, name: str = "LLMKIT_MAX_UNZIPPED_BYTES"):
        self.raw, self.budget, self.what, self.name = raw, budget, what, name

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while n < 0 or len(out) < n:  # in 1 MiB steps: an unbounded read() cannot overshoot much
            want = 1 << 20 if n < 0 else min(1 << 20, n - len(out))
            chunk = self.raw.read(want)
            if not chunk:
                break
            self.budget[0] -= len(chunk)
            if self.budget[0] < 0:
                raise LimitExceeded(self.what, self.name)
            out += chunk
        return bytes(out)

    def close(self) -> None:
        self.raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_archive(data: bytes, what: str) -> None:
    """Refuse a zip bomb before a library unpacks the archive: count its entries, then inflate every
    member through a CountingStream (1 MiB at a time, nothing kept; declared sizes are not trusted).
    A damaged archive raises zipfile.BadZipFile (or another error of the zip reader)."""
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        infos = z.infolist()
        if len(infos) > limit("LLMKIT_MAX_ZIP_ENTRIES"):
            raise LimitExceeded(what, "LLMKIT_MAX_ZIP_ENTRIES", f"{len(infos)} entries")
        budget = [limit("LLMKIT_MAX_UNZIPPED_BYTES")]
        for info in infos:
            with CountingStream(z.open(info), budget, what) as f:
                while f.read(1 << 20):
                    pass
