"""Token counts of files, directory trees, globs and standard input under one or more tokenizers.

Each file's whole text is one input to the tokenizer, and the tokens a tokenizer adds around a text
(BOS, [CLS] ... [SEP]) are not counted: a count is `len(encode(text, add_special_tokens=False))` of HF
`tokenizers` with the same tokenizer.json. Files go to the tokenizers in batches of about a megabyte,
one batch per call into the compiled encoder (which releases the GIL, so batches run on threads).
A file that cannot be counted (binary, not UTF-8, unreadable, a link loop, too large, changed or gone
while read) is kept in the report as skipped with its reason, and the rest is counted.
"""

from __future__ import annotations

import array
import os
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import accumulate

from llmkit.errors import BadInput
from llmkit.bounded import too_large
from llmkit.io import has_nul

BATCH_BYTES = 1 << 20
BATCH_FILES = 512
LIMIT = "LLMKIT_MAX_LINE_BYTES"  # a file is encoded as one text, like a line of `encode`


def size_limit() -> int:
    """Bytes one file may have (LIMIT)."""
    from llmkit import config

    return config.size(LIMIT)


# -- counting texts -------------------------------------------------------------------------------------
def count_texts(tok, texts: list[str], raw: list[bytes] | None = None, work_bytes: int = 0) -> list[int]:
    """Tokens of each text, special tokens not added; `raw` (the texts' UTF-8 bytes, when at hand)
    spares encoding them again.

    Byte-level BPE runs all the texts through one call of the compiled encoder and reads only where
    each text's ids end; the text between added tokens (matched verbatim, as HF does) is what it sees.
    Other models go through `encode_batch`.
    """
    if not texts:
        return []
    model = tok.model
    # the class's own method: a normalizing wrapper would forward `native` to the model it wraps
    nb = model.native(work_bytes or sum(map(len, texts))) if hasattr(type(model), "native") else None
    if nb is None:
        return [len(ids) for ids in tok.encode_batch(texts, add_special_tokens=False)]
    if tok.added_pattern is None:
        parts = raw if raw is not None else [t.encode("utf-8", "surrogatepass") for t in texts]
        owner = None
        counts = [0] * len(texts)
    else:
        parts, owner, counts = [], [], [0] * len(texts)
        for i, text in enumerate(texts):
            for k, piece in enumerate(tok.added_pattern.split(text)):
                if k % 2:
                    counts[i] += 1  # an added token: one id
                elif piece:
                    parts.append(piece.encode("utf-8", "surrogatepass"))
                    owner.append(i)
    offsets = array.array("q", [0])
    offsets.extend(accumulate(map(len, parts)))
    _, ends = nb.encode_joined(b"".join(parts), offsets)
    start = 0
    for j, end in enumerate(ends.tolist()):
        counts[j if owner is None else owner[j]] += end - start
        start = end
    return counts


# -- the report -------------------------------------------------------------------------------------------
@dataclass
class FileCount:
    path: str  # as given or found ('-' for standard input)
    bytes: int
    tokens: list[int]  # one count per tokenizer, in the order given; empty when skipped
    skipped: str = ""  # why the file was not counted ('' when it was)


@dataclass
class TreeRow:
    kind: str  # "dir", "file" or "total"
    path: str  # the full path ('' for the total)
    name: str  # what a tree shows at this depth (directories end with '/')
    depth: int
    files: int  # files counted under it (a file: 1, or 0 when skipped)
    bytes: int
    tokens: list[int]
    skipped: str = ""
    over: bool = False  # a file over the budget under at least one tokenizer


