"""Hostile inputs beyond single documents: the CLI's one-line refusals, directories with link loops,
named pipes and devices, KV slot headers, `--batch` JSONL lines, a full disk at the write layer, and
a whole `rag index` run over a folder of bad files beside good ones."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import crafted

ROOT = Path(__file__).resolve().parents[2]


def _tests_conftest():
    """tests/conftest.py as a module (imported by path: `conftest` may name another module here)."""
    import importlib.util

    if "llmkit_tests_conftest" not in sys.modules:
        spec = importlib.util.spec_from_file_location("llmkit_tests_conftest", ROOT / "tests" / "conftest.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["llmkit_tests_conftest"] = mod
    return sys.modules["llmkit_tests_conftest"]


def _cli(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    return _tests_conftest().run_subprocess(args, timeout=timeout, env=env, text=True)


@pytest.mark.parametrize("case, words", [
    ("deep100k", "LLMKIT_MAX_JSON_DEPTH"), ("merge_three", "is not two tokens"), ("id_5e9", "from 0 to 4294967295")])
def test_tokenize_refuses_hostile_tokenizer_json_in_one_line(tmp_path, case, words):
    data = dict(crafted.tokenizer(True))[case]
    path = tmp_path / f"{case}.json"
    path.write_bytes(data)
    r = _cli("tokenize", "encode", "-m", str(path), "hello")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("Error: ") and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr


def test_limits_come_from_their_variables(tmp_path):
    path = tmp_path / "d.json"
    path.write_bytes(b"[" * 40 + b"]" * 40)
    r = _cli("tokenize", "encode", "-m", str(path), "x", env={"LLMKIT_MAX_JSON_DEPTH": "20"})
    assert r.returncode == 1 and "limit of 20 levels" in r.stderr and "LLMKIT_MAX_JSON_DEPTH" in r.stderr
    r = _cli("tokenize", "encode", "-m", str(path), "x", env={"LLMKIT_MAX_JSON_DEPTH": "lots"})
    assert r.returncode == 1 and "LLMKIT_MAX_JSON_DEPTH='lots' is not a positive number" in r.stderr


def test_directory_walk_skips_loops_pipes_devices_and_dangling_links(tmp_path):
    from llmkit.rag.read.files import ReadOptions, collect_files, read_input

    d = tmp_path / "docs"
    d.mkdir()
    (d / "ok.md").write_text("# fine\n")
    os.symlink(d / "b.md", d / "a.md")
    os.symlink(d / "a.md", d / "b.md")  # a.md -> b.md -> a.md
    os.symlink(d, d / "loop")  # a directory containing itself
    os.symlink(tmp_path / "gone.txt", d / "dangling.txt")
    os.mkfifo(d / "pipe.txt")  # open() would block for ever
    os.symlink("/dev/zero", d / "zero.txt")  # read() would never end
    files, skipped, _ = collect_files([str(d)], ReadOptions())
    assert [os.path.basename(f) for f in files] == ["ok.md"]
    reasons = {os.path.basename(s.source): s.reason for s in skipped}
    assert reasons["pipe.txt"] == reasons["zero.txt"] == "not a regular file"
    assert "symbolic links" in reasons["a.md"] and "No such file" in reasons["dangling.txt"]
    # named explicitly, a device is read, but no further than the size limit
    data, skip = read_input("/dev/zero")
    assert data == b"" and "LLMKIT_MAX_FILE_BYTES" in skip.reason


def _slot(header: bytes, version: int = 1, n: int | None = None, blob: bytes = b"\x00" * 16) -> bytes:
    return b"LLMKSLOT" + struct.pack("<II", version, len(header) if n is None else n) + header + blob


SLOT_OK = {"format": "llmkit-kv-slot", "version": 1, "model_fingerprint": "f", "model_path": "/m.gguf", "n_ctx": 512,
           "cache_type_k": "f16", "cache_type_v": "f16", "flash_attn": False, "tokens": [1, 2, 3], "created": "now"}


@pytest.mark.parametrize("case", ["magic", "short", "version", "len_huge", "len_past_end", "not_json", "deep",
                                  "not_object", "tokens_str", "tokens_negative", "tokens_huge", "n_ctx_str",
                                  "flash_str", "missing", "badutf8"])
def test_slot_headers_are_refused_with_a_clear_error(tmp_path, case):
    from llmkit.errors import LlmkitError
    from llmkit.kv.slots import read_header

    def hdr(**kw):
        return json.dumps({**SLOT_OK, **kw}).encode()

    data = {"magic": b"NOTASLOT" + b"\x00" * 64, "short": b"LLMKSLOT\x01", "version": _slot(hdr(), version=9),
            "len_huge": _slot(hdr(), n=1 << 31), "len_past_end": _slot(hdr(), n=4096, blob=b""),
            "not_json": _slot(b"{nope"), "deep": _slot(b"[" * 100000 + b"]" * 100000),
            "not_object": _slot(b"[1, 2]"), "tokens_str": _slot(hdr(tokens="abc")),
            "tokens_negative": _slot(hdr(tokens=[1, -5])), "tokens_huge": _slot(hdr(tokens=[1 << 40])),
            "n_ctx_str": _slot(hdr(n_ctx="512")), "flash_str": _slot(hdr(flash_attn="yes")),
            "missing": _slot(json.dumps({"format": "x"}).encode()), "badutf8": _slot(b'{"a": "\xff"}')}[case]
    path = tmp_path / "s.slot"
    path.write_bytes(data)
    with pytest.raises(LlmkitError) as e:
        read_header(str(path))
    assert "\n" not in str(e.value) and "s.slot" in str(e.value)
    (path.parent / "ok.slot").write_bytes(_slot(hdr()))
    assert read_header(str(path.parent / "ok.slot"))[0].tokens == [1, 2, 3]


def test_batch_lines_that_are_hostile_are_reported_not_raised(monkeypatch):
    from llmkit.llama.batch import parse_items

    monkeypatch.setenv("LLMKIT_MAX_LINE_BYTES", "1M")
    lines = ['{"id": 1, "prompt": "ok"}', "[" * 100000 + "]" * 100000, '{"id": 2, "prompt": "' + "x" * (2 << 20) + '"}',
             '{"id": {"a": 1}, "prompt": "x"}', '{"id": 3, "prompt": 5}', '{"id": 4, "messages": [1]}',
             '{"id": 5, "prompt": "x", "temperature": "hot"}', "\x00\x01", '{"id": 6, "prompt": "x", "stop": [1]}',
             '{"id": 1, "prompt": "again"}', '{"id": 7, "prompt": "fine"}']
    items, bad = parse_items(lines)
    assert [i.id for i in items] == [1, 7]
    reasons = {b.line: b.reason for b in bad}
    assert "LLMKIT_MAX_JSON_DEPTH" in reasons[2] and "LLMKIT_MAX_LINE_BYTES" in reasons[3]
    assert len(bad) == len(lines) - 2


def test_a_full_disk_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    """ENOSPC at the write layer (quantized models, slots, index files all go through atomic_file)."""
    import llmkit.io as lio
    from llmkit.errors import BadInput

    target = tmp_path / "model.gguf"
    target.write_bytes(b"previous output")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lio.os, "fsync", full)
    with pytest.raises(BadInput) as e:
        lio.atomic_write_bytes(target, b"new bytes" * 1000)
    assert "No space left on device" in str(e.value) and "\n" not in str(e.value)
    assert target.read_bytes() == b"previous output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]  # no temp file left behind

    monkeypatch.undo()
    ro = tmp_path / "ro"
    ro.mkdir()

    def refuse(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(lio.tempfile, "mkstemp", refuse)
    with pytest.raises(BadInput) as e:
        lio.atomic_write_bytes(ro / "slot.bin", b"x")
    assert "Read-only file system" in str(e.value)


@pytest.mark.slow
def test_one_bad_file_never_stops_an_index_run(tmp_path, monkeypatch):
    """The issue's folder: a 100,000-deep notebook, a zip bomb, broken tables and links beside good
    files. The good ones are indexed (Latin-1 with its accents), each bad one is a counted skip, and a
    second run with more bad files leaves the index as it was."""
    pytest.importorskip("faiss")
    pytest.importorskip("sentence_transformers")
    run_cli = _tests_conftest().run_cli
    monkeypatch.setenv("LLMKIT_MAX_UNZIPPED_BYTES", "64M")
    d = tmp_path / "folder"
    d.mkdir()
    (d / "ok.md").write_text("# Pages\nThe kernel manages zqpages of memory.\n")
    (d / "cafe.md").write_bytes("# Café\n\nUn résumé naïve du zqcafé.\n".encode("latin-1"))
    (d / "deep.ipynb").write_bytes(b"[" * 100000 + b"]" * 100000)
    bomb, crc, size = crafted.zero_bomb(256)
    (d / "bomb.docx").write_bytes(crafted.raw_zip([("word/document.xml", bomb, crc, size)]))
    (d / "table.csv").write_bytes(b'a,b\n"never closed\x00,1\n')
    (d / "blob.txt").write_bytes(b"\x00\x01\x02binary")
    os.mkfifo(d / "pipe.md")
    os.symlink(d / "loop.md", d / "loop.md")
    idx = tmp_path / "idx"
    r = run_cli(["rag", "index", str(idx), str(d), "--json"])
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["docs_added"] == 2
    reasons = {Path(s["source"]).name: s["reason"] for s in report["skipped"]}
    assert set(reasons) == {"deep.ipynb", "bomb.docx", "table.csv", "blob.txt", "pipe.md", "loop.md"}
    assert "LLMKIT_MAX_JSON_DEPTH" in reasons["deep.ipynb"] and "LLMKIT_MAX_UNZIPPED_BYTES" in reasons["bomb.docx"]
    q = run_cli(["rag", "query", str(idx), "zqcafé résumé", "--jsonl", "-k", "1"])
    assert q.exit_code == 0, q.stderr
    hit = json.loads(q.stdout.splitlines()[0])
    assert hit["doc"].endswith("cafe.md") and "résumé naïve" in hit["text"]
    before = sorted(p.name for p in idx.iterdir())
    (d / "worse.epub").write_bytes(b"PK\x03\x04" + os.urandom(200))
    (d / "tok.jsonl").write_bytes(b"[" * 50000 + b"\n" + b'{"id": 1, "te\n')
    r2 = run_cli(["rag", "index", str(idx), str(d), "--json"])
    assert r2.exit_code == 0, r2.stderr
    rep2 = json.loads(r2.stdout)
    assert rep2["docs_unchanged"] == 2 and rep2["docs_removed"] == 0
    assert {"worse.epub", "tok.jsonl"} <= {Path(s["source"].split(":")[0]).name for s in rep2["skipped"]}
    q2 = run_cli(["rag", "query", str(idx), "zqcafé résumé", "--jsonl", "-k", "1"])
    assert json.loads(q2.stdout.splitlines()[0])["text"] == hit["text"]
    assert before  # the index directory is still there, generation files included
