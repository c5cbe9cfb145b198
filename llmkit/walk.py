"""Which files a directory holds, as `rag index` and `tokenize count` read it: sorted order, .gitignore
files honoured (git's rule: the deepest matching pattern decides, negations included), hidden entries
and junk directories (node_modules, __pycache__, ...) skipped, symbolic links to directories not
followed (so a link loop cannot recurse). Also shell patterns ('src/**/*.py') expanded the same way.

May import llmkit.errors only; `pathspec` (the rag extra) parses .gitignore files when it is installed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

# directories never worth reading, even without a .gitignore that says so
JUNK_DIRS = {"node_modules", "__pycache__", "venv", "site-packages", "bower_components"}


def gitignore_spec(directory: str):
    """The .gitignore of `directory` as a pathspec matcher, or None (none there, or no pathspec)."""
    path = os.path.join(directory, ".gitignore")
    if not os.path.isfile(path):
        return None
    try:
        import pathspec
    except ImportError:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return pathspec.GitIgnoreSpec.from_lines(f.read().splitlines())
    except (OSError, ValueError):
        return None


def is_ignored(path: str, is_dir: bool, specs: list) -> bool:
    """Git's rule: the deepest .gitignore with a matching pattern decides (negations included)."""
    verdict = False
    for base, spec in specs:
        rel = os.path.relpath(path, base).replace(os.sep, "/") + ("/" if is_dir else "")
        res = spec.check_file(rel)
        if res.include is not None:
            verdict = res.include
    return verdict


class TreeWalk:
    """The files under one directory, in sorted order (iterate it once).

    After the walk, `ignored` counts the files and directories that .gitignore files and junk
    directories left out (hidden entries are skipped silently) and `unreadable` lists the
    directories that could not be listed, as (path, reason).
    """

    def __init__(self, directory: str, gitignore: bool = True, specs: list | None = None):
        self.directory = directory
        self.gitignore = gitignore
        self.specs = specs or []  # (directory, matcher) of .gitignore files above `directory` that apply
        self.ignored = 0
        self.unreadable: list[tuple[str, str]] = []

    def _error(self, e: OSError) -> None:
        self.unreadable.append((e.filename or self.directory, e.strerror or "unreadable"))

    def __iter__(self) -> Iterator[str]:
        specs_at: dict[str, list] = {os.path.dirname(self.directory): self.specs}
        for root, dirs, names in os.walk(self.directory, onerror=self._error):
            parent = specs_at.get(os.path.dirname(root), [])
            spec = gitignore_spec(root) if self.gitignore else None
            specs = parent + [(root, spec)] if spec is not None else parent
            specs_at[root] = specs
            keep = []
            for d in sorted(dirs):
                full = os.path.join(root, d)
                if d.startswith(".") or d in JUNK_DIRS or (specs and is_ignored(full, True, specs)):
                    self.ignored += not d.startswith(".")
                    continue
                keep.append(d)
            dirs[:] = keep
            for name in sorted(names):
                p = os.path.join(root, name)
                if name.startswith("."):
                    continue
                if specs and is_ignored(p, False, specs):
                    self.ignored += 1
                    continue
                yield p


def stat_file(path: str) -> tuple[os.stat_result | None, str]:
    """(os.stat of a file found in a directory, '') or (its stat or None, why it is not read): a
    dangling link or a link loop, a named pipe or a device (a FIFO blocks a reader forever,
    /dev/zero never ends)."""
    try:
        st = os.stat(path)  # follows links: a loop or a dangling link fails here
    except OSError as e:
        return None, e.strerror or "unreadable"
    return st, "" if stat.S_ISREG(st.st_mode) else "not a regular file"


def is_glob(s: str) -> bool:
    """Does this path have shell wildcards?"""
    return any(c in s for c in "*?[")


def expand_glob(pattern: str, gitignore: bool = True) -> tuple[list[str], int]:
    """(paths matching a shell pattern, files and directories left out), '**' standing for any number
    of directories. Below a '**' the pattern sees the tree as the directory walk does: it matches
    files only (a final '**' stands for every file under it), and it does not go into hidden or junk
    directories, into links to directories (a link loop would recurse until ELOOP), or into what the
    .gitignore files from where it starts downward exclude. '*' matches a hidden name only when the
    pattern's part starts with '.'.

    >>> expand_glob("/nonexistent/**/*.py")
    ([], 0)
    """
    g = _Glob(gitignore)
    base = os.sep if pattern.startswith(os.sep) else ""
    parts = [x for x in pattern.split(os.sep) if x]
    paths = list(dict.fromkeys(g.match(base, parts, None)))
    return paths, len(g.ignored) + g.walked


class _Glob:
    """One expansion of a pattern (expand_glob): the matching walk, and what it left out."""

    def __init__(self, gitignore: bool):
        self.gitignore = gitignore
        self.ignored: set[str] = set()
        self.walked = 0  # left out by the walks a final '**' makes

    @staticmethod
    def join(base: str, name: str) -> str:
        return os.path.join(base, name) if base else name

    @staticmethod
    def names(base: str) -> list[str]:
        try:
            return sorted(os.listdir(base or "."))
        except OSError:
            return []

    def left_out(self, p: str, is_dir: bool, specs: list | None) -> bool:
        if specs and is_ignored(p, is_dir, specs):
            self.ignored.add(p)
            return True
        return False

    def match(self, base: str, parts: list[str], specs: list | None) -> Iterator[str]:
        """`specs`: None above the first '**', else the .gitignore matchers that apply below `base`."""
        if not parts:
            yield base
        elif parts[0] == "**":
            yield from self.any_dirs(base, parts, specs)
        else:
            yield from self.one_part(base, parts, specs)

    def any_dirs(self, base: str, parts: list[str], specs: list | None) -> Iterator[str]:
        """'**' at `base`: the rest matched here and in every directory below that the walk enters."""
        rest = parts[1:]
        above = list(specs or [])
        if not rest:  # the files under `base`, as the directory walk finds them
            walk = TreeWalk(base or ".", self.gitignore, above)
            for p in walk:
                yield p[2:] if not base and p.startswith("./") else p
            self.walked += walk.ignored
            return
        spec = gitignore_spec(base or ".") if self.gitignore else None
        specs = above + [(base or ".", spec)] if spec is not None else above
        yield from self.match(base, rest, specs)
        for name in self.names(base):
            p = self.join(base, name)
            if name.startswith(".") or not os.path.isdir(p) or os.path.islink(p):
                continue
            if name in JUNK_DIRS:
                self.ignored.add(p)
            elif not self.left_out(p, True, specs):
                yield from self.match(p, parts, specs)  # the '**' there adds p's own .gitignore

    def one_part(self, base: str, parts: list[str], specs: list | None) -> Iterator[str]:
        """A name or a wildcard part (not '**') at `base`, then the rest below what it matches."""
        import fnmatch

        head, rest = parts[0], parts[1:]
        wild = is_glob(head)
        for name in self.names(base) if wild else [head]:
            p = self.join(base, name)
            if wild and not (fnmatch.fnmatchcase(name, head) and (head.startswith(".") or not name.startswith("."))):
                continue
            if not os.path.lexists(p) or (rest and not os.path.isdir(p)):
                continue
            if specs is not None:  # below a '**': the tree as the directory walk sees it, files only
                is_dir = os.path.isdir(p)
                if not rest and is_dir:
                    continue
                if wild and is_dir and name in JUNK_DIRS:
                    self.ignored.add(p)
                    continue
                if self.left_out(p, is_dir, specs):
                    continue
            yield from self.match(p, rest, specs)
