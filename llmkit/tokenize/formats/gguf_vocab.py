"""Tokenizers from a GGUF model's vocabulary (`tokenizer.ggml.*`), giving llama.cpp's ids.

Two vocabulary kinds are supported: 'gpt2' (byte-level BPE with ranked merges and a
pre-tokenizer chosen by `tokenizer.ggml.pre`) and 'llama' (SentencePiece-style: pieces with
scores, bigrams merged by highest score, '<0xXX>' byte fallback).
"""

from __future__ import annotations

import heapq

from llmkit.errors import BadFileFormat, BadInput
from llmkit.gguf.reader import read_gguf
from llmkit.tokenize import pretok
from llmkit.tokenize.bpe.bpe import BPE
from llmkit.tokenize.tokenizer import AddedToken, Tokenizer

# llama.cpp token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2_NO_TAIL = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# tokenizer.ggml.pre -> the regexes llama.cpp applies in turn (text between matches is kept too)
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2_NO_TAIL, r"\p{N}+", r"[0-9][0-9][0-9]"]
PRE_PATTERNS = {
    "default": _DEFAULT, "gpt-2": [pretok.GPT2_PATTERN], "gpt2": [pretok.GPT2_PATTERN],
    "llama3": [_LLAMA3], "llama-bpe": [_LLAMA3], "llama-v3": [_LLAMA3],
    "qwen2": [_QWEN2], "deepseek-r1-qwen": [_QWEN2],
    "smollm": [r"\p{N}", _GPT2_NO_TAIL], "starcoder": [r"\p{N}", _GPT2_NO_TAIL], "refact": [r"\p{N}", _GPT2_NO_TAIL],
}


