"""Which files a directory holds, as `rag index` and `tokenize count` read it: sorted order, .gitignore
files honoured (git's rule: the deepest matching pattern decides, negations included), hidden entries
and junk directories (node_modules, __pycache__, ...) skipped, symbolic links to directories not
followed (so a link loop cannot recurse). Also shell patterns ('src/**/*.py') expanded the same way.

May import llmkit.errors only; `pathspec` (the rag extra) parses .gitignore files when it is installed.
"""

from __future__ import annotations

import os
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

    def __init__(self, directory: str, gitignore: bool = True):
        self.directory = directory
        self.gitignore = gitignore
        self.ignored = 0
        self.unreadable: list[tuple[str, str]] = []

    def _error(self, e: OSError) -> None:
        self.unreadable.append((e.filename or self.directory, e.strerror or "unreadable"))

    def __iter__(self) -> Iterator[str]:
        specs_at: dict[str, list] = {}
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


def is_glob(s: str) -> bool:
    """Does this path have shell wildcards?"""
    return any(c in s for c in "*?[")


def expand_glob(pattern: str) -> list[str]:
    """Paths matching a shell pattern, '**' standing for any number of directories; unlike `glob`,
    '**' does not descend into links to directories (a link loop would recurse until ELOOP), and
    '*' matches a hidden name only when the pattern's part starts with '.'.

    >>> expand_glob("/nonexistent/**/*.py")
    []
    """
    import fnmatch

    def join(base: str, name: str) -> str:
        return os.path.join(base, name) if base else name

    def names(base: str) -> list[str]:
        try:
            return sorted(os.listdir(base or "."))
        except OSError:
            return []

    def match(base: str, parts: list[str]) -> Iterator[str]:
        if not parts:
            yield base
            return
        head, rest = parts[0], parts[1:]
        if head == "**":
            yield from match(base, rest)
            for name in names(base):
                p = join(base, name)
                if not name.startswith(".") and os.path.isdir(p) and not os.path.islink(p):
                    yield from match(p, parts)
        elif not is_glob(head):
            p = join(base, head)
            if os.path.lexists(p) and (not rest or os.path.isdir(p)):
                yield from match(p, rest)
        else:
            for name in names(base):
                p = join(base, name)
                if (fnmatch.fnmatchcase(name, head) and (head.startswith(".") or not name.startswith("."))
                        and (not rest or os.path.isdir(p))):
                    yield from match(p, rest)

    parts = pattern.split(os.sep)
    base = os.sep if pattern.startswith(os.sep) else ""
    parts = [x for x in parts if x] if base else parts
    return list(dict.fromkeys(match(base, parts)))
