"""`rag index --watch`: after the first pass, added, changed and deleted files are indexed as they
happen; a burst of edits ends with every file in the index exactly once with its last content; the
writer lock still serialises writers; Ctrl-C ends with the last generation live; a watched path that
disappears is said once and the watcher keeps going."""

import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from conftest import run_cli, start_subprocess

pytest.importorskip("watchfiles")


class Watcher:
    """`llmkit rag index IDX INPUTS --watch --json --no-tune` as a subprocess; its pass records and
    stderr lines are collected as they come."""

    def __init__(self, idx, *inputs, extra=()):
        # SIGINT back to its default: a suite started in the background by a non-interactive shell
        # passes it on ignored, and Python then keeps ignoring it (as a user's terminal never would)
        self.proc = start_subprocess(["rag", "index", idx, *inputs, "--watch", "--json", "--no-tune", *extra],
                                     text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.passes: list[dict] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._read, args=(self.proc.stdout, self.passes, json.loads)),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.err, str))]
        for t in self._threads:
            t.start()
        self.wait_for(lambda: self.passes, 180, "the first pass")

    @staticmethod
    def _read(stream, into, parse):
        for line in stream:
            into.append(parse(line))

    def wait_for(self, cond, timeout=60.0, what="a condition"):
        deadline = time.time() + timeout
        while not cond():
            if self.proc.poll() is not None:
                pytest.fail(f"the watcher exited ({self.proc.returncode}) waiting for {what}: {''.join(self.err)[-2000:]}")
            if time.time() > deadline:
                pytest.fail(f"timed out waiting for {what}; stderr: {''.join(self.err)[-2000:]}")
            time.sleep(0.05)

    def stop(self, sig=signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        for t in self._threads:
            t.join(timeout=10)
        return code


def _docs(idx) -> dict[str, list[str]]:
    """Path -> texts of its chunks in the live generation."""
    from llmkit.rag.index.reader import Index

    ix = Index(str(idx))
    try:
        out: dict[str, list[str]] = {}
        if ix.n:
            rows = ix.rows.tolist()
            for src, text in ix.con.execute(
                    f"SELECT d.path, c.text FROM chunks c JOIN docs d ON d.id = c.doc_id WHERE c.id IN "
                    f"({','.join('?' * len(rows))}) ORDER BY c.id", rows):
                out.setdefault(src, []).append(text)
        return out
    finally:
        ix.close()


def _top(idx, query):
    r = run_cli(["rag", "query", str(idx), query, "-k", "1", "--jsonl", "--mode", "bm25"])
    return json.loads(r.stdout.splitlines()[0]) if r.exit_code == 0 and r.stdout.strip() else None


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def tree(tmp_path):
    docs = tmp_path / "docs"
    for i in range(4):
        _write(docs / f"note{i}.md", f"# Note {i}\n\nA note about topic number {i} and the weather in town {i}.\n")
    return tmp_path, docs


def test_added_changed_and_deleted_files_answer_queries_within_seconds(tree):
    root, docs = tree
    idx = root / "idx"
    w = Watcher(idx, docs)
    try:
        assert w.passes[0]["docs_added"] == 4
        latencies = []
        for step, (path, text, query, expect) in enumerate([
                (docs / "new.md", "# Okapi\n\nThe okapi lives in the Ituri rainforest.\n", "okapi ituri", "new.md"),
                (docs / "note1.md", "# Note 1\n\nNow about the pangolin and its scales.\n", "pangolin scales",
                 "note1.md"),
                (docs / "sub" / "deep.md", "# Deep\n\nA narwhal tusk is a tooth.\n", "narwhal tusk", "deep.md")]):
            t0 = time.time()
            _write(path, text)
            w.wait_for(lambda: (_top(idx, query) or {}).get("doc", "").endswith(expect), 60, f"step {step}")
            latencies.append(time.time() - t0)
        assert "weather" not in " ".join(_docs(idx)[str(docs / "note1.md")])  # the old text left with its change
        t0 = time.time()
        (docs / "new.md").unlink()
        w.wait_for(lambda: str(docs / "new.md") not in _docs(idx), 60, "the deletion")
        latencies.append(time.time() - t0)
        print(f"edit -> answered (s): {[round(x, 2) for x in latencies]}")
        assert max(latencies) < 15  # the goal is 3 s; a loaded shared machine gets slack, a hang does not
        assert all(p["changed"] for p in w.passes[1:])
    finally:
        assert w.stop() == 0
    assert any("stopped watching; generation" in line for line in w.err)


def test_a_burst_of_200_edits_ends_with_every_file_once_with_its_last_text(tree):
    root, docs = tree
    idx = root / "idx"
    w = Watcher(idx, docs)
    final: dict[Path, str | None] = {docs / f"note{i}.md": (docs / f"note{i}.md").read_text() for i in range(4)}
    try:
        for n in range(200):
            path = docs / f"burst{n % 25}.md"
            if n % 9 == 8 and path.exists():
                path.unlink()
                final[path] = None
            else:
                text = f"# Burst {n % 25}\n\nEdit {n} of file {n % 25}: token{n}x appears here only.\n"
                path.write_text(text)
                final[path] = text
            time.sleep(0.01)  # the edits span several passes: some land while a pass runs
        want = {str(p): t for p, t in final.items() if t is not None}

        def settled():  # every file once with its last text: a pass still running may hold an older one
            got = _docs(idx)
            return set(got) == set(want) and all(len(v) == 1 and re.findall(r"token\d+x", v[0]) ==
                                                  re.findall(r"token\d+x", want[p]) for p, v in got.items())

        w.wait_for(settled, 120, "the burst to settle")
        got = _docs(idx)
        for path, text in want.items():
            assert re.findall(r"token\d+x", got[path][0]) == re.findall(r"token\d+x", text), (path, got[path], text)
        from llmkit.rag.index.reader import Index

        ix = Index(str(idx))
        n_docs = ix.con.execute("SELECT COUNT(*) FROM docs WHERE gen_removed IS NULL").fetchone()[0]
        ix.close()
        assert n_docs == len(want)  # no document twice, none stale
    finally:
        assert w.stop() == 0


def test_other_writers_queue_and_keep_their_documents(tree, tmp_path):
    root, docs = tree
    idx = root / "idx"
    other = tmp_path / "other.md"
    other.write_text("# Other\n\nA capybara swims in the river.\n")
    w = Watcher(idx, docs)
    try:
        r = run_cli(["rag", "index", str(idx), str(other), "--no-tune"])  # waits for the lock if a pass holds it
        assert r.exit_code == 0, r.stderr
        _write(docs / "more.md", "# More\n\nA tapir eats fruit.\n")
        w.wait_for(lambda: str(docs / "more.md") in _docs(idx), 60, "the watcher's pass")
        assert str(other) in _docs(idx)  # the watcher's pass did not drop the other writer's file
    finally:
        assert w.stop() == 0


def test_ctrl_c_ends_cleanly_with_the_last_generation_live(tree):
    root, docs = tree
    idx = root / "idx"
    w = Watcher(idx, docs)
    _write(docs / "late.md", "# Late\n\nThe axolotl regrows its limbs.\n")
    w.wait_for(lambda: len(w.passes) >= 2, 60, "the second pass")
    gen = json.loads((idx / "manifest.json").read_text())["generation"]
    assert w.stop(signal.SIGINT) == 0
    assert "Traceback" not in "".join(w.err)
    assert json.loads((idx / "manifest.json").read_text())["generation"] == gen
    assert (_top(idx, "axolotl limbs") or {}).get("doc", "").endswith("late.md")
    r = run_cli(["rag", "index", str(idx), str(docs), "--no-wait", "--no-tune"])  # no lock left behind
    assert r.exit_code == 0, r.stderr


def test_a_watched_path_that_disappears_is_said_once_and_watching_goes_on(tree, tmp_path):
    root, docs = tree
    extra = tmp_path / "extra"
    _write(extra / "e.md", "# Extra\n\nThe quetzal has green feathers.\n")
    idx = root / "idx"
    w = Watcher(idx, docs, extra)
    try:
        moved = tmp_path / "moved-away"
        extra.rename(moved)
        w.wait_for(lambda: str(extra / "e.md") not in _docs(idx), 60, "extra's documents to leave")
        _write(docs / "still.md", "# Still\n\nThe watcher still sees the wombat.\n")
        w.wait_for(lambda: str(docs / "still.md") in _docs(idx), 60, "a pass after the loss")
        assert sum("disappeared" in line for line in w.err) == 1
        moved.rename(extra)
        w.wait_for(lambda: str(extra / "e.md") in _docs(idx), 60, "extra coming back")
    finally:
        assert w.stop() == 0


def test_watch_refuses_stdin_and_missing_paths(tmp_path):
    r = run_cli(["rag", "index", str(tmp_path / "idx"), "-", "--watch"], input="text")
    assert r.exit_code == 1 and "--watch follows files and directories" in r.stderr
    r = run_cli(["rag", "index", str(tmp_path / "idx"), str(tmp_path / "nope"), "--watch"])
    assert r.exit_code == 1 and "does not exist" in r.stderr


def test_an_edit_before_the_watch_is_live_is_indexed(tree):
    """A file written after the first pass but before the watch starts raises no event: it is found
    by comparing the files with what they were before the first pass."""
    from llmkit.rag.index.build import IndexOptions
    from llmkit.rag.indexing import watch

    root, docs = tree
    stop, events = threading.Event(), []

    def on_event(ev):
        events.append(ev)
        if len(events) == 1:  # still inside the first pass's report: no watch is on yet
            _write(docs / "gap.md", "# Gap\n\nThe pangolin rolls into a ball.\n")
            _write(docs / "note2.md", "# Note 2\n\nNow about the okapi.\n")

    t = threading.Thread(target=watch, args=(str(root / "idx"), [str(docs)], IndexOptions(tune=False), on_event, stop))
    t.start()
    try:
        deadline = time.time() + 60
        while len(events) < 2 and time.time() < deadline and t.is_alive():
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(60)
    assert len(events) >= 2, "no pass after the edit made before the watch was live"
    assert set(events[1].paths) == {str(docs / "gap.md"), str(docs / "note2.md")}
    texts = _docs(root / "idx")
    assert "pangolin" in " ".join(texts[str(docs / "gap.md")]) and "okapi" in " ".join(texts[str(docs / "note2.md")])