def split_multi(text: str, patterns: list[str]) -> list[str]:
    """Apply regexes in turn; each splits every fragment into matches and the text between them.

    >>> split_multi("abc 123", [r"\\p{N}", r" ?\\p{L}+"])
    ['abc', ' ', '1', '2', '3']
    """
    frags = [text]
    for pat in patterns:
        rx = pretok.compile_pattern(pat)
        out = []
        for f in frags:
            pos = 0
            for m in rx.finditer(f):
                if m.start() > pos:
                    out.append(f[pos:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(f):
                out.append(f[pos:])
        frags = out
    return frags


class GGUFBPE(BPE):
    """Byte-level BPE with llama.cpp's multi-regex pre-tokenizers."""

    def __init__(self, vocab, merges, patterns: list[str]):
        super().__init__(vocab, merges, byte_level=True, pattern=patterns[-1])
        self.patterns = patterns

    def pre_tokenize(self, text: str) -> list[str]:
        if len(self.patterns) == 1:
            return pretok.split_gpt2(text, self.patterns[0])
        return split_multi(text, self.patterns)


class SPM:
    """llama.cpp's SentencePiece tokenizer: merge the adjacent pair whose joined text is the
    highest-scoring piece (ties: leftmost), then fall back to '<0xXX>' bytes for unknown text."""

    algorithm = "spm"

    def __init__(self, tokens: list[str], scores: list[float], types: list[int], add_space_prefix: bool = True,
                 unk_id: int | None = None):
        self.tokens = tokens
        self.scores = scores
        self.types = types
        self.vocab = {}
        for i, t in enumerate(tokens):
            self.vocab.setdefault(t, i)
        self.id_to_token = dict(enumerate(tokens))
        self.add_space_prefix = add_space_prefix
        self.unk_id = unk_id
        self.byte_ids = {}
        for i, t in enumerate(tokens):
            if types[i] == BYTE and len(t) == 6 and t.startswith("<0x"):
                self.byte_ids[int(t[3:5], 16)] = i

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        if self.add_space_prefix:
            text = " " + text
        text = text.replace(" ", pretok.SPACE_MARK)
        syms = list(text)  # symbol texts; merged symbols grow, consumed ones become ""
        prev = list(range(-1, len(syms) - 1))
        nxt = list(range(1, len(syms) + 1))
        nxt[-1] = -1
        heap: list[tuple[float, int, str]] = []
        rev: dict[str, tuple[str, str]] = {}
        vocab, scores = self.vocab, self.scores

        def add(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            s = syms[left] + syms[right]
            i = vocab.get(s)
            if i is None:
                return
            heapq.heappush(heap, (-scores[i], left, s))
            rev[s] = (syms[left], syms[right])

        for i in range(1, len(syms)):
            add(i - 1, i)
        while heap:
            _, left, s = heapq.heappop(heap)
            right = nxt[left]
            if right == -1 or not syms[left] or not syms[right] or syms[left] + syms[right] != s:
                continue  # outdated entry
            syms[left] = s
            syms[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] != -1:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])
        out: list[int] = []
        i = 0
        while i != -1:
            self._resegment(syms[i], rev, out)
            i = nxt[i]
        return out

    def _resegment(self, s: str, rev: dict, out: list[int]) -> None:
        stack = [s]
        while stack:
            t = stack.pop()
            i = self.vocab.get(t)
            if i is not None:
                out.append(i)
                continue
            pair = rev.get(t)
            if pair is not None:
                stack.append(pair[1])
                stack.append(pair[0])
                continue
            for b in t.encode("utf-8"):
                j = self.byte_ids.get(b, self.unk_id)
                if j is None:
                    raise BadInput(f"character {t!r} is not in the vocabulary, which has no byte tokens or unknown token.")
                out.append(j)

    def decode(self, ids: list[int]) -> str:
        buf = bytearray()
        for i in ids:
            t = self.tokens[i]
            if self.types[i] == BYTE and len(t) == 6:
                buf.append(int(t[3:5], 16))
            elif self.types[i] == CONTROL:
                continue
            else:
                buf += t.replace(pretok.SPACE_MARK, " ").encode("utf-8")
        text = buf.decode("utf-8", "replace")
        return text[1:] if self.add_space_prefix and text.startswith(" ") else text


def load_gguf_tokenizer(path: str) -> Tokenizer:
    """Build the tokenizer stored in a GGUF model's metadata."""
    g = read_gguf(path, tensors=False)
    model = g.get("tokenizer.ggml.model")
    tokens = g.get("tokenizer.ggml.tokens")
    if model is None or tokens is None:
        raise BadFileFormat(f"'{path}' has no tokenizer vocabulary (tokenizer.ggml.model/tokens missing). Use a GGUF model that includes one.")
    types = g.get("tokenizer.ggml.token_type")
    types = [int(t) for t in types] if types is not None else [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise BadFileFormat(f"'{path}': tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens.")
    added = [AddedToken(t, i, special=False) for i, t in enumerate(tokens) if types[i] == USER_DEFINED]
    if model == "gpt2":
        merges = g.get("tokenizer.ggml.merges")
        if merges is None:
            raise BadFileFormat(f"'{path}' is a gpt2-type vocabulary without tokenizer.ggml.merges.")
        pre = g.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_PATTERNS:
            raise BadFileFormat(f"'{path}' uses pre-tokenizer '{pre}', which llmkit does not know yet "
                                f"(known: {', '.join(sorted(PRE_PATTERNS))}).")
        vocab = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        return Tokenizer(GGUFBPE(vocab, pairs, PRE_PATTERNS[pre]), added, source="gguf")
    if model == "llama":
        scores = g.get("tokenizer.ggml.scores")
        scores = [float(s) for s in scores] if scores is not None else [0.0] * len(tokens)
        if len(scores) != len(tokens):
            raise BadFileFormat(f"'{path}': tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens.")
        unk = g.get("tokenizer.ggml.unknown_token_id")
        spm = SPM(list(tokens), scores, types, bool(g.get("tokenizer.ggml.add_space_prefix", True)),
                  int(unk) if unk is not None else None)
        return Tokenizer(spm, added, source="gguf")
    raise BadFileFormat(f"'{path}' uses tokenizer model '{model}'; llmkit reads 'gpt2' (BPE) and 'llama' (SentencePiece).")
