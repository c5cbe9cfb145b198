"""Files that change while `rag index` reads them, and a PDF page whose text takes too long.

A thread appends to, truncates, rewrites in two steps (so a reader can see half a file), deletes and
recreates, and swaps for a directory the files of a corpus while `rag index` runs over it RUNS times.
Every run exits 0 with no traceback (a file caught half-written is read as it was or skipped with a
reason); once the files settle, one more run leaves the index holding exactly what a fresh index of
the final files holds. A PDF page over LLMKIT_MAX_PDF_PAGE_SECONDS is skipped with a reason naming
the limit, interrupted mid-page, while the PDF's other pages are indexed."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import llmkit_env, run_cli

import crafted

ROOT = Path(__file__).resolve().parents[2]
RUNS = 4


def _docx(text: str) -> bytes:
    body = f'<w:p><w:r><w:t>{text}</w:t></w:r></w:p>'.encode()
    xml = (b'<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="http://schemas.openxmlformats.org/'
           b'wordprocessingml/2006/main"><w:body>' + body + b'</w:body></w:document>')
    return crafted._docx_with(xml)


def _final(d: Path) -> None:
    """The settled corpus (what the last run must hold)."""
    (d / "log.txt").write_text("".join(f"log line {i} zqlog{i}\n" for i in range(40)))
    (d / "notes.md").write_text("# Notes\nThe settled notes mention zqnotes.\n")
    (d / "rows.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "text": f"record {i} zqrow{i}"}) + "\n"
                                          for i in range(10)))
    (d / "table.csv").write_text("name,value\n" + "".join(f"item{i},zqcell{i}\n" for i in range(20)))
    (d / "gone.md").write_text("# Back\nThis file came back: zqback.\n")
    (d / "report.docx").write_bytes(_docx("The settled report says zqdocx."))
    if (d / "flip").is_dir():
        shutil.rmtree(d / "flip")
    (d / "flip.md").write_text("# Flip\nA file again: zqflip.\n")


def _churn(d: Path, stop: threading.Event, counts: dict) -> None:
    """Change the corpus until `stop`: each step one kind of change (bounded by the test's runs)."""
    rng = random.Random(7)
    n = 0
    while not stop.is_set():
        n += 1
        kind = rng.choice(["append", "truncate", "two_steps", "jsonl_cut", "delete", "docx_half", "flip", "csv"])
        try:
            if kind == "append":
                with open(d / "log.txt", "a") as f:
                    f.write("".join(f"log line {n}.{i} zqlog{i}\n" for i in range(200)))
            elif kind == "truncate":
                with open(d / "log.txt", "r+") as f:
                    f.truncate(rng.randrange(0, 4000))
            elif kind == "two_steps":  # a rewrite in place: a reader may see the first half only
                text = f"# Notes {n}\n" + "words " * rng.randrange(10, 3000) + "\n"
                with open(d / "notes.md", "w") as f:
                    f.write(text[: len(text) // 2])
                    f.flush()
                    time.sleep(0.002)
                    f.write(text[len(text) // 2:])
            elif kind == "jsonl_cut":  # a JSONL record cut mid-line, then finished
                with open(d / "rows.jsonl", "a") as f:
                    rec = json.dumps({"id": f"x{n}", "text": f"late record {n}"})
                    f.write(rec[:9])
                    f.flush()
                    time.sleep(0.002)
                    f.write(rec[9:] + "\n")
            elif kind == "delete":
                p = d / "gone.md"
                if p.exists():
                    p.unlink()
                else:
                    p.write_text(f"# Gone {n}\nback again.\n")
            elif kind == "docx_half":  # a zip written in two steps: half an archive for a moment
                data = _docx(f"report {n}")
                with open(d / "report.docx", "wb") as f:
                    f.write(data[: len(data) // 2])
                    f.flush()
                    time.sleep(0.005)
                    f.write(data[len(data) // 2:])
            elif kind == "flip":  # a file becomes a directory and back
                f, g = d / "flip.md", d / "flip"
                if f.exists():
                    f.unlink()
                    g.mkdir()
                    (g / "inner.md").write_text(f"# Inner {n}\n")
                elif g.exists():
                    shutil.rmtree(g)
                    f.write_text(f"# Flip {n}\n")
            elif kind == "csv":
                with open(d / "table.csv", "w") as f:
                    f.write("name,value\n" + "".join(f"a{i},{i}\n" for i in range(rng.randrange(0, 300))))
            counts[kind] = counts.get(kind, 0) + 1
        except OSError:
            pass  # the other side of a race (a directory removed under us): try the next change
        time.sleep(0.003)


def _live_texts(idx: Path) -> list[str]:
    from llmkit.rag.index.reader import Index

    ix = Index(str(idx))
    try:
        return sorted(ix.texts(range(ix.n)))
    finally:
        ix.close()


@pytest.mark.slow
def test_index_files_that_change_while_read(tmp_path, capsys):
    pytest.importorskip("docx")
    corpus, idx = tmp_path / "corpus", tmp_path / "idx"
    corpus.mkdir()
    _final(corpus)
    stop, counts = threading.Event(), {}
    churn = threading.Thread(target=_churn, args=(corpus, stop, counts), daemon=True)
    churn.start()
    skipped, t0 = 0, time.monotonic()
    try:
        for _ in range(RUNS):
            r = run_cli(["rag", "index", str(idx), str(corpus), "--json"])
            assert r.exit_code == 0, r.stderr
            assert "Traceback" not in r.stderr and not any(x.startswith("Error:") for x in r.stderr.splitlines()), r.stderr
            skipped += len(json.loads(r.stdout)["skipped"])
    finally:
        stop.set()
        churn.join(10)
    _final(corpus)  # settled: the next run must hold exactly the final files
    r = run_cli(["rag", "index", str(idx), str(corpus)])
    assert r.exit_code == 0, r.stderr
    fresh = tmp_path / "fresh"
    shutil.copytree(corpus, tmp_path / "copy")
    assert run_cli(["rag", "index", str(fresh), str(tmp_path / "copy")]).exit_code == 0
    assert _live_texts(idx) == _live_texts(fresh)
    with capsys.disabled():
        print(f"\n{RUNS} index runs over a changing corpus ({sum(counts.values())} changes: "
              f"{', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}; {skipped} counted skips) in "
              f"{time.monotonic() - t0:.0f} s: 0 errors")


def _two_page_pdf(slow_ops: int) -> bytes:
    fast = b"BT /F1 12 Tf 72 720 Td (The zqfast page.) Tj ET"
    slow = b"BT /F1 12 Tf " + b"1 0 Td (x) Tj " * slow_ops + b"ET"
    page = "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents {} 0 R >>"
    return crafted.pdf(["<< /Type /Catalog /Pages 2 0 R >>", "<< /Type /Pages /Kids [4 0 R 6 0 R] /Count 2 >>",
                        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>", page.format(5),
                        f"<< /Length {len(fast)} >>\nstream\n".encode() + fast + b"\nendstream", page.format(7),
                        f"<< /Length {len(slow)} >>\nstream\n".encode() + slow + b"\nendstream"])


def test_pdf_page_over_its_time_limit_is_skipped(tmp_path, monkeypatch):
    pytest.importorskip("pypdf")
    from llmkit.rag.read.documents import load_file

    data = _two_page_pdf(300_000)  # the second page alone takes ~5 s (pypdf, one core)
    monkeypatch.setenv("LLMKIT_MAX_PDF_PAGE_SECONDS", "1")
    (tmp_path / "slow.pdf").write_bytes(data)
    # in the main thread of a fresh interpreter, as a command runs it: a test worker that ran other
    # tests before this one is not a process whose signal state this check should depend on
    child = ("import json, sys, time\nfrom llmkit.rag.read.documents import load_file\n"
             "t = time.monotonic()\ndocs, skipped = load_file(sys.argv[1], open(sys.argv[1], 'rb').read())\n"
             "print(json.dumps({'took': time.monotonic() - t, 'texts': [s.text for s in docs[0].sections],\n"
             "                  'skipped': [[s.source, s.reason] for s in skipped]}))\n")
    r = subprocess.run([sys.executable, "-c", child, str(tmp_path / "slow.pdf")], capture_output=True, text=True,
                       timeout=120, env=llmkit_env(LLMKIT_MAX_PDF_PAGE_SECONDS="1"))
    got = json.loads(r.stdout)
    took, skipped = got["took"], got["skipped"]
    assert got["texts"] == ["The zqfast page."] and took < 4, took  # cut mid-page
    assert [s[0] for s in skipped] == [f"{tmp_path / 'slow.pdf'}#page=2"]
    assert "LLMKIT_MAX_PDF_PAGE_SECONDS" in skipped[0][1] and "one PDF page" in skipped[0][1]
    # off the main thread no timer can interrupt the page: it is finished, measured, and skipped
    out = {}
    th = threading.Thread(target=lambda: out.update(r=load_file(str(tmp_path / "slow.pdf"), data)))
    th.start()
    th.join(60)
    assert [s.source for s in out["r"][1]] == [f"{tmp_path / 'slow.pdf'}#page=2"]
    # through the CLI: the run goes on, the skipped page is counted with its reason
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "slow.pdf").write_bytes(data)
    from conftest import run_subprocess

    r = run_subprocess(["rag", "index", tmp_path / "idx", tmp_path / "in", "--json"], timeout=120, text=True,
                       env={"LLMKIT_MAX_PDF_PAGE_SECONDS": "1"})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rep = json.loads(r.stdout)
    assert rep["docs_added"] == 1 and [s["source"].endswith("slow.pdf#page=2") for s in rep["skipped"]] == [True]
    q = run_cli(["rag", "query", str(tmp_path / "idx"), "zqfast", "--mode", "bm25", "-k", "1", "--jsonl"])
    assert q.exit_code == 0 and json.loads(q.stdout)["meta"]["page"] == 1
