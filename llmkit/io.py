"""File helpers shared by every library package: atomic writes and text-corpus reading."""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from llmkit.errors import BadInput

TEXT_SUFFIXES = {".txt", ".md", ".rst", ".text", ".csv", ".tsv", ".json", ".jsonl", ".html", ".htm", ".xml", ""}


@contextmanager
def atomic_file(path: str | os.PathLike):
    """Yield a binary file to write; it replaces `path` atomically only if the block completes
    (temp file in the same directory, fsync, rename); on any error the temp file is removed."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise BadInput(f"cannot write '{path}': directory '{directory}' does not exist. Create it first.")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` via a temp file in the same directory and an atomic rename."""
    with atomic_file(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 text atomically (see atomic_write_bytes)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def looks_binary(head: bytes) -> bool:
    """True when a file's first bytes look like binary data (NUL bytes or undecodable UTF-8).

    >>> looks_binary(b"hello\\n"), looks_binary(b"\\x00\\x01GGUF")
    (False, True)
    """
    if b"\x00" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        # a multi-byte character cut at the end of the sample is fine
        return e.start < len(head) - 4
    return False


def expand_inputs(inputs: Iterable[str]) -> list[str]:
    """Expand directories (recursively, text-like files only); keep '-' and plain files as given."""
    out: list[str] = []
    for item in inputs:
        if item == "-":
            out.append(item)
            continue
        p = Path(item)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
            out.extend(str(f) for f in files if f.suffix.lower() in TEXT_SUFFIXES)
        elif p.exists():
            out.append(item)
        else:
            raise BadInput(f"input '{item}' does not exist. Check the path.")
    return out


def read_text(path: str) -> str:
    """Read one UTF-8 text file ('-' = stdin), refusing binary files with a clear error."""
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise BadInput(f"cannot read '{path}': {e.strerror}. Check the path and permissions.") from None
    name = "standard input" if path == "-" else f"'{path}'"
    if looks_binary(data[:8192]):
        raise BadInput(f"{name} looks like a binary file, not UTF-8 text. Pass text files only.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{name} is not valid UTF-8 (byte {e.start}). Convert it to UTF-8 first.") from None


def iter_lines(paths: Iterable[str]) -> Iterator[str]:
    """Yield the lines of every input, keeping line endings (the unit HF tokenizers trains on)."""
    for path in paths:
        yield from split_lines(read_text(path))


def split_lines(text: str) -> list[str]:
    """Split on '\n' only, keeping the endings (str.splitlines also splits on \x1c, \u2028, ...).

    >>> split_lines("a\nb\r\n\nc")
    ['a\n', 'b\r\n', '\n', 'c']
    """
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines
