"""The Tokenizer facade: one subword model plus added (special) tokens, encode/decode/save."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from llmkit.errors import BadInput


@dataclass
class AddedToken:
    content: str
    id: int
    special: bool = True


class Tokenizer:
    """A subword model (BPE, WordPiece, Unigram, SPM) with added tokens matched verbatim first."""

    def __init__(self, model, added_tokens: Iterable[AddedToken] = (), source: str = "llmkit",
                 template: tuple[list[int], list[int]] = ([], [])):
        self.model = model
        self.template = template  # ids added before/after every encoded text (HF post-processor)
        self.added = list(added_tokens)
        self.source = source
        self._added_by_content = {t.content: t.id for t in self.added}
        self._added_ids = {t.id: t for t in self.added}
        self._split = None
        if self.added:
            alts = sorted((t.content for t in self.added if t.content), key=len, reverse=True)
            if alts:
                import regex

                self._split = regex.compile("(" + "|".join(regex.escape(a) for a in alts) + ")")
        ids = list(model.id_to_token) + [t.id for t in self.added]
        self.vocab_size = (max(ids) + 1) if ids else 0

    @property
    def added_pattern(self):
        """The compiled pattern that cuts a text at its added tokens (`split` gives the model's text at
        even positions, the added tokens at odd ones), or None when there are none to match."""
        return self._split

    @property
    def algorithm(self) -> str:
        return self.model.algorithm

    @property
    def special_tokens(self) -> list[str]:
        return [t.content for t in self.added if t.special]

    def id_to_token(self, i: int) -> str:
        t = self._added_ids.get(i)
        if t is not None:
            return t.content
        tok = self.model.id_to_token.get(i)
        if tok is None:
            raise BadInput(f"token id {i} is out of range for this tokenizer (vocabulary size {self.vocab_size}).")
        return tok

    def token_to_id(self, token: str) -> int | None:
        i = self._added_by_content.get(token)
        return i if i is not None else self.model.vocab.get(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids for `text`; added tokens are matched verbatim before the model runs, and the
        post-processor's special tokens (e.g. BERT's [CLS] ... [SEP]) wrap the result."""
        ids = self._encode(text)
        pre, post = self.template
        if add_special_tokens and (pre or post):
            return pre + ids + post
        return ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """encode() of each text, with the model's batch path (one call into compiled kernels) when it has one."""
        batch = getattr(self.model, "encode_batch", None)
        if batch is None:
            return [self.encode(t, add_special_tokens) for t in texts]
        if self._split is None:
            out = batch(texts)
        else:
            out = self._encode_batch_added(texts, batch)
        pre, post = self.template
        if add_special_tokens and (pre or post):
            return [pre + ids + post for ids in out]
        return out

    def _encode_batch_added(self, texts: list[str], batch) -> list[list[int]]:
        """Split every text at the added tokens, encode all the pieces between them in one batch."""
        plans, pieces = [], []
        for text in texts:
            plan = []
            for k, part in enumerate(self._split.split(text)):
                if not part:
                    continue
                if k % 2 == 1:
                    plan.append(self._added_by_content[part])
                else:
                    plan.append(None)
                    pieces.append(part)
            plans.append(plan)
        encoded = iter(batch(pieces))
        out = []
        for plan in plans:
            ids: list[int] = []
            for x in plan:
                if x is None:
                    ids.extend(next(encoded))
                else:
                    ids.append(x)
            out.append(ids)
        return out

    def _encode(self, text: str) -> list[int]:
        if self._split is None:
            return self.model.encode(text)
        return self._encode_batch_added([text], lambda pieces: [self.model.encode(p) for p in pieces])[0]

    def tokens(self, ids: list[int]) -> list[str]:
        return [self.id_to_token(i) for i in ids]

    def check_ids(self, ids: list[int]) -> None:
        for i in ids:
            if not isinstance(i, int) or i < 0 or (i not in self._added_ids and i not in self.model.id_to_token):
                raise BadInput(
                    f"token id {i} is out of range for this tokenizer (valid ids: 0..{self.vocab_size - 1})."
                )

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        """Text for ids; added tokens are written out verbatim (or dropped with skip_special)."""
        self.check_ids(ids)
        parts: list[str] = []
        run: list[int] = []
        for i in ids:
            t = self._added_ids.get(i)
            if t is None:
                run.append(i)
                continue
            if run:
                parts.append(self.model.decode(run))
                run = []
            if not (skip_special and t.special):
                parts.append(t.content)
        if run:
            parts.append(self.model.decode(run))
        return "".join(parts)

    def to_hf(self) -> dict:
        from llmkit.tokenize.formats.hf_write import to_hf_json

        return to_hf_json(self)

    def save(self, path: str) -> None:
        """Write an HF-compatible tokenizer.json atomically."""
        from llmkit.io import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_hf(), ensure_ascii=False, indent=1) + "\n")
