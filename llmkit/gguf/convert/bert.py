"""BERT-family encoders (BERT, RoBERTa, XLM-RoBERTa; embedders and sequence classifiers) -> GGUF,
with the architecture `bert`, the tensor names and the metadata keys llama.cpp's converter writes.

Tensor names come from gguf-py's own table (`TensorNameMap`); what is specific here:
- embedders drop BERT's pooler and masked-LM heads (llama.cpp pools by `bert.pooling_type`);
- sequence classifiers (cross-encoders) keep their head for llama.cpp's rank pooling, which computes
  `cls.output(tanh(cls(h[CLS])))`: BERT's pooler becomes `cls` and its classifier `cls.output`;
  RoBERTa's `classifier.dense` / `classifier.out_proj` map the same way;
- RoBERTa-style position tables start at `pad_token_id + 1`; those first rows are cut off;
- vectors, norms, position and token-type tables stay F32; matrices take the output type.
"""

from __future__ import annotations

import numpy as np

from llmkit.errors import BadInput

ENCODERS = {"BertModel", "BertForMaskedLM", "BertForSequenceClassification", "RobertaModel",
            "RobertaForSequenceClassification", "XLMRobertaModel", "XLMRobertaForSequenceClassification",
            "CamembertModel"}
_DROP = ("embeddings.position_ids", "cls.predictions", "cls.seq_relationship", "lm_head")
_KEEP_F32 = ("position_embd", "token_types")
POOLING = {"mean": 1, "cls": 2, "lasttoken": 3}  # gguf PoolingType


def is_classifier(arch: str) -> bool:
    return arch.endswith("ForSequenceClassification")


def _strip(name: str) -> str:
    for prefix in ("bert.", "roberta.", "model."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def gguf_name(name: str, classifier: bool, name_map) -> str | None:
    """The GGUF name of a Hugging Face tensor name (None: not part of the converted model)."""
    name = _strip(name)
    if name.startswith(_DROP):
        return None
    stem, _, suffix = name.rpartition(".")
    suffix = {"gamma": "weight", "beta": "bias"}.get(suffix, suffix)
    if stem == "pooler.dense":
        return f"cls.{suffix}" if classifier else None
    if stem in ("classifier", "classifier.out_proj") and classifier:
        return f"cls.output.{suffix}"
    if stem == "classifier.dense" and classifier:
        return f"cls.{suffix}"
    mapped = name_map.get_name(stem)
    if mapped is None:
        raise BadInput(f"the model has a tensor '{name}' that the BERT converter does not know; it may be a "
                       "variant llama.cpp's bert architecture does not run.")
    return f"{mapped}.{suffix}"


def check_supported(src) -> str:
    """The pooling mode of an encoder the converter can reproduce in llama.cpp (refusal says why)."""
    arch, sc, cfg = src.architecture, src.sentence, src.config
    if arch not in ENCODERS:
        raise BadInput(f"'{src.path}' holds a {arch}; the converter handles BERT-family encoders "
                       f"({', '.join(sorted(ENCODERS))}).")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise BadInput(f"the model uses {cfg['position_embedding_type']} position embeddings; llama.cpp's bert "
                       "architecture has absolute ones only.")
    if cfg.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise BadInput(f"the model's activation is {cfg['hidden_act']}; llama.cpp's bert architecture uses GELU.")
    if is_classifier(arch):
        labels = int(cfg.get("num_labels") or len(cfg.get("id2label") or {}) or 1)
        if labels != 1:
            raise BadInput(f"the classifier has {labels} labels; a re-ranker has one relevance score.")
        return "rank"
    if sc.others or sc.dense:
        raise BadInput(f"the model's sentence-transformers modules include {', '.join(sc.others or ['Dense'])}, "
                       "which llama.cpp's bert architecture does not apply.")
    if len(sc.pooling) != 1 or sc.pooling[0] not in POOLING:
        got = ", ".join(sc.pooling) or "none"
        raise BadInput(f"the model pools by {got}; llama.cpp pools by one of mean, cls or lasttoken.")
    if not sc.include_prompt:
        raise BadInput("the model leaves its prompt out of pooling, which llama.cpp's pooling cannot do.")
    return sc.pooling[0]


def write_bert(src, writer, qtype, vocab, progress=None) -> int:
    """Metadata, vocabulary and tensors of a BERT-family model into a gguf-py GGUFWriter; the tensor count."""
    import gguf

    cfg = src.config
    pooling = check_supported(src)
    classifier = pooling == "rank"
    roberta = cfg.get("model_type") in ("roberta", "xlm-roberta", "camembert")
    offset = int(cfg.get("pad_token_id", 1)) + 1 if roberta else 0
    n_layer = int(cfg["num_hidden_layers"])
    w = writer
    w.add_context_length(int(cfg["max_position_embeddings"]) - offset)
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_block_count(n_layer)
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_layer_norm_eps(float(cfg.get("layer_norm_eps", 1e-12)))
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK if classifier else gguf.PoolingType(POOLING[pooling]))
    labels = cfg.get("id2label") or {}
    if classifier and labels and list(labels.values()) not in (["LABEL_0"], ["LABEL_0", "LABEL_1"]):
        w.add_classifier_output_labels([v for _, v in sorted(labels.items(), key=lambda kv: int(kv[0]))])
    _write_vocab(w, vocab, src, int(cfg.get("type_vocab_size", 1)))
    name_map = gguf.TensorNameMap(gguf.MODEL_ARCH.BERT, n_layer)
    names = src.weights.names()
    written = 0
    for i, hf in enumerate(names):
        out = gguf_name(hf, classifier, name_map)
        if out is None:
            continue
        data = src.weights.get(hf)
        if out.startswith("position_embd") and offset:
            data = data[offset:]
        if out.startswith("token_embd.") and data.shape[0] < len(vocab.tokens):  # padded vocabulary
            data = np.concatenate([data, np.zeros((len(vocab.tokens) - data.shape[0], data.shape[1]), np.float32)])
        _add(w, out, data, qtype)
        written += 1
        if progress:
            progress(i + 1, len(names))
    return written


def _write_vocab(w, vocab, src, type_count: int) -> None:
    import gguf

    w.add_tokenizer_model(vocab.model)
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    if vocab.scores is not None:
        w.add_token_scores(vocab.scores)
    if "add_space_prefix" in vocab.extra:
        w.add_add_space_prefix(vocab.extra["add_space_prefix"])
    w.add_token_type_count(type_count)
    if "remove_extra_whitespaces" in vocab.extra:
        w.add_remove_extra_whitespaces(vocab.extra["remove_extra_whitespaces"])
    if vocab.charsmap:
        w.add_precompiled_charsmap(vocab.charsmap)
    import logging

    log = logging.getLogger("gguf")  # gguf-py warns per special token it has no key for (BERT's cls)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        gguf.SpecialVocab(src.path, n_vocab=len(vocab.tokens)).add_to_gguf(w, quiet=True)
    finally:
        log.setLevel(level)


def _add(w, name: str, data: np.ndarray, qtype) -> None:
    """One tensor at the file's type (F32 for vectors, norms and the position/type tables)."""
    import gguf

    keep = data.ndim < 2 or name.startswith(_KEEP_F32) or name.endswith("_norm.weight")
    if keep or qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, np.ascontiguousarray(data, np.float32))
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, np.ascontiguousarray(data, np.float16))
    elif data.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
        w.add_tensor(name, np.ascontiguousarray(data, np.float16))  # rows that do not fill whole blocks
    else:
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