@dataclass
class CountReport:
    tokenizers: list[str]
    files: list[FileCount]
    max_tokens: int | None = None
    ignored: int = 0  # files and directories left out by .gitignore files and junk directories
    notes: list[str] = field(default_factory=list)

    def over(self, f: FileCount) -> bool:
        """Is this file over the token budget under at least one tokenizer?"""
        return self.max_tokens is not None and not f.skipped and any(n > self.max_tokens for n in f.tokens)

    @property
    def skipped(self) -> list[FileCount]:
        return [f for f in self.files if f.skipped]

    def total(self) -> TreeRow:
        counted = [f for f in self.files if not f.skipped]
        tokens = [sum(f.tokens[i] for f in counted) for i in range(len(self.tokenizers))]
        return TreeRow("total", "", "total", 0, len(counted), sum(f.bytes for f in counted), tokens)

    def rows(self) -> list[TreeRow]:
        """Directories (with subtotals) and files as a tree, depth first in input order, then the total;
        a directory holding only one directory shows as one row ('src/llmkit/')."""
        root = _Node()
        for f in self.files:
            node = root
            parts = _parts(f.path)
            for name in parts[:-1]:
                node = node.children.setdefault(("d", name), _Node())
            node.children[("f", parts[-1])] = _Node(f)
        out: list[TreeRow] = []
        self._emit(root, "", 0, out)
        out.append(self.total())
        return out

    def _emit(self, node: _Node, base: str, depth: int, out: list[TreeRow]) -> None:
        n = len(self.tokenizers)
        for (_, name), child in node.children.items():
            if child.file is not None:
                f = child.file
                out.append(TreeRow("file", f.path, name, depth, 0 if f.skipped else 1, f.bytes,
                                   list(f.tokens) if not f.skipped else [0] * n, f.skipped, self.over(f)))
                continue
            label = name
            while len(child.children) == 1:
                (kind, sub), only = next(iter(child.children.items()))
                if kind != "d":
                    break
                label, child = os.path.join(label, sub), only
            path = os.path.join(base, label) if base else label
            files, nbytes, tokens = child.sums(n)
            out.append(TreeRow("dir", path, label.rstrip("/") + "/", depth, files, nbytes, tokens))
            self._emit(child, path, depth + 1, out)

    def to_dict(self) -> dict:
        names = self.tokenizers

        def per(tokens: list[int]) -> dict:
            return dict(zip(names, tokens))

        total = self.total()
        return {
            "tokenizers": names,
            "max_tokens": self.max_tokens,
            "files": [{"path": f.path, "bytes": f.bytes, "tokens": per(f.tokens), "over_budget": self.over(f)}
                      for f in self.files if not f.skipped],
            "directories": [{"path": r.path, "files": r.files, "bytes": r.bytes, "tokens": per(r.tokens)}
                            for r in self.rows() if r.kind == "dir"],
            "skipped": [{"path": f.path, "reason": f.skipped} for f in self.skipped],
            "total": {"files": total.files, "bytes": total.bytes, "tokens": per(total.tokens),
                      "over_budget": sum(map(self.over, self.files)), "skipped": len(self.skipped),
                      "ignored": self.ignored},
        }


class _Node:
    def __init__(self, file: FileCount | None = None):
        self.file = file
        self.children: dict[tuple[str, str], _Node] = {}
        self._sums: tuple[int, int, list[int]] | None = None

    def sums(self, n: int) -> tuple[int, int, list[int]]:
        """(files counted, bytes, tokens per tokenizer) of everything below this directory."""
        if self._sums is None:
            files, nbytes, tokens = 0, 0, [0] * n
            for child in self.children.values():
                if child.file is not None:
                    if child.file.skipped:
                        continue
                    f, b, t = 1, child.file.bytes, child.file.tokens
                else:
                    f, b, t = child.sums(n)
                files += f
                nbytes += b
                tokens = [x + y for x, y in zip(tokens, t)]
            self._sums = (files, nbytes, tokens)
        return self._sums


def _parts(path: str) -> list[str]:
    """A path's components for the tree ('/' first for an absolute path)."""
    if path == "-":
        return ["-"]
    p = os.path.normpath(path)
    if p.startswith(os.sep):
        return [os.sep] + [x for x in p.split(os.sep) if x]
    return p.split(os.sep)


# -- which files -----------------------------------------------------------------------------------------
@dataclass
class _Entry:
    path: str
    size: int
    named: bool  # named on the command line (read even when it is a pipe), not found in a directory
    why: str = ""  # why it is skipped without reading ('' when it is to be read)


def plan(inputs: Iterable[str], gitignore: bool = True) -> tuple[list[_Entry], int, list[str]]:
    """(files in order, some already skipped; files ignored; notes) for files, directories, globs and
    '-'; a path that does not exist, or a glob that matches nothing, is an error."""
    from llmkit.walk import TreeWalk, expand_glob, gitignore_spec, is_glob, stat_file

    entries: list[_Entry] = []
    seen: set[str] = set()
    ignored = 0
    notes: list[str] = []

    def add(path: str, named: bool) -> None:
        key = os.path.normpath(path) if path != "-" else "-"
        if key in seen:
            return
        seen.add(key)
        if path == "-":
            entries.append(_Entry(path, 0, True))
            return
        st, why = stat_file(path)
        if st is not None and named:
            why = ""  # a pipe or a device named on the command line is read
        entries.append(_Entry(path, st.st_size if st is not None and not why else 0, named, why))

    for item in inputs:
        if item == "-":
            add(item, True)
            continue
        matches = [item]
        if not os.path.lexists(item) and is_glob(item):
            matches, left = expand_glob(item, gitignore)
            ignored += left
        if not matches:
            raise BadInput(f"no file matches '{item}'. Check the pattern (quote it to let llmkit expand '**').")
        for path in matches:
            if os.path.isdir(path):
                walk = TreeWalk(path, gitignore)
                for p in walk:
                    add(p, False)
                ignored += walk.ignored
                entries.extend(_Entry(p, 0, False, f"unreadable directory ({why})") for p, why in walk.unreadable)
                if gitignore and not notes and os.path.isfile(os.path.join(path, ".gitignore")) \
                        and gitignore_spec(path) is None:
                    notes.append(".gitignore files were not read: install pathspec (pip install pathspec) to honour them")
            elif os.path.lexists(path):
                add(path, True)
            else:
                raise BadInput(f"input '{item}' does not exist. Check the path.")
    return entries, ignored, notes


