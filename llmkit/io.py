"""File helpers shared by every library package: atomic writes, text-corpus reading, and bounded
readers for untrusted files (JSON with a depth limit, JSONL lines with a length limit, zip archives
counted as they unpack). Every limit has a default that normal files never reach and an environment
variable that raises it; the error names both."""

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
