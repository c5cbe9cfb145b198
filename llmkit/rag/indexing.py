"""`rag index` as the library runs it: one pass (add, update and remove documents, then tune the
fusion when the corpus changed enough), and watching the inputs to run a pass on every batch of
file changes.

Watching: after a first full pass, the inputs are watched (watchfiles: inotify / FSEvents /
ReadDirectoryChangesW); a batch of changes under them re-reads only the files it names (`build`'s
`changed`), while every pass still walks the inputs, so a file that appeared without an event is
added and one that vanished without an event is removed. Passes take the index's writer lock like
any `rag index` run, so another writer queues behind a pass and the other way round, and each pass
publishes a complete generation or none. Directories are watched rather than single files (an editor
that saves by renaming replaces the file the watch was on); an input that disappears has its
documents removed and its nearest existing parent watched until it comes back. A watch raises no
event for what changed before it went live, so the files' modification times and sizes are taken
before the first pass (and before a watch moves) and compared once the new watch is live. Stopping
(Ctrl-C, or `stop`) between or during passes leaves the last published generation live.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

from llmkit.errors import OptionError
from llmkit.rag.index.build import IndexOptions, IndexReport, build
from llmkit.rag.read.documents import SUFFIXES
from llmkit.rag.read.files import collect_files
from llmkit.walk import JUNK_DIRS


def index_pass(directory: str, inputs: list[str], opts: IndexOptions, stdin_data: bytes | None = None,
               progress: Callable[[str, int, int], None] | None = None, on_wait: Callable[[str], None] | None = None,
               changed: Callable[[str], bool] | None = None, vanished: tuple[str, ...] = ()):
    """(IndexReport, what tuning did or None): one `rag index` run (`build`, then `auto_tune` unless
    `opts.tune` is off)."""
    report = build(directory, inputs, opts, stdin_data=stdin_data, progress=progress, on_wait=on_wait,
                   changed=changed, vanished=vanished)
    tuned = None
    if opts.tune:
        from llmkit.rag.evaluate.tune import auto_tune

        tuned = auto_tune(directory, report, progress)
    return report, tuned


@dataclass
class WatchEvent:
    """What the watcher did: a pass (`report`, and the paths whose change started it), or a note
    about a watched input that disappeared or came back."""

    kind: str  # "pass" | "gone" | "back"
    message: str = ""
    report: IndexReport | None = None
    tuned: dict | None = None
    paths: list[str] = field(default_factory=list)
    seconds: float = 0.0  # from the first change of the batch to the pass's new generation


class _Inputs:
    """The watched inputs: which exist, which directories to watch, which changed paths matter."""

    def __init__(self, directory: str, inputs: list[str]):
        self.given = list(inputs)  # as the user wrote them: documents keep the source names of the first pass
        self.inputs = [os.path.abspath(p) for p in inputs]
        self.index_dir = os.path.abspath(directory)
        self.missing = {p for p in self.inputs if not os.path.exists(p)}

    def present(self) -> list[str]:
        return [g for g, p in zip(self.given, self.inputs) if p not in self.missing]

    def vanished(self) -> tuple[str, ...]:
        return tuple(g for g, p in zip(self.given, self.inputs) if p in self.missing)

    def targets(self) -> list[str]:
        """Directories to watch: a directory input itself, a file input's directory, and for a missing
        input its nearest existing parent (to see it come back)."""
        out = []
        for p in self.inputs:
            t = p if os.path.isdir(p) and p not in self.missing else os.path.dirname(p)
            while not os.path.isdir(t):
                t = os.path.dirname(t)
            out.append(t)
        return sorted(set(out))

    def matters(self, path: str) -> bool:
        """A change at `path` can change the index: under an input, outside the index directory,
        not hidden (bar .gitignore) nor in a junk directory, and of a readable type or a directory."""
        if path == self.index_dir or path.startswith(self.index_dir + os.sep):
            return False
        if not any(path == p or path.startswith(p + os.sep) for p in self.inputs):
            return False
        parts = path.split(os.sep)
        if any(x.startswith(".") and x != ".gitignore" or x in JUNK_DIRS for x in parts[1:]):
            return False
        suffix = os.path.splitext(path)[1].lower()
        return suffix in SUFFIXES or parts[-1] == ".gitignore" or suffix == "" or os.path.isdir(path)

    def recheck(self) -> list[WatchEvent]:
        """Notes for inputs that disappeared or came back since the last look (once each)."""
        notes = []
        for p in self.inputs:
            gone = not os.path.exists(p)
            if gone and p not in self.missing:
                self.missing.add(p)
                notes.append(WatchEvent("gone", f"{p} disappeared: its documents leave the index; still watching "
                                                "(it is indexed again if it comes back)"))
            elif not gone and p in self.missing:
                self.missing.discard(p)
                notes.append(WatchEvent("back", f"{p} is back: indexing it again"))
        return notes


def watch(directory: str, inputs: list[str], opts: IndexOptions, on_event: Callable[[WatchEvent], None],
          stop=None, debounce_ms: int = 200, progress: Callable[[str, int, int], None] | None = None,
          on_wait: Callable[[str], None] | None = None) -> IndexReport | None:
    """Index `inputs` into `directory`, then keep it up to date as files change until `stop` (a
    threading.Event) is set or Ctrl-C: every pass and every note goes to `on_event`. Returns the last
    pass's report."""
    import watchfiles

    if "-" in inputs:
        raise OptionError("{watch} follows files and directories, not standard input; name the paths.")
    watched = _Inputs(directory, inputs)
    if watched.missing:
        raise OptionError("input '{path}' does not exist; {watch} needs it at the start.",
                          path=sorted(watched.missing)[0])
    last = None
    try:
        t0 = time.perf_counter()
        # taken before the first pass: what changes between it and the watch going live is found by
        # comparing with this once the watch is live (an edit in that gap raises no event)
        snap = _snapshot(watched, opts)
        report, tuned = index_pass(directory, inputs, opts, progress=progress, on_wait=on_wait)
        last = report
        on_event(WatchEvent("pass", report=report, tuned=tuned, seconds=time.perf_counter() - t0))
        while stop is None or not stop.is_set():
            targets = watched.targets()
            for changes in watchfiles.watch(*targets, watch_filter=None, debounce=debounce_ms, step=50,
                                            stop_event=stop, rust_timeout=1000, yield_on_timeout=True):
                t0 = time.perf_counter()
                notes = watched.recheck()
                for note in notes:
                    on_event(note)
                paths = {p for _, p in changes if watched.matters(p)}
                if snap is not None:  # the first batch of a new watch: it is live now
                    paths |= _differences(snap, _snapshot(watched, opts))
                    snap = None
                moving = watched.targets() != targets
                if moving:  # an input left or came back: the next watch catches up from here
                    snap = _snapshot(watched, opts)
                if paths or notes:
                    last = _pass(directory, watched, opts, sorted(paths), on_event, t0, progress, on_wait) or last
                if moving:
                    break  # watch its new nearest directory
    except KeyboardInterrupt:
        pass
    return last


def _snapshot(watched: _Inputs, opts: IndexOptions) -> dict[str, tuple[int, int]]:
    """Absolute path -> (mtime in ns, size) of every file a pass would read now."""
    out = {}
    for path in collect_files(watched.present(), opts.read, empty_glob=True)[0]:
        try:
            st = os.stat(path)
        except OSError:
            continue
        out[os.path.abspath(path)] = (st.st_mtime_ns, st.st_size)
    return out


def _differences(before: dict, after: dict) -> set[str]:
    """Paths added, removed or changed between two snapshots."""
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def _pass(directory, watched: _Inputs, opts, paths: list[str], on_event, t0, progress, on_wait):
    """One pass for a batch of changed paths: files named in it (or under a directory named in it)
    are read again; the rest are walked, not read."""
    prefixes = tuple(p + os.sep for p in paths)
    set_paths = set(paths)

    def changed(path: str) -> bool:
        return path in set_paths or path.startswith(prefixes)

    report, tuned = index_pass(directory, watched.present(), opts, progress=progress, on_wait=on_wait,
                               changed=changed, vanished=watched.vanished())
    on_event(WatchEvent("pass", report=report, tuned=tuned, paths=paths, seconds=time.perf_counter() - t0))
    return report
