"""Pre-tokenizers and normalizers: how text is cut into words before a subword model sees it."""

from __future__ import annotations

import unicodedata
from functools import lru_cache

# GPT-2's pre-tokenizer pattern (also HF's ByteLevel with use_regex=True).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (space 0x20 -> 'Ġ', newline 0x0A -> 'Ċ').

    >>> bytes_to_unicode()[32], bytes_to_unicode()[10], bytes_to_unicode()[65]
    ('Ġ', 'Ċ', 'A')
    """
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=1)
def _byte_translation() -> dict[int, str]:
    return {b: c for b, c in bytes_to_unicode().items()}


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def to_byte_symbols(text: str) -> str:
    """Map a string to its byte-level form: one printable symbol per UTF-8 byte.

    >>> to_byte_symbols(" hé")
    'ĠhÃ©'
    """
    # latin-1 decoding turns each byte into the code point of the same value; translate maps it.
    return text.encode("utf-8", "surrogatepass").decode("latin-1").translate(_byte_translation())


def from_byte_symbols(symbols: str) -> bytes:
    """Inverse of to_byte_symbols (unknown symbols are encoded as UTF-8 unchanged)."""
    table = _unicode_to_byte()
    out = bytearray()
    for ch in symbols:
        b = table.get(ch)
        if b is None:
            out += ch.encode("utf-8", "surrogatepass")
        else:
            out.append(b)
    return bytes(out)


@lru_cache(maxsize=16)
def compile_pattern(pattern: str):
    """The `regex` module's compiled pattern (imported on first use: the compiled BPE path needs none),
    its \\p{L} and \\p{N} pinned to HF tokenizers' Unicode version (`unicode_classes`)."""
    import regex

    from llmkit.tokenize import unicode_classes

    pinned, v1 = unicode_classes.pin_pattern(pattern)
    return regex.compile(pinned, regex.V1 if v1 else 0)


def split_gpt2(text: str, pattern: str = GPT2_PATTERN, add_prefix_space: bool = False) -> list[str]:
    """Split text into GPT-2 style pre-tokens (a leading space stays attached to the word).

    >>> split_gpt2("Hello world's 42!!  ok")
    ['Hello', ' world', "'s", ' 42', '!!', ' ', ' ok']
    """
    if add_prefix_space and text and not text.startswith(" "):
        text = " " + text
    return compile_pattern(pattern).findall(text)


# ---- BERT-style (WordPiece) -------------------------------------------------------------

_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
WHITESPACE = frozenset(_WS)  # Rust's char::is_whitespace (Unicode White_Space)


def is_punctuation(ch: str) -> bool:
    """BERT's punctuation: ASCII punctuation or any Unicode P* category."""
    o = ord(ch)
    if 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_cjk(ch: str) -> bool:
    """The CJK ideograph ranges BERT isolates as single-character words."""
    o = ord(ch)
    return (
        0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2A6DF or 0x2A700 <= o <= 0x2B73F
        or 0x2B740 <= o <= 0x2B81F or 0x2B920 <= o <= 0x2CEAF or 0xF900 <= o <= 0xFAFF or 0x2F800 <= o <= 0x2FA1F
    )


_WS_CLASS = "".join(f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}" for c in _WS)
_WS_PAT = f"[{_WS_CLASS}]"
_CONTROL_PAT = r"[\x00\ufffd\p{Cc}\p{Cf}\p{Cn}\p{Co}\p{Cs}]"
_CJK_PAT = ("[\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f"
            "\U0002b740-\U0002b81f\U0002b920-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f]")
_PUNCT = r"!-/:-@\[-`{-~\p{P}"
_BERT_SPLIT_PAT = f"[^{_WS_CLASS}{_PUNCT}]+|[{_PUNCT}]"


def bert_normalize(text: str, lowercase: bool = False) -> str:
    """HF BertNormalizer(clean_text, handle_chinese_chars, no accent stripping, optional lowercase).

    Whitespace becomes ' ', control and unassigned characters go, CJK ideographs get spaces around:
    >>> bert_normalize("ab\\tc中")
    'ab c 中 '
    """
    text = compile_pattern(_CONTROL_PAT).sub("", compile_pattern(_WS_PAT).sub(" ", text))
    text = compile_pattern(_CJK_PAT).sub(r" \g<0> ", text)
    return text.lower() if lowercase else text


def bert_normalize_slow(text: str, lowercase: bool = False) -> str:
    """Character-by-character reference for bert_normalize (kept for the equality test)."""
    out = []
    for ch in text:
        if ch in ("\x00", "\ufffd"):
            continue
        if ch in ("\t", "\n", "\r") or ch in WHITESPACE:
            out.append(" ")
            continue
        if unicodedata.category(ch) in ("Cc", "Cf", "Cn", "Co", "Cs"):
            continue
        if is_cjk(ch):
            out.append(" " + ch + " ")
        else:
            out.append(ch)
    text = "".join(out)
    return text.lower() if lowercase else text


def split_bert(text: str) -> list[str]:
    """Split on whitespace and isolate every punctuation character (HF BertPreTokenizer).

    >>> split_bert("Hi, there!  ok")
    ['Hi', ',', 'there', '!', 'ok']
    """
    return compile_pattern(_BERT_SPLIT_PAT).findall(text)


def split_bert_slow(text: str) -> list[str]:
    """Character-by-character reference for split_bert (kept for the equality test)."""
    words: list[str] = []
    cur: list[str] = []
    for ch in text:
        if ch in WHITESPACE:
            if cur:
                words.append("".join(cur))
                cur = []
        elif is_punctuation(ch):
            if cur:
                words.append("".join(cur))
                cur = []
            words.append(ch)
        else:
            cur.append(ch)
    if cur:
        words.append("".join(cur))
    return words


# ---- Metaspace (Unigram / SentencePiece style) ------------------------------------------

SPACE_MARK = "\u2581"  # '▁'


def split_metaspace(text: str, prepend: bool = True) -> list[str]:
    """Replace spaces by '▁', prepend one, and split before every '▁' (HF Metaspace, split=True).

    >>> split_metaspace("Hello  world")
    ['▁Hello', '▁', '▁world']
    """
    text = text.replace(" ", SPACE_MARK)
    if prepend and not text.startswith(SPACE_MARK):
        text = SPACE_MARK + text
    parts = text.split(SPACE_MARK)
    words = [parts[0]] if parts[0] else []
    words.extend([SPACE_MARK + p for p in parts[1:]])
    return words
