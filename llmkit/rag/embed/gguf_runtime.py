"""GGUF embedders and re-rankers through llama.cpp (llama-cpp-python's low-level API, no torch).

`describe(path)` reads the file with llmkit's hardened GGUF reader and says what it is before llama.cpp
sees it: an embedder (`{arch}.pooling_type` mean, cls or last), a re-ranker (rank pooling with its
classification head) or something else, refused in one sentence (a causal LM without pooling, a file
that is not GGUF, a rank model without the head llama.cpp asserts on).

`LlamaEncoder` runs such a file: sequences are sorted by length and packed into batches of at most
`BATCH_TOKENS` tokens; every sequence of a batch is its own llama.cpp sequence, and llama.cpp pools
each one (or applies the rank head). Inputs are token ids, or input embeddings where the caller
needs what llama.cpp's graph cannot express (BERT's segment-B token types: see `rerank.py`).
"""

from __future__ import annotations

import ctypes
import os
import unicodedata
from dataclasses import dataclass, field

import numpy as np

from llmkit.errors import BadFileFormat, BadInput

POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
BATCH_TOKENS = 256  # tokens per llama.cpp batch (docs/design/rag-models.md: attention over a batch is quadratic)
MAX_SEQS = 64


@dataclass
class GgufModel:
    """What a GGUF file is, read from its metadata (no weights loaded)."""

    path: str
    arch: str
    kind: str  # "embedder" | "re-ranker"
    pooling: str
    dim: int  # vector size (embedders) or scores per pair (re-rankers)
    n_ctx_train: int
    max_seq_length: int  # tokens a text is cut to (sentence-transformers' limit when the file records it)
    prompts: dict = field(default_factory=dict)
    type_count: int = 1  # BERT token types (segment A/B)
    name: str = ""
    tokenizer: str = ""  # tokenizer.ggml.model: bert (WordPiece), t5 (Unigram), gpt2, llama
    unk_id: int | None = None


def describe(path: str) -> GgufModel:
    """Validate a GGUF file as an embedder or a re-ranker (module doc); refusals name what it is."""
    from llmkit.gguf.convert import ST_KEYS
    from llmkit.gguf.reader import read_gguf

    if not os.path.isfile(path):
        raise BadInput(f"model file '{path}' does not exist. Check the path.")
    try:
        g = read_gguf(path)
    except BadFileFormat as e:
        raise BadFileFormat(f"{str(e).rstrip('.')}; it cannot be an embedding model.") from None
    arch = g.get("general.architecture")
    if not isinstance(arch, str) or not g.tensors or g.get("tokenizer.ggml.tokens") is None:
        raise BadFileFormat(f"'{path}' is not a complete llama.cpp model (no architecture, tensors or vocabulary).")
    pooling = g.get(f"{arch}.pooling_type")
    names = {t.name for t in g.tensors}
    if pooling is None and "cls.output.weight" in names and arch in ("bert", "xlm-roberta", "nomic-bert", "jina-bert-v2"):
        pooling = 4  # an encoder with a classification head and no pooling key: llama.cpp ranks with it
    causal = g.get(f"{arch}.attention.causal", True)
    label = f"'{os.path.basename(path)}'"
    if pooling is None or pooling == 0:
        what = "a causal language model" if "output.weight" in names or causal else "an encoder"
        raise BadInput(f"{label} is {what} ({arch}) without a pooling type, not an embedding model. Pass an embedding "
                       "GGUF (or convert one with llmkit gguf convert).")
    if pooling not in POOLING_NAMES:
        raise BadFileFormat(f"{label} declares pooling type {pooling}, which llama.cpp does not know.")
    n_embd = int(g.get(f"{arch}.embedding_length_out") or g.get(f"{arch}.embedding_length") or 0)
    n_ctx = int(g.get(f"{arch}.context_length") or 512)
    labels = g.get(f"{arch}.classifier.output_labels")
    if pooling == 4:
        if arch != "bert" and causal:
            raise BadInput(f"{label} is a decoder re-ranker ({arch}); llmkit runs encoder re-rankers (BERT, "
                           "XLM-RoBERTa cross-encoders).")
        if "cls.weight" not in names or "cls.bias" not in names:
            raise BadFileFormat(f"{label} declares rank pooling but has no classification head (cls.weight); "
                                "convert the cross-encoder again with llmkit gguf convert.")
        kind, dim = "re-ranker", len(labels) if labels is not None else 1
    else:
        kind, dim = "embedder", n_embd
    max_len = g.get(ST_KEYS["max_seq_length"])
    prompts = {k: g.get(ST_KEYS[k]) for k in ("query", "document") if isinstance(g.get(ST_KEYS[k]), str)}
    return GgufModel(path=os.path.abspath(path), arch=arch, kind=kind, pooling=POOLING_NAMES[pooling], dim=dim,
                     n_ctx_train=n_ctx, max_seq_length=min(int(max_len), n_ctx) if max_len else n_ctx,
                     prompts=prompts, type_count=int(g.get("tokenizer.ggml.token_type_count") or 1),
                     name=str(g.get("general.name") or os.path.basename(path)),
                     tokenizer=str(g.get("tokenizer.ggml.model") or ""),
                     unk_id=g.get("tokenizer.ggml.unknown_token_id"))


