"""Model directories -> GGUF files that llama.cpp runs, without torch or transformers.

    source.py  a sentence-transformers / Hugging Face directory read from its JSON files and
               safetensors weights
    vocab.py   tokenizer.json -> llama.cpp vocabularies (WordPiece "bert", Unigram "t5")
    bert.py    BERT-family encoders: embedders and cross-encoders (sequence classifiers)

Besides llama.cpp's own keys, a converted embedder records what sentence-transformers does around the
transformer that llama.cpp has no key for (`ST_KEYS`): the maximum sequence length, whether vectors
are normalised, and the query/document prompts. llama.cpp ignores these keys; llmkit reads them.

May import: llmkit.errors, llmkit.io, numpy, and gguf-py (the writer and its name tables).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from llmkit.errors import MissingDependency, OptionError

ST_KEYS = {"max_seq_length": "sentence_transformers.max_seq_length",
           "normalize": "sentence_transformers.normalize",
           "query": "sentence_transformers.prompt.query",
           "document": "sentence_transformers.prompt.document"}
OUT_TYPES = ("f32", "f16", "q8_0")


@dataclass
class ConvertReport:
    path: str
    architecture: str
    kind: str  # "embedder" | "re-ranker"
    pooling: str
    tensors: int
    vocab: int
    bytes: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def convert(src_dir: str, out: str, outtype: str = "f16", progress=None) -> ConvertReport:
    """Convert a BERT-family model directory (embedder or cross-encoder) to a GGUF file at `out`."""
    try:
        import gguf
    except ImportError:
        raise MissingDependency("gguf", "llama") from None
    from llmkit.gguf.convert.bert import check_supported, write_bert
    from llmkit.gguf.convert.source import open_source
    from llmkit.gguf.convert.vocab import read_vocab

    if outtype not in OUT_TYPES:
        raise OptionError("unknown output type {value!r} ({outtype}); use one of: {types}.", value=outtype,
                          types=", ".join(OUT_TYPES))
    src = open_source(src_dir)
    pooling = check_supported(src)
    vocab = read_vocab(src.tokenizer, int(src.config.get("vocab_size", 0)), src.tokenizer_config)
    qtype = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
    tmp = f"{out}.{os.getpid()}.tmp"
    w = gguf.GGUFWriter(tmp, "bert")
    try:
        w.add_name(_model_name(src))
        w.add_file_type(ftype)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        n_tensors = write_bert(src, w, qtype, vocab, progress)
        if pooling != "rank":
            sc = src.sentence
            if sc.max_seq_length:
                w.add_uint32(ST_KEYS["max_seq_length"], sc.max_seq_length)
            w.add_bool(ST_KEYS["normalize"], sc.normalize)
            for kind in ("query", "document"):
                text = sc.prompts.get(kind) or (sc.prompts.get("passage") if kind == "document" else None)
                if text:
                    w.add_string(ST_KEYS[kind], text)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return ConvertReport(out, src.architecture, "re-ranker" if pooling == "rank" else "embedder", pooling,
                         n_tensors, len(vocab.tokens), os.path.getsize(out))


def _model_name(src) -> str:
    name = src.config.get("_name_or_path") or ""
    base = os.path.basename(os.path.normpath(src.path))
    return (name.rsplit("/", 1)[-1] if name and not os.path.isabs(name) else "") or base
