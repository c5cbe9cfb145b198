"""Bytes -> text for documents: UTF-8 (with or without a BOM), UTF-16/32 with a BOM, Windows-1252 /
Latin-1, and what charset-normalizer recognises (Cyrillic, CJK, ... when it is installed). A file is
binary only when it really is: NUL bytes without a UTF-16/32 BOM, control characters that no text
has, or bytes that no encoding explains.
"""

from __future__ import annotations

import codecs
import re

_BOMS = [(codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")]
# C0 controls other than tab, newline, form feed, carriage return, escape (ANSI colours in logs)
_CONTROL = re.compile(r"[\x01-\x08\x0b\x0e-\x1a\x1c-\x1f\x7f]")
_NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]{3,}")
_WIDE = ("utf_16", "utf_32", "utf-16", "utf-32")


class NotText(ValueError):
    """The bytes are not text; the message is the reason a caller reports ('binary', ...)."""


def decode_text(data: bytes) -> tuple[str, str]:
    """(text, encoding name) of a document's bytes, or NotText.

    >>> decode_text("Café naïve".encode("cp1252"))
    ('Café naïve', 'cp1252')
    >>> decode_text(b"\\xef\\xbb\\xbfhi")
    ('hi', 'utf-8-sig')
    """
    for bom, enc in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(enc), enc
            except UnicodeDecodeError as e:
                raise NotText(f"invalid {enc} (byte {e.start})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        if "\x00" in text:
            raise NotText("binary")
        return text, "utf-8"
    if b"\x00" in data:
        raise NotText("binary")
    text = _western(data)
    if text is not None:
        return text, "cp1252"
    guess = _normalizer_guess(data)
    if guess is not None:
        return guess
    raise NotText("binary")


def _few_controls(text: str) -> bool:
    """Text has almost no C0 control characters; binary data decoded as text has many."""
    return len(_CONTROL.findall(text[:1 << 20])) <= max(2, len(text[:1 << 20]) // 1000)


def _western(data: bytes) -> str | None:
    """Windows-1252 (a superset of Latin-1's printable characters) when the non-ASCII characters
    stand alone in ASCII words (Café, Größe, “quotes”), not in runs (Cyrillic or CJK read as
    1252 gives 'Ïðèâåò': runs of accented letters)."""
    try:
        text = data.decode("cp1252")
    except UnicodeDecodeError:
        try:
            text = data.decode("latin-1")  # 0x81, 0x8d, 0x8f, 0x90, 0x9d: C1 controls in Latin-1
        except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
            return None
        if re.search(r"[\x80-\x9f]", text):
            return None
    if not _few_controls(text):
        return None
    non_ascii = len(text) - len(text.encode("ascii", "ignore"))
    in_runs = sum(len(m) for m in _NON_ASCII_RUN.findall(text))
    return text if non_ascii and in_runs <= 0.2 * non_ascii else None


def _normalizer_guess(data: bytes) -> tuple[str, str] | None:
    """charset-normalizer's best reading, when it is installed and sure enough (no UTF-16/32
    without a BOM: without NUL bytes that guess is always wrong)."""
    try:
        import charset_normalizer
    except ImportError:
        return None
    best = charset_normalizer.from_bytes(data).best()
    if best is None or best.encoding.lower().startswith(_WIDE):
        return None
    text = str(best)
    return (text, best.encoding) if _few_controls(text) else None
