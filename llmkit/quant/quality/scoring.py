"""Scoring text with a model exactly as llama-perplexity does (tools/perplexity/perplexity.cpp).

- The text is tokenized with the model's special tokens (BOS when the vocabulary adds one), after
  dropping one trailing newline (how its `-f` reads a file), and cut into whole chunks of n_ctx.
- llama.cpp's context is set up as the tool sets it: `n_seq = max(1, n_batch / n_ctx)` chunks are
  evaluated side by side as parallel sequences (context n_seq * n_ctx, per-sequence KV cache,
  n_batch = min(n_batch, n_seq * n_ctx), n_ubatch 512, flash attention "auto", which is on for
  the CPU), each chunk's first token replaced by BOS when the vocabulary adds one. The layout is
  not a detail: with flash attention, a chunk evaluated in pieces (ubatches of 512 shared by 16
  sequences give each 32 tokens a step) gets logits that differ in the last bits from the same
  chunk in one piece, so only the same layout gives the same figures.
- Only positions n_ctx/2 .. n_ctx-2 are scored (each predicts the next token).
- Per position, log-softmax as its float code: max in float, sum of float `expf` in double. The
  negative log-likelihood is `-((float)(logit - max) - log(sum))` in double for plain perplexity,
  but `max + (float)log(sum) - logit` in float when a base file is written or read (the tool's
  two code paths print slightly different perplexities, and so does this module).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np

from llmkit.errors import BadFileFormat, BadInput, OptionError

F32 = np.float32
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type


@dataclass
class EvalOptions:
    """How llama.cpp evaluates the chunks; the defaults are llama-perplexity's."""
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: str = "auto"
    threads: int | None = None


_LIBM_EXPF = None


def _libm_expf():
    """The C library's expf as a numpy ufunc (None where there is no C math library to load)."""
    global _LIBM_EXPF
    if _LIBM_EXPF is None:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("m")
        try:
            f = ctypes.CDLL(name).expf if name else None
        except (OSError, AttributeError):
            f = None
        if f is not None:
            f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
            _LIBM_EXPF = np.frompyfunc(f, 1, 1)
        else:
            _LIBM_EXPF = False
    return _LIBM_EXPF or None


def expf(x: np.ndarray) -> np.ndarray:
    """float32 exp with the C library's `expf` results, which llama-perplexity calls.

    numpy's float32 exp differs from it by an ulp in ~40 % of arguments. The float64 exp rounded to
    float32 is the correctly rounded value; glibc's expf is within 0.502 ulp of exact, so the two can
    only differ where the exact value lies within 0.002 ulp of the midpoint between two floats. For
    the arguments closer than 0.005 ulp to a midpoint (a wide margin around those), the C function
    itself is asked.
    """
    x = np.asarray(x, F32)
    e = np.exp(x.astype(np.float64))
    with np.errstate(over="ignore"):
        y = e.astype(F32)
    lib = _libm_expf()
    if lib is None or not e.size:
        return y
    # the 29 float64 mantissa bits that rounding to float32 drops: their distance from the halfway
    # point (2**28) is the distance from the midpoint, in 2**-29 ulp (for normal float32 results)
    low = np.ascontiguousarray(e).reshape(-1).view(np.uint32)[0 if sys.byteorder == "little" else 1::2]
    v = (low & np.uint32(0x1FFFFFFF)) - np.uint32((1 << 28) - _NEAR)
    hard = (v < np.uint32(2 * _NEAR)).reshape(e.shape)
    small = e < 2.0 ** -126  # subnormal float32 results: fewer mantissa bits, test them one by one
    if small.any():
        ys, es = y[small].astype(np.float64), e[small]
        hard[small] = np.abs(es - ys) > 0.495 * np.spacing(y[small]).astype(np.float64)
    if hard.any():
        y[hard] = lib(x[hard]).astype(F32)
    return y


_NEAR = int(0.005 * (1 << 29))


