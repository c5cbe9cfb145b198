"""Unigram encoding: the best (Viterbi) segmentation of each word under piece log-probabilities,
with SentencePiece-style '▁' spaces and optional '<0xXX>' byte fallback. Training is in `unigram_train`."""

from __future__ import annotations

import math

from llmkit.errors import BadInput
from llmkit.tokenize import pretok
from llmkit.tokenize.pieces import WordEncoder

UNK_PENALTY = 10.0  # SentencePiece / HF: an unknown character scores min_score - 10


class Unigram(WordEncoder):
    """Viterbi encoder over (piece, log-probability) pairs with SentencePiece-style '▁' spaces."""

    algorithm = "unigram"

    def __init__(self, pieces: list[tuple[str, float]], unk_id: int | None = None, prepend_space: bool = True,
                 byte_fallback: bool = False):
        self.pieces = pieces
        self.vocab = {}
        for i, (p, _) in enumerate(pieces):
            self.vocab.setdefault(p, i)
        self.scores = [s for _, s in pieces]
        self.unk_id = unk_id
        self.prepend_space = prepend_space
        self.byte_fallback = byte_fallback
        self.id_to_token = {i: p for i, (p, _) in enumerate(pieces)}
        self.max_len = max((len(p) for p, _ in pieces), default=1)
        min_score = min((s for s in self.scores), default=0.0)
        self.unk_score = min_score - UNK_PENALTY
        self._cache: dict[str, list[int]] = {}

    def pre_tokenize(self, text: str) -> list[str]:
        return pretok.split_metaspace(text, self.prepend_space)

    def encode_word(self, word: str) -> list[int]:
        """Best segmentation of one word (ties keep the longest final piece, like HF)."""
        n = len(word)
        best = [-math.inf] * (n + 1)
        back: list[tuple[int, int]] = [(-1, -1)] * (n + 1)
        best[0] = 0.0
        vocab, scores, maxlen = self.vocab, self.scores, self.max_len
        for i in range(n):
            if best[i] == -math.inf:
                continue
            bi = best[i]
            single = False
            for j in range(i + 1, min(n, i + maxlen) + 1):
                pid = vocab.get(word[i:j])
                if pid is None:
                    continue
                if j == i + 1:
                    single = True
                s = bi + scores[pid]
                if s > best[j]:
                    best[j] = s
                    back[j] = (i, pid)
            if not single:
                s = bi + self.unk_score
                if s > best[i + 1]:
                    best[i + 1] = s
                    back[i + 1] = (i, -1)
        out: list[int] = []
        j = n
        while j > 0:
            i, pid = back[j]
            if pid == -1:
                if self.byte_fallback:
                    out.extend(reversed([self.vocab[f"<0x{b:02X}>"] for b in word[i:j].encode("utf-8")]))
                elif self.unk_id is None:
                    raise BadInput(f"character {word[i:j]!r} is not in the vocabulary and the tokenizer has no unknown token.")
                elif not out or out[-1] != self.unk_id:  # fuse consecutive unknowns
                    out.append(self.unk_id)
            else:
                out.append(pid)
            j = i
        out.reverse()
        return out

    def decode(self, ids: list[int]) -> str:
        buf = bytearray()
        for i in ids:
            t = self.id_to_token[i]
            if self.byte_fallback and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                buf.append(int(t[3:5], 16))
            else:
                buf += t.encode("utf-8", "surrogatepass")
        text = buf.decode("utf-8", "replace").replace(pretok.SPACE_MARK, " ")
        return text[1:] if self.prepend_space and text.startswith(" ") else text