def _batches(entries: list[_Entry]) -> list[list[_Entry]]:
    """Entries grouped into batches of about BATCH_BYTES (at most BATCH_FILES files), in order."""
    out: list[list[_Entry]] = []
    cur: list[_Entry] = []
    size = 0
    for e in entries:
        if cur and (size + e.size > BATCH_BYTES or len(cur) >= BATCH_FILES):
            out.append(cur)
            cur, size = [], 0
        cur.append(e)
        size += e.size
    if cur:
        out.append(cur)
    return out


# -- reading -------------------------------------------------------------------------------------------------
def _read(e: _Entry, cap: int) -> tuple[bytes, str]:
    """(the file's bytes, '') or (b'', why it is skipped)."""
    if e.path == "-":
        data = sys.stdin.buffer.read(cap + 1)
        return (b"", too_large(len(data), cap, LIMIT)) if len(data) > cap else (data, "")
    # a file found in a directory opens without blocking: a pipe put there since the walk must not hang
    flags = os.O_RDONLY | (0 if e.named else getattr(os, "O_NONBLOCK", 0))
    try:
        fd = os.open(e.path, flags)
    except OSError as err:
        return b"", err.strerror or "unreadable"
    try:
        with os.fdopen(fd, "rb") as f:
            before = os.fstat(fd)
            regular = stat.S_ISREG(before.st_mode)
            if not regular and not e.named:
                return b"", "not a regular file"
            if regular and before.st_size > cap:
                return b"", too_large(before.st_size, cap, LIMIT)
            data = f.read(cap + 1)
            if len(data) > cap:
                return b"", too_large(len(data), cap, LIMIT)
            if regular:
                after = os.fstat(fd)
                if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns) or \
                        (before.st_size and len(data) != before.st_size):
                    return b"", "changed while read"
            return data, ""
    except OSError as err:
        return b"", err.strerror or "unreadable"


def _text(data: bytes) -> tuple[str, str]:
    """(text, '') or ('', why it is not text): NUL bytes at its start make a file binary."""
    if has_nul(data):
        return "", "binary"
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError as e:
        return "", f"not UTF-8 (byte {e.start})"


def _count_batch(toks: list, batch: list[_Entry], cap: int, work_bytes: int) -> list[FileCount]:
    out: list[FileCount] = []
    texts: list[str] = []
    raws: list[bytes] = []
    counted: list[FileCount] = []
    for e in batch:
        data, why = _read(e, cap) if not e.why else (b"", e.why)
        text = ""
        if not why:
            text, why = _text(data)
        f = FileCount(e.path, len(data), [], why)
        out.append(f)
        if not why:
            texts.append(text)
            raws.append(data)
            counted.append(f)
    per_tok = [count_texts(tok, texts, raws, work_bytes) for tok in toks]
    for j, f in enumerate(counted):
        f.tokens = [counts[j] for counts in per_tok]
    return out


def count_paths(named: list[tuple[str, object]], inputs: Iterable[str], max_tokens: int | None = None,
                threads: int = 1, gitignore: bool = True,
                progress: Callable[[int, int], None] | None = None) -> CountReport:
    """Count the tokens of every file the inputs name, under each (name, tokenizer) of `named`;
    batches of files run on `threads` threads, results in input order."""
    from llmkit.tokenize.corpus.stream import in_order

    entries, ignored, notes = plan(inputs, gitignore)
    if not entries:
        raise BadInput("no files found in the given inputs. Pass files, directories, globs or '-'.")
    cap = size_limit()
    toks = [t for _, t in named]
    work = sum(e.size for e in entries)
    jobs = (lambda b=b: _count_batch(toks, b, cap, work) for b in _batches(entries))
    files: list[FileCount] = []
    done = 0
    for result in in_order(jobs, threads):
        files.extend(result)
        done += sum(f.bytes for f in result)
        if progress:
            progress(done, work)
    return CountReport([n for n, _ in named], files, max_tokens, ignored, notes)