def describe_embedder(path: str) -> GgufModel:
    """`describe(path)`, refusing a file that is not an embedder (a re-ranker passed as the model)."""
    from llmkit.errors import OptionError

    info = describe(path)
    if info.kind != "embedder":
        raise OptionError("'{file}' is a {kind}, not an embedding model. Pass it as {rerank} and an embedding "
                          "model as {model}.", file=os.path.basename(path), kind=info.kind)
    return info


def is_gguf_path(name: str | None) -> bool:
    """Does this model name point at a file (a GGUF) rather than a model directory?"""
    return bool(name) and (str(name).lower().endswith(".gguf") or os.path.isfile(str(name)))


class LlamaEncoder:
    """One GGUF model in llama.cpp with an embedding context (pooled outputs per sequence)."""

    def __init__(self, info: GgufModel, threads: int | None = None):
        from llmkit.llama.runtime import silence_llama_log, default_threads, load_llama_cpp

        lc = self.lc = load_llama_cpp()
        silence_llama_log()
        self.info = info
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = lc.llama_model_load_from_file(info.path.encode(), mp)
        if not self.model:
            raise BadFileFormat(f"llama.cpp could not load '{info.path}'. Check that it is a complete GGUF model.")
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_embd = lc.llama_model_n_embd(self.model)
        self.batch_tokens = max(BATCH_TOKENS, info.max_seq_length)
        cp = lc.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = self.batch_tokens  # a non-causal batch must fit one ubatch
        cp.n_seq_max = MAX_SEQS
        cp.embeddings = True
        cp.pooling_type = {"mean": 1, "cls": 2, "last": 3, "rank": 4}[info.pooling]
        cp.n_threads = cp.n_threads_batch = threads or default_threads()
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            lc.llama_model_free(self.model)
            raise BadFileFormat(f"llama.cpp could not create a context for '{info.path}'.")
        self.out_dim = info.dim
        self._tok_buf = (lc.llama_token * 8192)()
        self.unk_id = info.unk_id
        special = self.tokenize("", special=True)
        add_bos = bool(lc.llama_vocab_get_add_bos(self.vocab))
        self.head, self.tail = (special[:1], special[1:]) if add_bos and special else ([], special)

    def __del__(self):
        lc = getattr(self, "lc", None)
        try:
            if getattr(self, "ctx", None):
                lc.llama_free(self.ctx)
            if getattr(self, "model", None):
                lc.llama_model_free(self.model)
        except (TypeError, AttributeError):  # interpreter shutdown: the binding is already torn down
            pass
        self.ctx = self.model = None

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """llama.cpp's token ids of a text (with the model's special tokens when `special`)."""
        raw = text.encode("utf-8")
        n = self.lc.llama_tokenize(self.vocab, raw, len(raw), self._tok_buf, len(self._tok_buf), special, False)
        if n < 0:
            buf = (self.lc.llama_token * (-n))()
            n = self.lc.llama_tokenize(self.vocab, raw, len(raw), buf, -n, special, False)
            return list(buf[:n])
        return list(self._tok_buf[:n])

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self.lc.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self.lc.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
        return buf.raw[:n]

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a text with the model's special tokens, cut to its maximum sequence length
        (the end of the text is dropped, the closing special tokens kept)."""
        ids = self.tokenize(text, special=True)
        limit = self.info.max_seq_length
        if len(ids) > limit:
            ids = ids[:limit - len(self.tail)] + self.tail
        return ids

    def run(self, seqs: list[list[int]], embeds: list[np.ndarray] | None = None, progress=None) -> np.ndarray:
        """The pooled output (vector or scores) of every sequence of token ids, in input order; with
        `embeds`, each sequence's input embeddings (n_tokens x n_embd) are fed instead of its ids."""
        lc = self.lc
        out = np.zeros((len(seqs), self.out_dim), np.float32)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        batch = lc.llama_batch_init(self.batch_tokens, self.n_embd if embeds is not None else 0, 1)
        mem = lc.llama_get_memory(self.ctx)
        try:
            done, lo = 0, 0
            while lo < len(order):
                group, used = [], 0
                while lo < len(order) and len(group) < MAX_SEQS and used + len(seqs[order[lo]]) <= self.batch_tokens:
                    group.append(order[lo])
                    used += len(seqs[order[lo]])
                    lo += 1
                if not group:
                    raise BadInput(f"a sequence of {len(seqs[order[lo]])} tokens exceeds the model's batch of "
                                   f"{self.batch_tokens}.")
                self._fill(batch, [seqs[i] for i in group], None if embeds is None else [embeds[i] for i in group])
                if mem:
                    lc.llama_memory_clear(mem, True)
                rc = lc.llama_decode(self.ctx, batch)
                if rc != 0:
                    raise BadInput(f"llama.cpp failed to run '{os.path.basename(self.info.path)}' (code {rc}).")
                for s, i in enumerate(group):
                    ptr = lc.llama_get_embeddings_seq(self.ctx, s)
                    if not ptr:
                        raise BadFileFormat(f"llama.cpp returned no pooled output for '{self.info.path}'.")
                    out[i] = np.ctypeslib.as_array(ptr, shape=(self.out_dim,))
                done += len(group)
                if progress:
                    progress(done, len(seqs))
        finally:
            lc.llama_batch_free(batch)
        return out

    def _fill(self, batch, group: list[list[int]], embeds) -> None:
        n = 0
        for s, ids in enumerate(group):
            for p, t in enumerate(ids):
                if embeds is None:
                    batch.token[n] = t
                batch.pos[n] = p
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = s
                batch.logits[n] = 1
                n += 1
        if embeds is not None:
            flat = np.ascontiguousarray(np.concatenate(embeds), np.float32).ravel()
            ctypes.memmove(batch.embd, flat.ctypes.data, flat.nbytes)
        batch.n_tokens = n

    # -- offsets of word pieces in the text ----------------------------------------------------------
    def token_starts(self, text: str) -> np.ndarray:
        """Start offsets (characters of `text`) of its tokens without special tokens, by matching
        each token's piece against the text compared without case and accents."""
        pieces = [self.piece(t).decode("utf-8", "ignore") for t in self.tokenize(text, special=False)]
        return piece_starts(text, pieces)


