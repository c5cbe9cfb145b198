"""A local GGUF model (through llmkit's llama.cpp driver) for the LLM steps of RAG: query rewriting,
sub-queries, HyDE, yes/no relevance for re-ranking, token surprisal for prompt compression, answers."""

from __future__ import annotations

import re
from typing import Callable

import numpy as np


class LocalLLM:
    def __init__(self, path: str | None = None, n_ctx: int = 2048, threads: int | None = None):
        from llmkit.llama import runtime

        self.path = path or runtime.default_model_path()
        self.model = runtime.open_model(self.path, runtime.ModelOptions(n_ctx=n_ctx, n_threads=threads))
        self.bos = runtime.add_bos(self.model)
        self.n_ctx = min(self.model.n_ctx(), len(self.model.input_ids))

    def tokens(self, text: str, special: bool = False) -> list[int]:
        return self.model.tokenize(text.encode("utf-8"), add_bos=self.bos, special=special)

    def count_tokens(self, text: str) -> int:
        return len(self.model.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def prompt(self, user: str, system: str | None = None) -> tuple[str, bool]:
        """The chat-formatted prompt when the model has a template, else the plain text."""
        if self.model.metadata.get("tokenizer.chat_template"):
            from llmkit.llama.chat import chat_prompt

            return chat_prompt(self.model, user, system), True
        return user + "\n", False

    def complete(self, user: str, n_predict: int = 128, system: str | None = None,
                 on_text: Callable[[str], None] | None = None, stop: tuple[str, ...] = ()) -> str:
        """Greedy completion of a chat turn (deterministic, so retrieval results are repeatable)."""
        from llmkit.llama.generate import Generator
        from llmkit.llama.sampling import SamplingParams

        text, special = self.prompt(user, system)
        toks = self.tokens(text, special)
        room = self.n_ctx - n_predict - 1
        if len(toks) > room:  # keep the end of an over-long prompt: the question comes last
            toks = toks[:1] + toks[len(toks) - room + 1:] if self.bos else toks[-room:]
        # greedy keeps retrieval repeatable; a mild repeat penalty stops small models from looping
        gen = Generator(self.model, SamplingParams(temp=0.0, repeat_penalty=1.1))
        out, _ = gen.run(toks, n_predict, stop, on_text=on_text)
        return out.strip()

    def lines(self, user: str, n: int, n_predict: int = 160) -> list[str]:
        """Up to n non-empty lines of a completion, list markers and quotes removed."""
        out = []
        for line in self.complete(user, n_predict).split("\n"):
            line = re.sub(r"^\s*(?:[-*•]|\d+[.)]|Q\d*:|Query\s*\d*:)\s*", "", line).strip().strip("\"'")
            if len(line) > 2 and line not in out:
                out.append(line)
        return out[:n]

    def yes_no(self, prompt: str) -> float:
        """log P(yes) - log P(no) for the next token after the prompt (chat-formatted)."""
        from llmkit.llama.cache import common_prefix, eval_logits

        text, special = self.prompt(prompt)
        toks = self.tokens(text, special)[-(self.n_ctx - 1):]
        m = self.model
        have = [int(t) for t in m.input_ids[:m.n_tokens]]
        keep = common_prefix(have, toks[:-1])  # the shared instruction + query prefix stays in the KV cache
        m.n_tokens = keep
        logits = eval_logits(m, toks[keep:])[0].astype(np.float64)
        yes, no = self._answer_ids()
        return float(np.logaddexp.reduce(logits[yes]) - np.logaddexp.reduce(logits[no]))

    def _answer_ids(self):
        if not hasattr(self, "_yn"):
            ids = {}
            for word in ("yes", "no"):
                got = set()
                for v in (word, word.capitalize(), " " + word, " " + word.capitalize()):
                    t = self.model.tokenize(v.encode(), add_bos=False, special=False)
                    if t:
                        got.add(t[0])
                ids[word] = sorted(got)
            self._yn = (ids["yes"], ids["no"])
        return self._yn

    def surprisal(self, text: str) -> tuple[list[int], np.ndarray]:
        """Tokens of the text and each one's surprisal -log p(token | earlier tokens) in nats
        (the first token of each window gets +inf: nothing predicts it, so it is never dropped)."""
        from llmkit.llama.cache import eval_logits

        toks = self.model.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        out = np.full(len(toks), np.inf)
        m = self.model
        win = max(16, self.n_ctx - 2)
        for lo in range(0, len(toks), win):
            seq = ([m.token_bos()] if self.bos else []) + toks[lo:lo + win]
            off = 1 if self.bos else 0
            m.reset()
            # a batch at a time, so the logits held are one batch's, not the window's
            for b in range(0, len(seq), m.n_batch):
                logits = eval_logits(m, seq[b:b + m.n_batch], len(seq[b:b + m.n_batch])).astype(np.float64)
                logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
                for j in range(len(logp)):  # position b + j predicts seq[b + j + 1]
                    if b + j + 1 < len(seq):
                        out[lo + b + j + 1 - off] = -logp[j, seq[b + j + 1]]
        return toks, out

    def detokenize(self, toks: list[int]) -> str:
        return self.model.detokenize(toks).decode("utf-8", "replace")
