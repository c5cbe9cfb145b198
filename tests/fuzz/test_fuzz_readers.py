"""Every reader against hostile files: crafted cases (tests/fixtures/fuzz/ plus big ones generated
here: zip bombs, 100,000-deep nesting, files at the size limits) and hypothesis mutations of a valid
file per format, each format in its own process so its peak RSS is measured alone.

Asserted for every file: it is read, or skipped with a reason, or refused with an LlmkitError (one
line at the CLI); nothing else escapes; each file within TIME_S; the process within PEAK_MB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import crafted
import figures as fuzz_figures

HERE = Path(__file__).resolve().parent
TIME_S = 15.0  # per file, on a busy 2-core machine (the worst seen alone: ~7 s, a 100k-page PDF)
PEAK_MB = 600  # per format process (the worst seen: ~220 MB, a 50k-cell notebook)
MUTATIONS = 60  # hypothesis examples per format (derandomized: the same files every run)
FORMATS = list(crafted.FORMATS)


@pytest.fixture
def figures(request) -> dict:
    return fuzz_figures.register(request.config)


def _run(args: list[str], timeout: int = 300) -> list[dict]:
    p = subprocess.run([sys.executable, str(HERE / "driver.py"), *args], capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert p.returncode == 0, p.stderr[-3000:]
    return [json.loads(line) for line in p.stdout.splitlines()]


def _needs(fmt: str) -> None:
    mods = {"docx": ["docx"], "epub": ["ebooklib"], "pdf": ["pypdf"], "code": ["tree_sitter"]}.get(fmt, [])
    for m in mods:
        pytest.importorskip(m)


@pytest.mark.parametrize("fmt", FORMATS)
def test_crafted_files_are_read_skipped_or_refused(fmt, tmp_path, figures):
    _needs(fmt)
    suffix, gen = crafted.FORMATS[fmt]
    corpus = crafted.FIXTURES / fmt
    on_disk = {p.name for p in corpus.iterdir()}
    for p in corpus.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    small = 0
    for name, data in gen(True):
        if len(data) > crafted.SMALL:
            (tmp_path / f"{name}{suffix}").write_bytes(data)
        else:
            small += 1
            assert f"{name}{suffix}" in on_disk, f"{name}{suffix} is missing from {corpus}: run tests/fuzz/crafted.py"
    rows = _run(["read", fmt, str(tmp_path)])
    summary, cases = rows[-1], {r["case"]: r for r in rows[:-1]}
    assert len(cases) == len(list(tmp_path.iterdir()))
    for name, r in cases.items():
        assert r["outcome"] in ("docs", "skipped", "refused"), (name, r.get("error"), r.get("tb"))
        if r["outcome"] == "refused":
            assert r["one_line"] and "Traceback" not in r["message"], (name, r["message"])
        assert r["seconds"] < TIME_S, (name, r["seconds"])
    assert summary["peak_mb"] < PEAK_MB, summary
    assert cases[f"seed{suffix}"]["outcome"] == "docs"
    f = figures.setdefault(fmt, {})
    f.update(crafted=len(cases), peak_mb=max(f.get("peak_mb", 0), summary["peak_mb"]),
             worst_s=max([f.get("worst_s", 0)] + [r["seconds"] for r in cases.values()]))
    _expected(fmt, suffix, cases)


def _reason(r: dict) -> str:
    return r.get("reason") or r.get("message") or ""


def _expected(fmt: str, suffix: str, cases: dict) -> None:
    """The cases the issue names end the way it asks."""
    if fmt in ("ipynb", "tokenizer"):
        assert "LLMKIT_MAX_JSON_DEPTH" in _reason(cases[f"deep100k{suffix}"])
    if fmt == "jsonl":  # the good lines stay; the deep one is a counted skip
        r = cases["deep100k.jsonl"]
        assert r["outcome"] == "docs" and any("LLMKIT_MAX_JSON_DEPTH" in x for x in r["skipped"]), r
    if fmt in ("docx", "epub"):
        assert "LLMKIT_MAX_UNZIPPED_BYTES" in _reason(cases[f"bomb2g{suffix}"])
        assert "LLMKIT_MAX_ZIP_ENTRIES" in _reason(cases[f"entries30k{suffix}"])
        assert cases[f"bomb2g{suffix}"]["seconds"] < 5
    if fmt == "tokenizer":
        accepted = {n for n, r in cases.items() if r["outcome"] == "docs"}
        assert accepted == {"seed.json", "normalizer_seq_deep.json"}, accepted
        assert "not two tokens" in _reason(cases["merge_three.json"])
        assert "4294967295" in _reason(cases["id_5e9.json"])
    if fmt == "markdown":
        for name in ("cp1252.md", "latin1.md", "utf16.md", "bom.md"):
            assert cases[name]["outcome"] == "docs", (name, cases[name])
        assert cases["nul.md"] == {**cases["nul.md"], "outcome": "skipped", "reason": "binary"}
        assert cases["random.md"]["outcome"] == "skipped"
        assert "LLMKIT_MAX_FILE_BYTES" in _reason(cases["over_cap.md"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_mutated_files_are_read_skipped_or_refused(fmt, figures):
    pytest.importorskip("hypothesis")
    _needs(fmt)
    (s,) = _run(["mutate", fmt, str(MUTATIONS)])
    assert s["examples"] >= MUTATIONS * 0.9 and not s["escaped"], s["escaped"]
    assert s["worst_s"] < TIME_S and s["peak_mb"] < PEAK_MB, s
    f = figures.setdefault(fmt, {})
    f.update(mutated=s["examples"], peak_mb=max(f.get("peak_mb", 0), s["peak_mb"]),
             worst_s=max(f.get("worst_s", 0), s["worst_s"]))
