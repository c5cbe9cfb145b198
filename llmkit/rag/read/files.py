"""Which files an indexing run reads: explicitly named files always; directories walked in sorted
order, honouring .gitignore files (git's rule: the deepest matching pattern decides, negations
included), skipping hidden entries and junk directories (node_modules, __pycache__, ...), then the
include/exclude globs and the supported suffixes. Also the reading options and the report helpers
for what was left out."""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass

from llmkit.errors import BadInput
from llmkit.errors import OptionError
from llmkit.bounded import too_large
from llmkit.rag.read.documents import SUFFIXES, size_cap
from llmkit.rag.read.types import Skipped
from llmkit.walk import TreeWalk, stat_file


@dataclass
class ReadOptions:
    """How inputs become documents."""

    text_field: str = "text"  # JSONL: the field holding the text
    id_field: str = "id"  # JSONL: the field holding the document id
    include: tuple[str, ...] = ()  # directories: only files matching one of these globs
    exclude: tuple[str, ...] = ()  # directories: skip files matching one of these globs
    gitignore: bool = True  # respect .gitignore files in directories
    code_size: int = 0  # characters per code chunk (definitions up to this size stay whole); 0: the
    # embedding model's window in its tokens when chunks are token-sized, else 1500 characters
    csv_meta: tuple[str, ...] = ()  # CSV/TSV columns kept as metadata (one row per chunk then)


def collect_files(inputs: list[str], opts: ReadOptions, empty_glob: bool = False
                  ) -> tuple[list[str], list[Skipped], int]:
    """(files to read, files skipped for their type, files ignored by .gitignore/junk directories);
    explicitly named files are always read. An include glob that matches none of the directories' files
    is refused unless `empty_glob` (a watch pass, where the last matching file may just have gone)."""
    files: list[str] = []
    skipped: list[Skipped] = []
    ignored = walked = included = 0
    for item in inputs:
        if item == "-":
            files.append(item)
        elif os.path.isdir(item):
            walk = TreeWalk(item, opts.gitignore)
            for p in walk:
                name = os.path.basename(p)
                walked += 1
                if opts.include and not any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(p, g) for g in opts.include):
                    continue
                included += 1
                if any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(p, g) for g in opts.exclude):
                    continue
                if os.path.splitext(name)[1].lower() not in SUFFIXES:
                    skipped.append(Skipped(p, "unsupported type"))
                    continue
                problem = _not_readable(p)
                if problem:
                    skipped.append(Skipped(p, problem))
                    continue
                files.append(p)
            ignored += walk.ignored
        elif os.path.exists(item):
            files.append(item)
        else:
            raise BadInput(f"input '{item}' does not exist. Check the path.")
    if opts.include and walked and not included and not empty_glob:
        # indexing nothing would remove every document the collection holds from these directories
        raise OptionError("{include} {globs} matches none of the {n} files under {dirs}; nothing was changed. "
                          "A pattern matches a file's name or its path (e.g. '*.md').",
                          globs=" ".join(repr(g) for g in opts.include), n=walked,
                          dirs=", ".join(repr(i) for i in inputs if os.path.isdir(i)))
    return files, skipped, ignored


def _not_readable(path: str) -> str:
    """Why a file found in a directory is not read ('' when it is): walk.stat_file's reasons, or a
    size over the limit."""
    st, why = stat_file(path)
    if why:
        return why
    cap, name = size_cap(path)
    return too_large(st.st_size, cap, name) if st.st_size > cap else ""


def read_input(path: str) -> tuple[bytes, Skipped | None]:
    """(bytes, None) of one input file, or (b"", the reason it is skipped): unreadable, or more
    bytes than its size limit allows (read no further than that: a named pipe or /dev/zero too)."""
    cap, name = size_cap(path)
    try:
        with open(path, "rb") as f:
            data = f.read(cap + 1)
    except OSError as e:
        return b"", Skipped(path, e.strerror or "unreadable")
    if len(data) > cap:
        return b"", Skipped(path, too_large(len(data), cap, name))
    return data, None


def check_csv_meta(files: list[str], columns: tuple[str, ...]) -> None:
    """Before touching the index: every csv_meta column must exist in at least one table file."""
    from llmkit.rag.read.decode import NotText, decode_text
    from llmkit.rag.read.formats import table_header

    seen: set[str] = set()
    tables = [f for f in files if f != "-" and f.lower().endswith((".csv", ".tsv"))]
    for f in tables:
        try:
            with open(f, "rb") as fh:
                head = fh.read(100000)
        except OSError:
            continue
        try:
            text = decode_text(head)[0]  # the same reading as indexing (a Latin-1 header included)
        except NotText:
            text = head.decode("utf-8", "replace")
        seen.update(table_header(text, f)[1])
    missing = [c for c in columns if c not in seen]
    if missing:
        raise OptionError("no CSV/TSV input has a column {column!r}{known}. Fix {csv_meta}.", column=missing[0],
                          known=f" (columns: {', '.join(sorted(seen))})" if seen else " (there is no CSV/TSV input)")


def summarize_skipped(skipped: list[Skipped], show: int = 5) -> str:
    """'12 file(s): 8 .png (unsupported type), 3 .py (syntax error: cut at lines) ...: a.png, b.png ...'"""
    from collections import Counter

    def ext(src: str) -> str:
        base = re.sub(r"(:\d+|#.*)$", "", src)  # a JSONL line ('docs.jsonl:7') or record ('docs.jsonl#id')
        return os.path.splitext(base)[1].lower() or "(no suffix)"

    groups = Counter((ext(s.source), s.reason.split(" (")[0]) for s in skipped)
    head = ", ".join(f"{n} {e} ({r})" for (e, r), n in groups.most_common())
    names = ", ".join(s.source for s in skipped[:show]) + (" ..." if len(skipped) > show else "")
    return f"{len(skipped)} file(s): {head}: {names}"
