"""Read HF `tokenizer.json` files (BPE, WordPiece and Unigram models); `hf_write` writes them."""

from __future__ import annotations

import json
import unicodedata

from llmkit.errors import BadFileFormat, BadInput
from llmkit.bounded import LimitExceeded, load_json, read_bounded
from llmkit.tokenize import pretok
from llmkit.tokenize.bpe.bpe import BPE
from llmkit.tokenize.formats.hf_write import SUPPORTED_VERSIONS
from llmkit.tokenize.tokenizer import AddedToken, Tokenizer
from llmkit.tokenize.unigram.unigram import Unigram
from llmkit.tokenize.wordpiece.wordpiece import WordPiece


def load_hf_json(path: str) -> Tokenizer:
    """Load a tokenizer.json written by llmkit or HF tokenizers."""
    try:
        data = read_bounded(path, "LLMKIT_MAX_JSON_BYTES", f"'{path}'")
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadFileFormat(f"'{path}' is not a tokenizer.json (not UTF-8 text). Pass a tokenizer.json or a .gguf model.") from None
    except BadInput as e:
        raise BadFileFormat(str(e)) from None
    try:
        d = load_json(text, f"'{path}'")
    except json.JSONDecodeError as e:
        raise BadFileFormat(f"'{path}' is not valid JSON ({e.msg} at line {e.lineno}). Pass an intact tokenizer.json.") from None
    try:
        return from_hf_json(d)
    except LimitExceeded:
        raise
    except BadFileFormat as e:
        raise BadFileFormat(f"'{path}': {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise BadFileFormat(f"'{path}' is not a usable tokenizer.json (bad or missing field {e}). Pass an intact tokenizer.json.") from None


def from_hf_json(d: dict) -> Tokenizer:
    if not isinstance(d, dict) or not isinstance(d.get("model"), dict):
        raise BadFileFormat("no 'model' object found; this is not a tokenizer.json")
    version = d.get("version", "1.0")
    if str(version) not in SUPPORTED_VERSIONS:
        raise BadFileFormat(f"tokenizer.json format version {version!r} is not supported (llmkit reads {', '.join(SUPPORTED_VERSIONS)})")
    m = d["model"]
    mtype = m.get("type") or _guess_type(m)
    norm = _normalizer(d.get("normalizer"))
    added = [AddedToken(str(t["content"]), token_id(t["id"], "added_tokens"), bool(t.get("special", True)))
             for t in d.get("added_tokens") or []]
    if mtype == "BPE":
        vocab = {str(k): token_id(v, "model.vocab") for k, v in m["vocab"].items()}
        merges = [_merge(x, n) for n, x in enumerate(m.get("merges", []), 1)]
        pre = d.get("pre_tokenizer")
        byte_level, pattern, prefix_space, split = _bpe_pretokenizer(pre)
        model = BPE(vocab, merges, byte_level=byte_level, pattern=pattern, add_prefix_space=prefix_space,
                    unk_token=m.get("unk_token"), continuing_subword_prefix=m.get("continuing_subword_prefix"),
                    byte_fallback=bool(m.get("byte_fallback")), split=split,
                    ignore_merges=bool(m.get("ignore_merges")))
        if norm is not None:
            model = _Normalized(model, norm)
    elif mtype == "WordPiece":
        vocab = {str(k): token_id(v, "model.vocab") for k, v in m["vocab"].items()}
        n = d.get("normalizer") or None
        bert = isinstance(n, dict) and n.get("type") == "BertNormalizer"
        lower = bool(n and (n.get("lowercase") if bert else n.get("type") == "Lowercase"))
        if bert and (n.get("strip_accents") or (n.get("strip_accents") is None and lower)):
            norm = _strip_accents_then(lower)
            model = _Normalized(WordPiece(vocab, m.get("unk_token", "[UNK]"), m.get("continuing_subword_prefix", "##"),
                                          m.get("max_input_chars_per_word", 100), False, True), norm)
        else:
            model = WordPiece(vocab, m.get("unk_token", "[UNK]"), m.get("continuing_subword_prefix", "##"),
                              m.get("max_input_chars_per_word", 100), lower, bert)
            if norm is not None and not bert and n.get("type") != "Lowercase":
                model = _Normalized(model, norm)
    elif mtype == "Unigram":
        pieces = [(str(p), float(s)) for p, s in m["vocab"]]
        unk_id = m.get("unk_id")
        if unk_id is not None and not (isinstance(unk_id, int) and 0 <= unk_id < len(pieces)):
            raise BadFileFormat(f"model.unk_id {unk_id!r} is not an id of the {len(pieces)} pieces")
        pre = d.get("pre_tokenizer") or {}
        prepend = _metaspace_prepend(pre)
        model = Unigram(pieces, unk_id, prepend_space=prepend, byte_fallback=bool(m.get("byte_fallback")))
        if norm is not None:
            model = _Normalized(model, norm)
    else:
        raise BadFileFormat(f"model type '{mtype}' is not supported (llmkit reads BPE, WordPiece and Unigram)")
    return Tokenizer(model, added, source="tokenizer.json", template=_template(d.get("post_processor")))


MAX_ID = (1 << 32) - 1  # HF and llama.cpp ids are 32-bit


def token_id(v, where: str) -> int:
    """A token id as HF reads it: an integer in 0 .. 2^32-1 (a float, a string or 5e9 is refused).

    >>> token_id(7, "model.vocab")
    7
    """
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_ID:
        raise BadFileFormat(f"{where} has the id {str(v)[:40]!r}; token ids are integers from 0 to {MAX_ID}")
    return v


def _merge(x, n: int) -> tuple[str, str]:
    """One BPE merge: "a b" or ["a", "b"]; HF refuses any other number of parts."""
    parts = x.split(" ") if isinstance(x, str) else x
    if not isinstance(parts, (list, tuple)) or len(parts) != 2 or not all(isinstance(p, str) for p in parts):
        raise BadFileFormat(f"merge {n} ({json.dumps(x)[:60]}) is not two tokens; each merge is \"a b\" or [\"a\", \"b\"]")
    return parts[0], parts[1]


def _template(pp) -> tuple[list[int], list[int]]:
    """Ids the post-processor puts around a single sequence (TemplateProcessing, Bert, Roberta)."""
    if not pp:
        return [], []
    t = pp.get("type")
    if t in ("BertProcessing", "RobertaProcessing"):
        return [token_id(pp["cls"][1], "post_processor.cls")], [token_id(pp["sep"][1], "post_processor.sep")]
    if t == "TemplateProcessing":
        specials = pp.get("special_tokens", {})
        pre, post, seen_seq = [], [], False
        for piece in pp.get("single", []):
            if "Sequence" in piece:
                seen_seq = True
            elif "SpecialToken" in piece:
                ids = [token_id(i, "post_processor") for i in specials[piece["SpecialToken"]["id"]]["ids"]]
                (post if seen_seq else pre).extend(ids)
        return pre, post
    if t == "Sequence":
        pre, post = [], []
        for sub in pp.get("processors", []):
            a, b = _template(sub)
            pre, post = pre + a, post + b
        return pre, post
    if t == "ByteLevel":
        return [], []
    raise BadFileFormat(f"post-processor '{t}' is not supported")


def _guess_type(m: dict) -> str:
    if "merges" in m:
        return "BPE"
    if isinstance(m.get("vocab"), list):
        return "Unigram"
    return "WordPiece"


def _bpe_pretokenizer(pre) -> tuple[bool, str, bool, str]:
    """(byte_level, regex, add_prefix_space, split mode for non-byte-level models)."""
    if pre is None:
        return False, pretok.GPT2_PATTERN, False, "none"
    t = pre.get("type")
    if t == "ByteLevel":
        return True, pretok.GPT2_PATTERN, bool(pre.get("add_prefix_space", False)), "whitespace"
    if t == "WhitespaceSplit":
        return False, pretok.GPT2_PATTERN, False, "whitespace"
    if t == "Whitespace":
        return False, pretok.GPT2_PATTERN, False, "whitespace_punct"
    if t == "Sequence":
        subs = pre.get("pretokenizers", [])
        splits = [s for s in subs if s.get("type") == "Split"]
        bls = [s for s in subs if s.get("type") == "ByteLevel"]
        if len(splits) == 1 and len(bls) == 1 and len(subs) == 2:
            pat = splits[0]["pattern"]
            pattern = pat.get("Regex") or _escape(pat.get("String", ""))
            return True, pattern, bool(bls[0].get("add_prefix_space", False)), "whitespace"
    raise BadFileFormat(f"pre-tokenizer {json.dumps(pre)[:120]} is not supported")


def _escape(s: str) -> str:
    import regex

    return regex.escape(s)


def _metaspace_prepend(pre: dict) -> bool:
    if pre.get("type") == "Metaspace":
        scheme = pre.get("prepend_scheme")
        if scheme is None:
            return bool(pre.get("add_prefix_space", True))
        return scheme != "never"
    if pre.get("type") == "Sequence":
        for s in pre.get("pretokenizers", []):
            if s.get("type") == "Metaspace":
                return _metaspace_prepend(s)
    raise BadFileFormat(f"Unigram pre-tokenizer {json.dumps(pre)[:120]} is not supported (expected Metaspace)")


def _normalizer(n):
    """A str -> str function for the supported HF normalizers (None when there is none)."""
    if not n:
        return None
    t = n.get("type")
    if t in ("NFC", "NFD", "NFKC", "NFKD"):
        return lambda s, form=t: unicodedata.normalize(form, s)
    if t == "Lowercase":
        return str.lower
    if t == "BertNormalizer":
        return lambda s: pretok.bert_normalize(s, bool(n.get("lowercase")))
    if t == "Sequence":
        fs = [_normalizer(x) for x in n.get("normalizers", [])]
        fs = [f for f in fs if f is not None]

        def run(s):
            for f in fs:
                s = f(s)
            return s

        return run
    if t == "Replace":
        pat = n.get("pattern", {})
        if "String" in pat:
            return lambda s: s.replace(pat["String"], n.get("content", ""))
    if t == "Prepend":
        return lambda s: (n.get("prepend", "") + s) if s else s
    raise BadFileFormat(f"normalizer '{t}' is not supported")


def _strip_accents_then(lower: bool):
    def run(s):
        s = pretok.bert_normalize(s, lower)
        s = unicodedata.normalize("NFD", s)
        return "".join(c for c in s if unicodedata.category(c) != "Mn")

    return run


class _Normalized:
    """Wrap a model so a normalizer runs on the text before it."""

    def __init__(self, model, norm):
        self.inner = model
        self.norm = norm
        self.algorithm = model.algorithm
        self.vocab = model.vocab
        self.id_to_token = model.id_to_token

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(self.norm(text))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        inner = getattr(self.inner, "encode_batch", None)
        if inner is None:
            return [self.encode(t) for t in texts]
        return inner([self.norm(t) for t in texts])

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids)
