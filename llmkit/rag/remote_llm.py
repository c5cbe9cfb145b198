"""The LLM steps of RAG through an OpenAI-compatible chat endpoint (`POST {base}/v1/chat/completions`
of llama-server, vLLM, Ollama...), named by a spec `URL[#MODEL]` (`llmkit.rag.endpoint`).

`RemoteLLM` answers what `LocalLLM` answers where the API can: completions (greedy, streamed when
asked; with the local path's repeat penalty where the server is a llama-server), lines, and yes/no
relevance from the first token's `top_logprobs`. Token surprisal of a prompt, which compression
needs, is not in the chat API, so compression is refused.
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from llmkit.errors import BadInput, OptionError
from llmkit.rag.llm import LocalLLM

TOP_LOGPROBS = 20  # the most OpenAI's API returns per token
REPEAT_PENALTY = 1.1  # LocalLLM's: without it small models loop when decoding greedily


class RemoteLLM:
    remote = True  # the steps that need a local model's internals (compression) refuse it

    def __init__(self, spec: str):
        from llmkit.rag.endpoint import resolve

        self.endpoint = resolve(spec)
        self.path = self.endpoint.spec
        self.url = self.endpoint.base + "/v1/chat/completions"
        self._tokenize_api = None  # llama-server's /tokenize, decided on first use
        self._sampling = None  # fields beyond OpenAI's that the server takes, decided on first use

    def _body(self, user: str, system: str | None, n_predict: int, **extra) -> dict:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        # greedy keeps retrieval repeatable, as the local path is
        return {"model": self.endpoint.model, "messages": messages, "max_tokens": n_predict, "temperature": 0,
                **extra}

    def complete(self, user: str, n_predict: int = 128, system: str | None = None,
                 on_text: Callable[[str], None] | None = None, stop: tuple[str, ...] = ()) -> str:
        """Greedy completion of a chat turn, streamed to `on_text` as it arrives when given, ending
        before the first of the `stop` strings."""
        from llmkit.rag.endpoint import events, request

        stop = tuple(s for s in stop if s)
        # OpenAI's API takes at most 4 stop strings: the rest are cut here, as are the 4 where a server ignores them
        extra = {"stop": list(stop)[:4]} if stop else {}
        extra.update(self.sampling())
        if on_text is None:
            got = request(self.url, self._body(user, system, n_predict, **extra))
            return _cut(_message(got, self.url), stop)[0].strip()
        # text that may begin a stop string is held back until the next piece tells
        hold = max(map(len, stop), default=1) - 1
        text, sent, seen = "", 0, False
        stream = events(self.url, self._body(user, system, n_predict, stream=True, **extra))
        try:
            for ev in stream:
                seen = True
                if isinstance(ev, dict) and ev.get("error"):  # vLLM and OpenAI report a failure inside the stream
                    raise BadInput(f"{self.url} streamed an error: {_error_text(ev['error'])}. Check the model name "
                                   "and the server's log.")
                choices = ev.get("choices") if isinstance(ev, dict) else None
                delta = (choices[0].get("delta") or {}) if choices and isinstance(choices[0], dict) else {}
                piece = delta.get("content") if isinstance(delta, dict) else None
                if not (isinstance(piece, str) and piece):
                    continue
                text, stopped = _cut(text + piece, stop)
                ready = len(text) if stopped else max(len(text) - hold, sent)
                if ready > sent:
                    on_text(text[sent:ready])
                    sent = ready
                if stopped:
                    break
        finally:
            stream.close()
        if not seen:  # a page of HTML or plain JSON holds no `data:` line: an empty answer would hide that
            raise BadInput(f"{self.url} answered a streamed request without any event (no `data:` line). Check that "
                           "the URL is an OpenAI-compatible chat server.")
        if len(text) > sent:
            on_text(text[sent:])
        return text.strip()

    def sampling(self) -> dict:
        """The local path's repeat penalty where the server is llama.cpp's (its /v1/models says
        `owned_by: llamacpp`); nothing for others, since OpenAI's API refuses a field it does not know."""
        from llmkit.rag.endpoint import NO_API, request

        if self._sampling is None:
            got = request(self.endpoint.base + "/v1/models", absent=NO_API)
            data = got.get("data") if isinstance(got, dict) else None
            llamacpp = isinstance(data, list) and any(isinstance(m, dict) and m.get("owned_by") == "llamacpp"
                                                      for m in data)
            self._sampling = {"repeat_penalty": REPEAT_PENALTY} if llamacpp else {}
        return self._sampling

    lines = LocalLLM.lines  # the same parsing of a completion into lines

    def yes_no(self, prompt: str) -> float:
        """log P(yes) - log P(no) for the answer's first token, from its top log-probabilities (a
        word missing from them counts at the smallest one returned: an upper bound)."""
        from llmkit.rag.endpoint import request

        got = request(self.url, self._body(prompt, None, 1, logprobs=True, top_logprobs=TOP_LOGPROBS))
        try:
            top = got["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            pairs = [(str(t["token"]).strip().lower(), float(t["logprob"])) for t in top]
        except (KeyError, IndexError, TypeError, ValueError):
            raise BadInput(f"{self.url} returned no top_logprobs for the answer's first token; LLM re-ranking needs "
                           "them (llama-server and vLLM return them). Use a local GGUF for it.") from None
        if not pairs:
            return 0.0
        floor = min(p for _, p in pairs)
        yes = [p for t, p in pairs if t == "yes"] or [floor]
        no = [p for t, p in pairs if t == "no"] or [floor]
        return float(np.logaddexp.reduce(yes) - np.logaddexp.reduce(no))

    def count_tokens(self, text: str) -> int:
        """The model's tokens in `text` (llama-server's /tokenize), else an estimate: words and marks."""
        from llmkit.rag.endpoint import NO_TOKENIZE, request

        if self._tokenize_api is not False:
            got = request(self.endpoint.base + "/tokenize", {"content": text}, absent=NO_TOKENIZE)
            toks = got.get("tokens") if isinstance(got, dict) else None
            self._tokenize_api = isinstance(toks, list)
            if self._tokenize_api:
                return len(toks)
        return len(re.findall(r"\w+|[^\w\s]", text))

    def surprisal(self, text: str):
        raise no_compression()

    def detokenize(self, toks: list[int]) -> str:
        raise no_compression()


def no_compression() -> OptionError:
    return OptionError("compression drops the tokens the LLM finds least surprising, and an OpenAI-compatible "
                       "endpoint does not report that for a prompt. Use a local GGUF as {llm}, or drop "
                       "{compress_to}.")


def _cut(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    r"""The text up to the first stop string in it, and whether one was found.

    >>> _cut("Paris.\nQ: next", ("Q:", "\n\n")), _cut("Paris", ("Q:",))
    (('Paris.\n', True), ('Paris', False))
    """
    at = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:at], True) if at >= 0 else (text, False)


def _error_text(err) -> str:
    """An error event's message on one line ({"message": ...} or a bare string).

    >>> _error_text({"message": "model   not found", "code": 404}), _error_text("boom")
    ('model not found', 'boom')
    """
    msg = err.get("message", err) if isinstance(err, dict) else err
    return " ".join(str(msg).split())[:200]


def _message(got, url: str) -> str:
    """The text of a chat completion's first choice."""
    try:
        content = got["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise BadInput(f"{url} answered without a chat message ({str(got)[:120]!r}). Check that the URL is an "
                       "OpenAI-compatible chat server.") from None
    return content if isinstance(content, str) else ""


def open_llm(spec: str | None = None):
    """The LLM `spec` names: an OpenAI-compatible endpoint (`URL[#MODEL]`, `remote_llm.py`; with no
    spec, LLMKIT_LLM_URL when set) or a local GGUF file (None: LLMKIT_MODEL or the packaged model)."""
    from llmkit import config
    from llmkit.rag.endpoint import is_endpoint

    spec = spec or config.text("LLMKIT_LLM_URL")
    return RemoteLLM(spec) if is_endpoint(spec) else LocalLLM(spec)