def piece_starts(text: str, pieces: list[str]) -> np.ndarray:
    """Start offsets (characters of `text`) of the tokens whose pieces are `pieces`, each piece
    matched against the text compared without case and accents ('▁' and spaces ignored).

    >>> piece_starts("Hello, wörld!", [" hello", " ,", " world", " !"]).tolist()
    [0, 5, 7, 12]
    """
    norm, origin = _folded(text)
    starts = np.zeros(len(pieces), np.int64)
    pos = 0
    for k, raw in enumerate(pieces):
        piece = _fold(raw.replace("\u2581", " ")).strip()
        while pos < len(norm) and norm[pos].isspace():
            pos += 1
        at = norm.find(piece, pos, pos + len(piece) + 16) if piece else -1
        if at >= 0:
            pos = at
        starts[k] = origin[min(pos, len(origin) - 1)] if origin else 0
        if at >= 0:
            pos = at + len(piece)
        elif pos < len(norm):  # an unknown token (no text of its own) stands for a word or one character
            pos += 1
            while pos < len(norm) and _wordish(norm[pos - 1]) and _wordish(norm[pos]):
                pos += 1
    return starts


def _wordish(c: str) -> bool:
    """A character that continues a word (letters and digits, not CJK ideographs, which stand alone)."""
    return c.isalnum() and not ("\u3400" <= c <= "\u9fff" or "\uf900" <= c <= "\ufaff")


def _fold(s: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", s.lower()) if not unicodedata.combining(c))


def _folded(text: str) -> tuple[str, list[int]]:
    """The text lower-cased without accents, and each folded character's offset in `text`."""
    chars, origin = [], []
    for i, c in enumerate(text):
        f = _fold(c)
        chars.append(f)
        origin.extend([i] * len(f))
    return "".join(chars), origin
