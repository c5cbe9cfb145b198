"""Vocabularies for llama.cpp from a `tokenizer.json`, laid out as llama.cpp's own converter lays them.

- WordPiece (BERT): `tokenizer.ggml.model = "bert"`; every piece is rewritten to llama.cpp's
  "phantom space" form: a word-initial piece gets a leading U+2581, a continuation piece loses its
  `##`, control tokens stay as they are (`"the" -> "\u2581the"`, `"##ing" -> "ing"`, `"[CLS]"`).
- Unigram (XLM-RoBERTa): `tokenizer.ggml.model = "t5"` with the scores, token types, the
  precompiled normalisation map and the space-prefix / whitespace flags.

    >>> phantom("the", NORMAL), phantom("##ing", NORMAL), phantom("[CLS]", CONTROL)
    ('\u2581the', 'ing', '[CLS]')
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from llmkit.errors import BadInput

# gguf TokenType values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED = 1, 2, 3, 4, 5


@dataclass
class Vocab:
    model: str  # tokenizer.ggml.model
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    extra: dict = field(default_factory=dict)  # further tokenizer.* keys: add_space_prefix, ...
    charsmap: bytes = b""


def phantom(token: str, kind: int) -> str:
    """llama.cpp's WordPiece spelling of a piece (module doc)."""
    if kind == CONTROL:
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def _added(tok: dict) -> dict[int, dict]:
    return {int(a["id"]): a for a in tok.get("added_tokens", [])}


def _walk(node):
    """Every dict inside a tokenizer.json component (sequences of normalizers, pre-tokenizers)."""
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def wordpiece(tok: dict, vocab_size: int) -> Vocab:
    """A WordPiece tokenizer.json as a llama.cpp "bert" vocabulary."""
    ids = {int(i): t for t, i in tok["model"]["vocab"].items()}
    cased = any(n.get("type") == "BertNormalizer" and n.get("lowercase") is False for n in _walk(tok.get("normalizer")))
    upper = sum(1 for t in ids.values() if t != t.lower() and not t.startswith("["))
    if cased and upper > len(ids) // 100:
        raise BadInput(f"the model's WordPiece tokenizer is cased ({upper} pieces with capitals), but llama.cpp's "
                       "WordPiece tokenizer lower-cases every text, so the converted model would read other tokens "
                       "than it was trained on.")
    added = _added(tok)
    size = max(vocab_size, max(ids) + 1, max(added, default=-1) + 1)
    tokens, types = [], []
    for i in range(size):
        if i in added:
            text, kind = added[i]["content"], CONTROL if added[i].get("special") else USER_DEFINED
        elif i in ids:
            text, kind = ids[i], NORMAL
        else:
            text, kind = f"[PAD{i}]", USER_DEFINED
        tokens.append(phantom(text, kind) if kind != USER_DEFINED else text)
        types.append(kind)
    if len(set(tokens)) != len(tokens):
        raise BadInput("the WordPiece vocabulary has two pieces with the same llama.cpp spelling; llama.cpp "
                       "refuses such a vocabulary.")
    return Vocab("bert", tokens, types)


def unigram(tok: dict, vocab_size: int, tokenizer_config: dict) -> Vocab:
    """A Unigram (SentencePiece) tokenizer.json as a llama.cpp "t5" vocabulary (XLM-RoBERTa family)."""
    model = tok["model"]
    pieces = model["vocab"]
    unk = model.get("unk_id")
    added = _added(tok)
    size = max(vocab_size, len(pieces), max(added, default=-1) + 1)
    tokens, types, scores = [], [], []
    for i in range(size):
        if i < len(pieces):
            text, score = pieces[i][0], float(pieces[i][1])
        elif i in added:
            text, score = added[i]["content"], 0.0
        else:
            tokens.append(f"[PAD{i}]"), types.append(UNUSED), scores.append(-10000.0)
            continue
        if i == unk:
            kind = UNKNOWN
        elif i in added:
            kind = CONTROL if added[i].get("special") else USER_DEFINED
        else:
            kind = NORMAL
        tokens.append(text), types.append(kind), scores.append(score)
    charsmap = b""
    for n in _walk(tok.get("normalizer")):
        if n.get("type") == "Precompiled" and n.get("precompiled_charsmap"):
            charsmap = base64.b64decode(n["precompiled_charsmap"])
    prefix = True
    for n in _walk(tok.get("pre_tokenizer")):
        if n.get("type") == "Metaspace":
            prefix = n.get("prepend_scheme", "always") != "never" and n.get("add_prefix_space", True) is not False
    extra = {"add_space_prefix": prefix,
             "remove_extra_whitespaces": bool(tokenizer_config.get("clean_up_tokenization_spaces", True))}
    return Vocab("t5", tokens, types, scores, extra, charsmap)


def read_vocab(tok: dict, vocab_size: int, tokenizer_config: dict) -> Vocab:
    """The llama.cpp vocabulary for a tokenizer.json (WordPiece or Unigram; others are refused)."""
    kind = tok.get("model", {}).get("type")
    if kind == "WordPiece":
        return wordpiece(tok, vocab_size)
    if kind == "Unigram":
        return unigram(tok, vocab_size, tokenizer_config)
    raise BadInput(f"the model's tokenizer is {kind or 'of an unknown kind'}; the converter handles WordPiece "
                   "(BERT family) and Unigram (XLM-RoBERTa family) tokenizers.")