def layout(n_ctx: int, opts: EvalOptions) -> tuple[int, int, int]:
    """(parallel sequences, llama.cpp context size, batch size) as llama-perplexity derives them."""
    if n_ctx < 4:
        raise OptionError("context size {value} is too small for perplexity. Use {n_ctx} 4 or more.", value=n_ctx)
    if opts.n_batch < 1 or opts.n_ubatch < 1:
        raise OptionError("{n_batch} {value} / {n_ubatch} {u}: batch sizes must be positive. Use {n_batch} 2048 "
                          "and {n_ubatch} 512, llama-perplexity's defaults.", value=opts.n_batch, u=opts.n_ubatch)
    if opts.flash_attn not in FLASH_ATTN:
        raise OptionError("{value!r} is not a flash attention setting ({flash_attn}). Use auto, on or off.",
                          value=opts.flash_attn)
    n_seq = max(1, opts.n_batch // n_ctx)
    return n_seq, n_seq * n_ctx, min(opts.n_batch, n_seq * n_ctx)


class Scorer:
    """A model and a llama.cpp context set up like llama-perplexity's for chunks of n_ctx tokens."""

    def __init__(self, model_path: str, n_ctx: int, opts: EvalOptions | None = None):
        from llmkit.llama import runtime

        self.opts = opts or EvalOptions()
        self.n_ctx = n_ctx
        self.n_seq, ctx_size, self.n_batch = layout(n_ctx, self.opts)
        lc = self.lc = runtime.load_llama_cpp()
        runtime.check_model_file(model_path)
        runtime.silence_llama_log()
        self.model = self.ctx = self.batch = None
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = lc.llama_model_load_from_file(model_path.encode("utf-8"), mp)
        if not self.model:
            raise BadFileFormat(f"llama.cpp could not load '{model_path}'. Check that it is a complete GGUF model.")
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        self.add_bos = bool(lc.llama_vocab_get_add_bos(self.vocab))
        if lc.llama_vocab_get_add_eos(self.vocab):
            self.close()
            raise BadInput(f"'{model_path}' adds an end-of-text token to every text; llama-perplexity refuses such "
                           "models and so does this. Use a decoder model without add_eos_token.")
        self.bos = int(lc.llama_vocab_bos(self.vocab))
        cp = lc.llama_context_default_params()
        threads = self.opts.threads or runtime.default_threads()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = ctx_size, self.n_batch, self.opts.n_ubatch, self.n_seq
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = FLASH_ATTN[self.opts.flash_attn]
        cp.kv_unified = False
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            self.close()
            raise BadInput(f"llama.cpp could not create a context of {ctx_size} tokens for '{model_path}' (out of "
                           "memory?). Use a smaller batch size or context.")
        self.batch = lc.llama_batch_init(self.n_batch, 0, 1)

    def close(self) -> None:
        """Free the batch, context and model."""
        lc = self.lc
        if self.batch is not None:
            lc.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            lc.llama_free(self.ctx)
        if self.model:
            lc.llama_model_free(self.model)
        self.ctx = self.model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def tokenize(self, text: str) -> np.ndarray:
        """Token ids as llama-perplexity's common_tokenize(text, add_special=true, parse_special=false)."""
        data = text.encode("utf-8")
        n = len(data) + 2
        for _ in range(2):
            buf = (self.lc.llama_token * n)()
            got = self.lc.llama_tokenize(self.vocab, data, len(data), buf, n, True, False)
            if got >= 0:
                return np.ctypeslib.as_array(buf)[:got].astype(np.int32)
            n = -got
        raise BadInput("llama.cpp could not tokenize the text.")  # pragma: no cover (second call has room)

    def chunks(self, toks: np.ndarray):
        """Yield, per chunk of n_ctx tokens, the float32 logits of its scored positions
        (n_ctx/2 .. n_ctx-2), evaluated n_seq chunks at a time as llama-perplexity evaluates them."""
        import ctypes

        lc, n_ctx, n_batch, b = self.lc, self.n_ctx, self.n_batch, self.batch
        first, n_chunk = n_ctx // 2, len(toks) // n_ctx
        num_batches = (n_ctx + n_batch - 1) // n_batch
        m = n_ctx - 1 - first
        for i in range(0, n_chunk, self.n_seq):
            n_seq_batch = min(self.n_seq, n_chunk - i)
            lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
            rows = []
            for j in range(num_batches):
                batch_size = min(n_ctx - j * n_batch, n_batch)
                k = 0
                for seq in range(n_seq_batch):
                    seg = toks[(i + seq) * n_ctx + j * n_batch:][:batch_size].copy()
                    if self.add_bos and j == 0:
                        seg[0] = self.bos
                    for t in range(batch_size):
                        pos = j * n_batch + t
                        b.token[k], b.pos[k], b.n_seq_id[k], b.logits[k] = int(seg[t]), pos, 1, pos >= first
                        b.seq_id[k][0] = seq
                        k += 1
                b.n_tokens = k
                if lc.llama_decode(self.ctx, b) != 0:
                    raise BadInput("llama.cpp failed to evaluate a chunk (out of memory?). Use a smaller batch size.")
                if num_batches > 1:
                    n_out = sum(1 for t in range(batch_size) if j * n_batch + t >= first)
                    if n_out:
                        ptr = lc.llama_get_logits(self.ctx)
                        rows.append(np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab)).copy())
            for seq in range(n_seq_batch):
                if num_batches > 1:
                    L = np.concatenate(rows)[:m]
                else:
                    ptr = lc.llama_get_logits_ith(self.ctx, seq * n_ctx + first)
                    L = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                              shape=(m, self.n_vocab)).copy()
                yield i + seq, L


