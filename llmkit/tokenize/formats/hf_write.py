"""Write a tokenizer as an HF `tokenizer.json` dictionary (BPE, WordPiece and Unigram models).

It reads only the model classes and the tokenizer's added tokens, so the Tokenizer facade can save
itself without importing the reader (`hf`), which builds Tokenizers.
"""

from __future__ import annotations

from llmkit.errors import BadFileFormat
from llmkit.tokenize import pretok
from llmkit.tokenize.bpe.bpe import BPE
from llmkit.tokenize.unigram.unigram import Unigram
from llmkit.tokenize.wordpiece.wordpiece import WordPiece

# llmkit writes HF's own format (its top-level "version" field is the format version); HF refuses
# unknown top-level keys, so no llmkit-specific marker is added.
SUPPORTED_VERSIONS = ("1.0",)


def _added(tok) -> list[dict]:
    return [
        {"id": t.id, "content": t.content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": t.special}
        for t in sorted(tok.added, key=lambda t: t.id)
    ]


def to_hf_json(tok) -> dict:
    """The tokenizer as an HF tokenizer.json dictionary."""
    m = tok.model
    base = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": _added(tok)}
    if isinstance(m, BPE):
        if not m.byte_level:
            pre = {"type": "WhitespaceSplit"}
            dec = None
        else:
            pre = {"type": "ByteLevel", "add_prefix_space": m.add_prefix_space, "trim_offsets": True, "use_regex": True}
            if m.pattern != pretok.GPT2_PATTERN:
                pre = {"type": "Sequence", "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": m.pattern}, "behavior": "Isolated", "invert": False},
                    {"type": "ByteLevel", "add_prefix_space": m.add_prefix_space, "trim_offsets": True, "use_regex": False},
                ]}
            dec = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        vocab = dict(sorted(m.vocab.items(), key=lambda kv: kv[1]))
        model = {"type": "BPE", "dropout": None, "unk_token": m.unk_token, "continuing_subword_prefix": m.continuing_subword_prefix,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": m.byte_fallback, "ignore_merges": False,
                 "vocab": vocab, "merges": [[a, b] for a, b in m.merges]}
        return {**base, "normalizer": None, "pre_tokenizer": pre, "post_processor": None, "decoder": dec, "model": model}
    if isinstance(m, WordPiece):
        norm = ({"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": False,
                 "lowercase": m.lowercase} if m.bert_normalizer else ({"type": "Lowercase"} if m.lowercase else None))
        vocab = dict(sorted(m.vocab.items(), key=lambda kv: kv[1]))
        model = {"type": "WordPiece", "unk_token": m.unk_token, "continuing_subword_prefix": m.prefix,
                 "max_input_chars_per_word": m.max_chars, "vocab": vocab}
        return {**base, "normalizer": norm, "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": None,
                "decoder": {"type": "WordPiece", "prefix": m.prefix, "cleanup": True}, "model": model}
    if isinstance(m, Unigram):
        scheme = "always" if m.prepend_space else "never"
        meta = {"type": "Metaspace", "replacement": pretok.SPACE_MARK, "prepend_scheme": scheme, "split": True}
        model = {"type": "Unigram", "unk_id": m.unk_id, "vocab": [[p, s] for p, s in m.pieces], "byte_fallback": m.byte_fallback}
        return {**base, "normalizer": None, "pre_tokenizer": meta, "post_processor": None, "decoder": dict(meta),
                "model": model}
    raise BadFileFormat(f"a {tok.algorithm} tokenizer cannot be written as tokenizer.json. Use a BPE, WordPiece or Unigram tokenizer.")
