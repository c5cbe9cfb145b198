"""Encoding whole inputs: lines read in chunks, encoded on N threads, results in input order.

Chunks of about CHUNK_BYTES end at a newline, so memory stays bounded whatever the input size; a
single line longer than the line limit (LLMKIT_MAX_LINE_BYTES) is refused. The compiled kernels
release the GIL, so threads share the tokenizer's tables and need no second process.
"""

from __future__ import annotations

import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate
from typing import BinaryIO

from llmkit.errors import BadInput

CHUNK_BYTES = 1 << 20


def line_limit() -> int:
    from llmkit import config

    return config.size("LLMKIT_MAX_LINE_BYTES")


def read_chunks(f: BinaryIO, what: str = "standard input", chunk: int | None = None) -> Iterator[bytes]:
    """Blocks of whole lines ('\\n'-terminated, except perhaps the last block's last line)."""
    limit = line_limit()
    chunk = chunk or CHUNK_BYTES
    rest = b""
    while True:
        block = f.read(chunk)
        data = rest + block if rest else block
        cut = data.rfind(b"\n") if block else len(data) - 1
        rest = data[cut + 1:]
        if len(rest) > limit:
            raise BadInput(f"{what} has a line longer than {limit} bytes (LLMKIT_MAX_LINE_BYTES). "
                           "Split it into lines, or raise the limit.")
        if cut >= 0:
            yield data[:cut + 1]
        if not block:
            return


def split_chunk(data: bytes) -> list[bytes]:
    """Lines of a block as `tokenize encode` reads them: split at '\\n', a trailing '\\r' dropped."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if b"\r" in data:
        lines = [x[:-1] if x.endswith(b"\r") else x for x in lines]
    return lines


def decode_lines(lines: list[bytes], what: str, offset: int) -> list[str]:
    """UTF-8 lines as text; invalid UTF-8 is refused naming its byte offset in the input."""
    try:
        return [x.decode("utf-8") for x in lines]
    except UnicodeDecodeError:
        pos = offset
        for x in lines:
            try:
                x.decode("utf-8")
            except UnicodeDecodeError as e:
                raise BadInput(f"{what} is not valid UTF-8 (byte {pos + e.start}). Convert it to UTF-8 first.") from None
            pos += len(x) + 1
        raise


def native_for(tok, work_bytes: int):
    """The compiled encoder when it gives this tokenizer's ids on its own (no added tokens, no template)."""
    native = getattr(tok.model, "native", None)
    if native is None or tok.added_pattern is not None or any(tok.template):
        return None
    return native(work_bytes)


def ids_text(ids_per_line: list[list[int]]) -> bytes:
    return "".join(" ".join(map(str, ids)) + "\n" for ids in ids_per_line).encode()


def _encode_block(tok, nb, data: bytes, offset: int, what: str) -> bytes:
    lines = split_chunk(data)
    if nb is not None:
        offsets = array.array("q", [0])
        offsets.extend(accumulate(map(len, lines)))
        ids, lend = nb.encode_joined(b"".join(lines), offsets)
        return nb.format(ids, lend)
    return ids_text(tok.encode_batch(decode_lines(lines, what, offset)))


def in_order(jobs: Iterable[Callable[[], object]], threads: int) -> Iterator[object]:
    """Run jobs on `threads` threads, yielding their results in the jobs' order (a few in flight)."""
    if threads <= 1:
        for job in jobs:
            yield job()
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending: deque = deque()
        for job in jobs:
            pending.append(pool.submit(job))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def encode_ids(tok, chunks: Iterable[bytes], threads: int = 1, size_hint: int = 0,
               what: str = "standard input") -> Iterator[bytes]:
    """Each input line's ids as a text line ("1 2 3"), in input order, block by block."""
    nb = native_for(tok, size_hint)

    def jobs():
        offset = 0
        for data in chunks:
            yield lambda data=data, offset=offset: _encode_block(tok, nb, data, offset, what)
            offset += len(data)

    yield from in_order(jobs(), threads)


def count_tokens(tok, lines: list[str]) -> tuple[int, list[list[int]] | None]:
    """(tokens, the ids when they are needed to count unknown tokens) for a batch of lines."""
    nb = native_for(tok, sum(map(len, lines)))
    if nb is not None:
        parts = [x.encode("utf-8", "surrogatepass") for x in lines]
        offsets = array.array("q", [0])
        offsets.extend(accumulate(map(len, parts)))
        ids, _ = nb.encode_joined(b"".join(parts), offsets)
        return len(ids), None
    batch = tok.encode_batch(lines)
    return sum(map(len, batch)), batch