def tokens_for(scorer: Scorer, text: str, max_chunks: int = 0) -> np.ndarray:
    """The text tokenized as llama-perplexity does (module doc), cut to whole chunks (the tool wants
    at least two chunks' worth of tokens; one is enough here)."""
    if text.endswith("\n"):
        text = text[:-1]
    toks = scorer.tokenize(text)
    n_ctx = scorer.n_ctx
    n_chunk = len(toks) // n_ctx
    if max_chunks:
        n_chunk = min(n_chunk, max_chunks)
    if n_chunk < 1:
        raise BadInput(f"the text has {len(toks)} tokens, fewer than one chunk of {n_ctx}; give more text or "
                       "shorter chunks.")
    return toks[:n_chunk * n_ctx]


def token_nll(L: np.ndarray, targets: np.ndarray, in_float: bool = False) -> np.ndarray:
    """-log p(target) per row of float32 logits, as llama-perplexity's log_softmax (module doc):
    in double for plain perplexity, in float (`in_float`) when base files are written or read."""
    out = np.empty(len(L), np.float64)
    for a in range(0, len(L), 32):  # a 150k-token vocabulary makes (rows x vocab) temporaries large
        X = L[a:a + 32]
        mx = X.max(axis=1)
        s = expf(X - mx[:, None]).astype(np.float64).sum(axis=1)
        lt = X[np.arange(len(X)), targets[a:a + 32]]
        if in_float:
            out[a:a + 32] = (mx + np.log(s).astype(F32)) - lt
        else:
            out[a:a + 32] = -((lt - mx).astype(np.float64) - np.log(s))
    return out


def score_chunks(scorer: Scorer, toks: np.ndarray, progress=None, on_logits=None) -> tuple[float, float, int]:
    """llama-perplexity's scoring of whole chunks: (mean negative log-likelihood, its uncertainty as
    the tool prints it, tokens scored). With `on_logits` (which sees each chunk's scored logits, as the
    tool writing a base file) the log-likelihoods are the float ones of that code path."""
    n_ctx = scorer.n_ctx
    n_chunk = len(toks) // n_ctx
    nll = nll2 = 0.0
    count = 0
    for i, L in scorer.chunks(toks):
        if on_logits:
            on_logits(L)
        v = token_nll(L, toks[i * n_ctx + n_ctx // 2 + 1:(i + 1) * n_ctx], in_float=on_logits is not None)
        nll += float(v.sum())
        nll2 += float((v * v).sum())
        count += len(v)
        if progress:
            progress(i + 1, n_chunk)
    mean = nll / count
    var = nll2 / count - mean * mean
    return mean, (math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0), count


def mean_uncertainty(s: float, s2: float, n: int) -> tuple[float, float]:
    """(mean, its standard error) from a sum and a sum of squares of n values, as kl_divergence()'s
    mean_and_uncertainty (no uncertainty for 10 values or fewer)."""
    if n < 1:
        return 0.0, 0.0
    f = s / n
    df = s2 / n - f * f
    return f, (math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)
