"""File helpers shared by every library package: atomic writes and text-corpus reading."""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from llmkit.errors import BadInput

TEXT_SUFFIXES = {".txt", ".md", ".rst", ".text", ".csv", ".tsv", ".json", ".jsonl", ".html", ".htm", ".xml", ""}


def _umask() -> int:
    """The process umask, read without changing it (Linux: /proc; elsewhere set and restore)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode(path: str | os.PathLike) -> int:
    """The mode a written file should get: the replaced file's mode, else what a plain open() gives
    (0666 minus the umask). mkstemp's 0600 would make a quantized model or an index manifest
    unreadable to other users (a llama-server running as another user)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(path: str | os.PathLike) -> list[str]:
    """Remove the temp files of earlier writes to `path` whose process is gone (a `kill -9` leaves
    `.NAME.PID.XXXX.tmp`; no handler can run then). Temps of live processes are left alone."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    pat = re.compile(r"\." + re.escape(path.name) + r"\.(\d+)\.[^/]+\.tmp")
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for e in entries:
        m = pat.fullmatch(e.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            try:
                os.unlink(e.path)
                removed.append(e.path)
            except OSError:
                pass
    return removed


@contextmanager
def atomic_file(path: str | os.PathLike):
    """Yield a binary file to write; it replaces `path` atomically only if the block completes
    (temp file `.NAME.PID.XXXX.tmp` in the same directory, fsync, rename); on any error, SIGTERM
    included (the CLI turns it into an exception), the temp file is removed. The file gets the mode
    of the file it replaces, or 0666 minus the umask."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise BadInput(f"cannot write '{path}': directory '{directory}' does not exist. Create it first.")
    remove_stale_temps(path)
    mode = new_file_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
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


def cache_dir(*parts: str) -> Path:
    """llmkit's cache directory (LLMKIT_CACHE, else $XDG_CACHE_HOME/llmkit or ~/.cache/llmkit), joined
    with `parts`; not created here."""
    root = os.environ.get("LLMKIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "llmkit")
    return Path(root, *parts)
