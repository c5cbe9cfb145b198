"""An embedding model served over HTTP: `POST {base}/v1/embeddings` of an OpenAI-compatible server
(llama-server started with `--embedding`, vLLM, TEI, Ollama), named by a spec `URL[#MODEL]`
(`llmkit.rag.endpoint`).

Texts go in batches of `batch_size`; every answer is checked (one vector per text, all of the
dimension the first answer gave) before a vector is used, so a wrong server fails the run instead
of filling the index. Token counts and offsets, which chunking needs, come from the server's
`/tokenize` where it has llama-server's (`with_pieces`); elsewhere they are estimated as words and
punctuation marks. A text longer than the window is cut to it here, as the local runtimes cut it,
since a server may embed it whole or refuse it.
"""

from __future__ import annotations

import re

import numpy as np

from llmkit.errors import BadInput, OptionError
from llmkit.rag.embed.base import Embedder
from llmkit.rag.embed.models import MIXABLE

_WORDS = re.compile(r"\w+|[^\w\s]")
PROBE = "dimension probe"
_PROBED: dict = {}  # spec -> (endpoint, dimension): one probe per process, however often the model is loaded


class EndpointEmbedder(Embedder):
    """`Embedder` over an OpenAI-compatible `/v1/embeddings`; vectors L2-normalised here."""

    runtime = "openai"
    batch_size = 64

    def __init__(self, spec: str, precision: str = "fp32", query_prompt: str = "", passage_prompt: str = "",
                 progress=None, threads: int | None = None):
        from llmkit import config
        from llmkit.rag.endpoint import resolve

        if precision not in MIXABLE:
            raise OptionError("an embedding endpoint returns float vectors; drop {embed_precision} int8.")
        known = _PROBED.get(spec)
        self.endpoint = known[0] if known else resolve(spec)
        self.name = self.path = self.endpoint.spec
        self.url = self.endpoint.base + "/v1/embeddings"
        self.precision = precision
        self._explicit = (query_prompt, passage_prompt)
        self._set_prompts({})
        self.unk_id = None  # an endpoint does not say which id is [UNK]
        self.max_seq_length = config.size("LLMKIT_ENDPOINT_TOKENS")
        self._pieces = None  # llama-server's /tokenize answers (decided on first use)
        self._special = None
        self._rooms: dict[str, int] = {}
        self.dim = 0
        self.dim = known[1] if known else self._post([PROBE]).shape[1]
        _PROBED[spec] = (self.endpoint, self.dim)

    # -- vectors -------------------------------------------------------------------------------------
    def _post(self, texts: list[str]) -> np.ndarray:
        """The raw vectors of `texts`, checked: one per text, each of the dimension known so far."""
        from llmkit.rag.endpoint import request

        got = request(self.url, {"model": self.endpoint.model, "input": texts, "encoding_format": "float"})
        data = got.get("data") if isinstance(got, dict) else None
        if not isinstance(data, list):
            raise BadInput(f"{self.url} answered without embeddings ({str(got)[:120]!r}). Check that the URL is an "
                           "OpenAI-compatible embeddings server (llama-server needs --embedding).")
        if len(data) != len(texts):
            raise BadInput(f"{self.url} returned {len(data)} embeddings for {len(texts)} texts. Check the server.")
        if all(isinstance(d, dict) and isinstance(d.get("index"), int) for d in data):
            data = sorted(data, key=lambda d: d["index"])
        try:
            rows = [np.asarray(d["embedding"], np.float32) for d in data]
        except (TypeError, KeyError, ValueError):
            raise BadInput(f"{self.url} returned embeddings that are not lists of numbers. Check the "
                           "server.") from None
        for r in rows:
            if r.ndim != 1 or not r.size:
                raise BadInput(f"{self.url} returned an embedding of shape {r.shape}, not a vector. Start the "
                               "server with a pooling type (llama-server: --pooling mean).")
            want = self.dim or rows[0].size
            if r.size != want:
                raise BadInput(f"{self.url} returned {r.size}-d vectors where model '{self.endpoint.model}' gave "
                               f"{want}-d ones. Check which model the server runs.")
        return np.stack(rows)

    def encode(self, texts, prompt="", progress=None):
        from llmkit.rag.embed.onnx_runtime import normalize

        out = np.zeros((len(texts), self.dim), np.float32)
        # sentence-transformers strips each text before tokenizing
        cut = [prompt + self._fit(t.strip(), self._room(prompt)) for t in texts]
        for lo in range(0, len(cut), self.batch_size):
            out[lo:lo + self.batch_size] = self._post(cut[lo:lo + self.batch_size])
            if progress:
                progress(min(lo + self.batch_size, len(cut)), len(cut))
        return normalize(out)

    def _room(self, prompt: str) -> int:
        """Tokens of a text the model reads after this prompt."""
        if prompt not in self._rooms:
            used = len(self.token_ids(prompt)) if prompt else 0
            self._rooms[prompt] = self.max_seq_length - self.n_special - used
        return self._rooms[prompt]

    def _fit(self, text: str, room: int) -> str:
        """The text cut to `room` tokens. A token covers at least one byte of the text (byte-level BPE
        splits a character into several), bar the space a SentencePiece model puts in front, so a text
        of fewer bytes than that needs no tokenizing."""
        if len(text.encode("utf-8")) < room:
            return text
        starts = self.token_starts(text)
        return text if len(starts) <= room else text[:int(starts[room])].rstrip()

    # -- tokens --------------------------------------------------------------------------------------
    def _tokenize(self, text: str, special: bool = False) -> list | None:
        """llama-server's /tokenize answer ([{id, piece}], or ids with `special`); None where the
        server has no such API."""
        from llmkit.rag.endpoint import NO_TOKENIZE, request

        if self._pieces is False:
            return None
        got = request(self.endpoint.base + "/tokenize", {"content": text, "with_pieces": not special,
                                                         "add_special": special}, absent=NO_TOKENIZE)
        toks = got.get("tokens") if isinstance(got, dict) else None
        ok = isinstance(toks, list) and all(isinstance(t, int) if special else isinstance(t, dict) for t in toks)
        self._pieces = bool(ok)
        return toks if ok else None

    def token_ids(self, text):
        toks = self._tokenize(text)
        if toks is None:
            return list(range(len(_WORDS.findall(text))))
        return [t["id"] for t in toks]

    def token_starts(self, text):
        toks = self._tokenize(text)
        if toks is None:
            return np.fromiter((m.start() for m in _WORDS.finditer(text)), np.int64)
        pieces = [t.get("piece", "") for t in toks]
        if any(isinstance(p, list) for p in pieces):  # llama-server's bytes of a piece that is not UTF-8
            return byte_starts(text, pieces)
        from llmkit.rag.embed.gguf_runtime import piece_starts

        return piece_starts(text, [str(p) for p in pieces])

    @property
    def n_special(self) -> int:
        """Tokens the model adds around a text ([CLS] and [SEP] where the server cannot say)."""
        if self._special is None:
            toks = self._tokenize("", special=True)
            self._special = len(toks) if toks is not None else 2
        return self._special

    @property
    def window(self) -> int:
        return self._room(self.passage_prompt)


def byte_starts(text: str, pieces: list) -> np.ndarray:
    """Start offsets (characters of `text`) of tokens whose pieces are strings or lists of bytes that
    spell the text's UTF-8 (after one leading space a SentencePiece model may add); a token that
    starts inside a character starts at that character.

    >>> byte_starts("a中b", ["a", [228], [184, 173], "b"]).tolist()
    [0, 1, 1, 2]
    """
    spelled = [p.encode("utf-8") if isinstance(p, str) else bytes(p) for p in pieces]
    raw = text.encode("utf-8")
    joined = b"".join(spelled)
    skip = 1 if joined[:1] == b" " and joined[1:] == raw else 0
    if joined[skip:] != raw:
        from llmkit.rag.embed.gguf_runtime import piece_starts

        return piece_starts(text, [b.decode("utf-8", "replace") for b in spelled])
    # the character of every byte, and one past the end for a token that adds nothing
    owner = np.append(np.repeat(np.arange(len(text)), [len(c.encode("utf-8")) for c in text]), len(text))
    at = np.maximum(np.cumsum([0] + [len(b) for b in spelled[:-1]]) - skip, 0)
    return owner[np.minimum(at, len(raw))].astype(np.int64)
