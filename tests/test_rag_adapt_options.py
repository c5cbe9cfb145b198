"""`rag adapt --epochs/--minutes/--hard-negatives` asserted on the report (steps taken) and on the
mined negatives (never the positive's own document), on a tiny random model and 60 real paragraphs."""

import json
import math

import pytest

from conftest import run_cli

pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def idx(tmp_path_factory, kernel_docs):
    from tinyst import write_tiny_models

    root = tmp_path_factory.mktemp("adaptopts")
    st = write_tiny_models(root)["st32"]
    paras = [p.strip() for p in kernel_docs.read_text(encoding="utf-8").split("\n\n")
             if 300 < len(p.strip()) < 800 and p.count(". ") >= 2][:60]
    (root / "docs.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(paras)))
    r = run_cli(["rag", "index", str(root / "idx"), str(root / "docs.jsonl"), "--model", str(st)])
    assert r.exit_code == 0, r.stderr
    return root / "idx"


def adapt(idx, out, *extra):
    r = run_cli(["rag", "adapt", str(idx), "-o", str(out), "--pairs", "60", "--batch-size", "16", "--no-promote",
                 "--json", *extra])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_epochs_set_the_steps(idx, tmp_path):
    rep = adapt(idx, tmp_path / "a", "--epochs", "2", "--minutes", "30")
    assert rep["steps"] == 2 * math.ceil(rep["pairs"] / 16)


def test_minutes_stop_training_and_hard_negatives_are_mined(idx, tmp_path, monkeypatch):
    import llmkit.rag.evaluate.adapt as adapt_mod

    mined = []
    real = adapt_mod._negatives

    def spy(index, queries, emb, progress=None):
        negs = real(index, queries, emb, progress)
        mined.append((index, queries, negs))
        return negs

    monkeypatch.setattr(adapt_mod, "_negatives", spy)
    rep = adapt(idx, tmp_path / "b", "--hard-negatives", "--epochs", "3", "--minutes", "0.0001")
    assert rep["steps"] == 1  # the time budget ends training after its first step, well before 3 epochs
    ((index, queries, negs),) = mined
    assert len(negs) == len(queries) == rep["pairs"] and sum(n >= 0 for n in negs) >= len(negs) // 2
    doc = dict(index.con.execute("SELECT id, doc_id FROM chunks").fetchall())
    for q, n in zip(queries, negs):
        if n >= 0:
            assert n != q.row and doc[int(index.rows[n])] != doc[int(index.rows[q.row])]
