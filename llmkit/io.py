"""File helpers shared by every library package: atomic writes, temporary and scratch files, and
text-corpus reading. The bounded readers for untrusted files are in llmkit.bounded."""

from __future__ import annotations

import errno
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


def _left_by_dead(directory, pattern: re.Pattern) -> list[os.DirEntry]:
    """Entries of `directory` whose name matches `pattern` with a process id (group 1) that is
    neither this process nor alive."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    return [e for e in entries if (m := pattern.fullmatch(e.name)) and int(m.group(1)) != os.getpid()
            and not _pid_alive(int(m.group(1)))]


def remove_stale_temps(path: str | os.PathLike) -> list[str]:
    """Remove the temp files of earlier writes to `path` whose process is gone (a `kill -9` leaves
    `.NAME.PID.XXXX.tmp`; no handler can run then). Temps of live processes are left alone."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    removed = []
    for e in _left_by_dead(directory, re.compile(r"\." + re.escape(path.name) + r"\.(\d+)\.[^/]+\.tmp")):
        try:
            os.unlink(e.path)
            removed.append(e.path)
        except OSError:
            pass
    return removed


@contextmanager
def scratch_dir(prefix: str):
    """A temporary folder `TMPDIR/PREFIX<pid>-XXXX`, removed when the block ends (on an exception and
    SIGTERM too). Folders of earlier runs with the same prefix whose process is gone are removed
    first: a `kill -9` runs no handler, and a killed quantization would leave gigabytes behind."""
    import shutil

    base = tempfile.gettempdir()
    for e in _left_by_dead(base, re.compile(re.escape(prefix) + r"(\d+)-[^/]+")):
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise _write_error(path, e) from None
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _write_error(path, e) from None
        raise


def _write_error(path: Path, e: OSError) -> Exception:
    """One line for a write that the disk refused (full, quota, read-only, no permission)."""
    if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM):
        return e
    return BadInput(f"cannot write '{path}': {e.strerror}. Nothing was changed (an earlier '{path.name}' "
                    "is intact); free some space or choose a writable directory.")


def disk_error(target: str | os.PathLike, e: BaseException, what: str = "", after: str = "") -> BadInput | None:
    """One line for a write into `target` (a file or directory) that the disk refused: an OSError of
    a full, over-quota, read-only or forbidden disk, or SQLite's words for the same; None for any
    other error. `what` names the thing written ('index DIR'), `after` says what is left as it was."""
    code = e.errno if isinstance(e, OSError) else None
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM):
        why = e.strerror or os.strerror(code)
    elif type(e).__module__ == "sqlite3":
        low = str(e).lower()
        if "disk is full" in low:
            why = os.strerror(errno.ENOSPC)
        elif "readonly" in low or "read-only" in low or "unable to open" in low:
            why = os.strerror(errno.EROFS if _read_only_fs(target) else errno.EACCES)
        else:
            return None
    else:
        return None
    return BadInput(f"cannot write {what or repr(str(target))}: {why}. {after or 'Nothing was changed'}; "
                    "free some space or choose a writable directory.")


def _read_only_fs(path: str | os.PathLike) -> bool:
    """Is `path` (or its nearest existing parent) on a filesystem mounted read-only?"""
    p = os.path.abspath(os.fspath(path))
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    try:
        return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` via a temp file in the same directory and an atomic rename."""
    with atomic_file(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 text atomically (see atomic_write_bytes)."""
    atomic_write_bytes(path, text.encode("utf-8"))


BINARY_SAMPLE = 8192  # bytes at a file's start that decide whether it is binary


def has_nul(data: bytes) -> bool:
    """NUL bytes among the first BINARY_SAMPLE bytes: binary data, not text in any 8-bit encoding.

    >>> has_nul(b"caf\\xe9"), has_nul(b"\\x89PNG\\x00")
    (False, True)
    """
    return b"\x00" in data[:BINARY_SAMPLE]


def looks_binary(head: bytes) -> bool:
    """True when a file's first bytes look like binary data (NUL bytes or undecodable UTF-8).

    >>> looks_binary(b"hello\\n"), looks_binary(b"\\x00\\x01GGUF")
    (False, True)
    """
    if has_nul(head):
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
    if looks_binary(data[:BINARY_SAMPLE]):
        raise BadInput(f"{name} looks like a binary file, not UTF-8 text. Pass text files only.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{name} is not valid UTF-8 (byte {e.start}). Convert it to UTF-8 first.") from None


READ_BLOCK = 4 << 20


def iter_lines(paths: Iterable[str]) -> Iterator[str]:
    """Yield the lines of every input, keeping line endings (the unit HF tokenizers trains on). Files
    are read a block at a time, so a corpus of any size costs a few blocks of memory, not itself;
    the checks are read_text's (binary files refused, invalid UTF-8 named with its byte offset)."""
    for path in paths:
        yield from _stream_lines(path)


def _stream_lines(path: str) -> Iterator[str]:
    name = "standard input" if path == "-" else f"'{path}'"
    try:
        f = sys.stdin.buffer if path == "-" else open(path, "rb")
    except OSError as e:
        raise BadInput(f"cannot read '{path}': {e.strerror}. Check the path and permissions.") from None
    pos, rest, first = 0, b"", True
    try:
        while True:
            try:
                block = f.read(READ_BLOCK)
            except OSError as e:
                raise BadInput(f"cannot read {name}: {e.strerror}. Check the path and permissions.") from None
            if first:
                first = False
                if looks_binary(block[:BINARY_SAMPLE]):
                    raise BadInput(f"{name} looks like a binary file, not UTF-8 text. Pass text files only.")
            data = rest + block if rest else block
            # whole lines only: a newline byte never sits inside a UTF-8 character, so each piece decodes alone
            cut = len(data) if not block else data.rfind(b"\n") + 1
            if cut:
                try:
                    text = data[:cut].decode("utf-8")
                except UnicodeDecodeError as e:
                    raise BadInput(f"{name} is not valid UTF-8 (byte {pos + e.start}). Convert it to UTF-8 first.") from None
                pos += cut
                yield from split_lines(text)
            rest = data[cut:]
            if not block:
                return
    finally:
        if f is not sys.stdin.buffer:
            f.close()


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
