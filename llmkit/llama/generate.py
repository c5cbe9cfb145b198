"""The decoding loop: plain, draft-model speculative and prompt-lookup decoding, one code path.

The target model keeps every token but the newest ("pending") in its KV cache. Each round drafts
K tokens (K may be 0), evaluates [pending] + drafts in one batch, accepts a prefix by rejection
sampling and rolls the KV cache back past the first rejection (llama-cpp-python removes cache
entries beyond `n_tokens` on the next evaluation). K is chosen each round to maximise expected
tokens per second from measured costs, so drafting is switched off where it cannot pay.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from llmkit.errors import BadInput
from llmkit.llama.sampling import SamplingParams, distribution, sample
from llmkit.llama.speculative import expected_tokens, lookup_draft, verify, verify_sample_and_match


@dataclass
class GenerateStats:
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    generated_tokens: int = 0
    decode_s: float = 0.0
    target_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    stop_reason: str = ""
    draft_lengths: dict = field(default_factory=dict)
    prefill_reused: int = 0  # prompt tokens whose KV came from the cache (restored slot)
    shifted: int = 0  # of those, tokens reused from later chunks by shifting (--cache-reuse)
    ttft_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_s=self.tokens_per_s, acceptance=self.acceptance,
                 mean_accepted_per_step=(self.accepted / self.target_steps) if self.target_steps else 0.0)
        return d


class DraftLengthChooser:
    """Picks K each round from measured verify cost T(b) (b = K + 1 tokens), draft cost per token
    and the running acceptance rate: maximise E[tokens](alpha, K) / (K * t_draft + T(K + 1))."""

    def __init__(self, k_min: int, k_max: int, adaptive: bool, draft_cost_known_zero: bool = False,
                 draft_cost_ratio: float = 0.2):
        self.k_min, self.k_max, self.adaptive = max(1, k_min), k_max, adaptive
        self.t_batch: dict[int, float] = {}
        self.t_draft = 0.0 if draft_cost_known_zero else None
        # decoding is memory-bound: before measuring, a draft token costs about T(1) times the ratio
        # of the two models' weight bytes
        self.draft_cost_ratio = draft_cost_ratio
        self.alpha = 0.7
        self.rounds_without_draft = 0
        self.probe_every = 32

    def observe_batch(self, b: int, seconds: float) -> None:
        old = self.t_batch.get(b)
        self.t_batch[b] = seconds if old is None else 0.8 * old + 0.2 * seconds

    def observe_draft(self, per_token: float) -> None:
        self.t_draft = per_token if self.t_draft is None else 0.8 * self.t_draft + 0.2 * per_token

    def observe_acceptance(self, accepted: int, drafted: int) -> None:
        if drafted:
            rate = accepted / drafted
            w = min(0.3, drafted / (drafted + 4.0))
            self.alpha = (1 - w) * self.alpha + w * rate

    def cost(self, b: int) -> float:
        if b in self.t_batch:
            return self.t_batch[b]
        pts = sorted(self.t_batch.items())
        if not pts:
            return 1.0
        if len(pts) == 1:
            b0, t0 = pts[0]
            return t0 * (1 + 0.05 * (b - b0))  # optimistic until measured: batching is cheap on GPUs
        lo = max((p for p in pts if p[0] <= b), default=pts[0])
        hi = min((p for p in pts if p[0] >= b), default=pts[-1])
        if lo[0] == hi[0]:
            lo, hi = pts[-2], pts[-1]
        slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
        return max(lo[1] + slope * (b - lo[0]), 1e-9)

    def _ideal_rate(self, td: float, k_max: int) -> float:
        return max(expected_tokens(1.0, k) / (k * td + self.cost(k + 1)) for k in range(self.k_min, k_max + 1))

    def choose(self, available: int, behind: int = 0) -> int:
        """Best K for the next round; `behind` = tokens the draft model must catch up on first."""
        k_max = min(self.k_max, available)
        if k_max < self.k_min:
            return 0
        if not self.adaptive:
            return k_max
        if 1 not in self.t_batch:
            return 0  # measure plain decoding first
        if not any(b > 1 for b in self.t_batch) and self.rounds_without_draft > 0:
            return k_max  # short prompt: no batch was timed in prefill, so measure one verification
        td = self.t_draft if self.t_draft is not None else self.cost(1) * self.draft_cost_ratio
        catch_up = behind * td * 0.5 if self.t_draft != 0.0 else 0.0  # batched catch-up, ~half a step each
        best_k, best_rate = 0, 1.0 / self.cost(1)
        for k in range(self.k_min, k_max + 1):
            rate = expected_tokens(self.alpha, k) / (k * td + self.cost(k + 1) + catch_up)
            if rate > best_rate * 1.001:
                best_k, best_rate = k, rate
        # the most drafting could ever give (every draft accepted): probes re-sync the draft model,
        # which costs real time, so only probe when a changed acceptance rate could pay well
        if best_k == 0 and self.rounds_without_draft >= self.probe_every and self._ideal_rate(td, k_max) * self.cost(1) > 1.3:
            # occasional probe so a changed acceptance rate is noticed; back off while it keeps failing
            best_k = self.k_min
            self.probe_every *= 2
        elif best_k > 0:
            self.probe_every = 32
        return best_k


class Generator:
    """Generate from a llama-cpp-python model, optionally with a draft model or prompt lookup."""

    def __init__(self, target, params: SamplingParams, draft=None, lookup: int = 0, draft_max: int = 8,
                 draft_min: int = 0, adaptive: bool = True, ignore_eos: bool = False,
                 context_shift: bool = False, keep: int = 0, acceptance_rule: str = "rejection"):
        params.validate()
        if acceptance_rule not in ("rejection", "match"):
            raise BadInput(f"unknown acceptance rule {acceptance_rule!r}; use 'rejection' or 'match'.")
        self.acceptance_rule = acceptance_rule
        if draft is not None and lookup:
            raise BadInput("use either --draft-model or --lookup, not both.")
        if draft_max < 1 or draft_min < 0 or draft_min > draft_max:
            raise BadInput(f"need 0 <= --draft-min <= --draft-max and --draft-max >= 1 (got {draft_min}, {draft_max}).")
        self.target, self.draft, self.lookup = target, draft, lookup
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.ignore_eos = ignore_eos
        self.context_shift, self.keep = context_shift, keep
        self.n_vocab = target.n_vocab()
        ratio = 0.2
        if draft is not None:
            import os

            try:
                ratio = os.path.getsize(draft.model_path) / os.path.getsize(target.model_path)
            except (OSError, AttributeError, TypeError):
                pass
        self.chooser = DraftLengthChooser(draft_min, draft_max, adaptive, draft_cost_known_zero=bool(lookup),
                                          draft_cost_ratio=ratio)
        self.drafting = draft is not None or lookup > 0
        if draft is not None:
            check_vocab_compatible(target, draft)
        self._eog = _eog_checker(target)

    # -- public ---------------------------------------------------------------------------------
    def run(self, prompt: list[int], n_predict: int, stop: tuple[str, ...] = (),
            on_text: Callable[[str], None] | None = None, reuse_cache: bool = False,
            cache_reuse: int = 0) -> tuple[str, GenerateStats]:
        """Generate up to n_predict tokens after `prompt`.

        With reuse_cache, tokens already in the target's cache that match the start of the prompt
        (e.g. a restored KV slot) are kept and only the rest is evaluated (llama-server's cache_prompt).
        With cache_reuse = N > 0, later cached chunks of >= N tokens that reappear in the prompt are
        kept too, their positions shifted into place (llama-server's --cache-reuse).
        """
        if n_predict <= 0:
            raise BadInput(f"-n must be a positive number of tokens, got {n_predict}.")
        if not prompt:
            raise BadInput("the prompt is empty. Give some text to continue.")
        bad = [t for t in prompt if not 0 <= t < self.n_vocab]
        if bad:
            raise BadInput(f"token id {bad[0]} is outside the model's vocabulary (0..{self.n_vocab - 1}).")
        # llama.cpp may round the context up; llama-cpp-python's logits buffer has the requested size
        n_ctx = min(self.target.n_ctx(), self.target.scores.shape[0])
        prompt = self._fit_prompt(list(prompt), n_ctx)
        st = GenerateStats(prompt_tokens=len(prompt))
        tgt = self.target
        reused = 0
        if reuse_cache and tgt.n_tokens:
            have = [int(t) for t in tgt.input_ids[:tgt.n_tokens]]
            reused = common_prefix(have, prompt[:-1])
            tgt.n_tokens = reused
            if cache_reuse > 0:
                reused, st.shifted = self._reuse_chunks(have, prompt, reused, cache_reuse)
        else:
            tgt.reset()
        st.prefill_reused = reused
        t0 = time.perf_counter()
        b = self.chooser.k_max + 1
        if reused:
            if len(prompt) - 1 > reused:
                eval_no_logits(tgt, prompt[reused:-1])
        elif self.drafting and self.chooser.adaptive and len(prompt) > b + 8:
            # time the last b prompt tokens as one batch: the cost of verifying k_max drafts,
            # measured for free during prefill instead of by a wasted drafting round
            eval_no_logits(tgt, prompt[:-1 - b])
            t1 = time.perf_counter()
            tgt.eval(prompt[-1 - b:-1])
            self.chooser.observe_batch(b, time.perf_counter() - t1)
        elif len(prompt) > 1:
            eval_no_logits(tgt, prompt[:-1])
        if self.draft is not None:  # the draft reads the prompt too: part of prefill, not decoding
            self.draft.reset()
            eval_no_logits(self.draft, prompt[:-1])
            self.draft.eval(prompt[-1:])  # the draft needs logits after the last prompt token
        st.prefill_s = time.perf_counter() - t0
        ctx = list(prompt)
        gen_ids: list[int] = []
        out = _TextStream(tgt, stop, on_text)
        t_start = time.perf_counter()
        while True:
            room = n_ctx - tgt.n_tokens - 1
            if room < 0:
                if not self.context_shift:
                    st.stop_reason = "context"
                    break
                self._shift(ctx)
                room = n_ctx - tgt.n_tokens - 1
            behind = len(ctx) - self.draft.n_tokens if self.draft is not None else 0
            k = self.chooser.choose(min(room, n_predict - st.generated_tokens - 1), behind) if self.drafting else 0
            drafts, qs = self._draft(ctx, k, st) if k > 0 else ([], [])
            n0 = tgt.n_tokens
            t1 = time.perf_counter()
            tgt.eval([ctx[-1]] + drafts)
            dt = time.perf_counter() - t1
            st.verify_s += dt
            st.target_steps += 1
            self.chooser.observe_batch(1 + len(drafts), dt)
            ps = [distribution(tgt.scores[n0 + i], self.params, _History(ctx, drafts[:i])) for i in range(len(drafts) + 1)]
            if drafts:
                if self.acceptance_rule == "rejection":
                    n_acc, nxt = verify(drafts, qs, ps, self.rng)
                else:  # sample-and-match, for comparison (llama-cpp-python's draft hook)
                    n_acc, nxt = verify_sample_and_match(drafts, ps, self.rng)
                st.drafted += len(drafts)
                st.accepted += n_acc
                st.draft_lengths[len(drafts)] = st.draft_lengths.get(len(drafts), 0) + 1
                self.chooser.observe_acceptance(n_acc, len(drafts))
                self.chooser.rounds_without_draft = 0
            else:
                n_acc, nxt = 0, sample(ps[0], self.rng)
                self.chooser.rounds_without_draft += 1
            tgt.n_tokens = n0 + 1 + n_acc  # roll back past the first rejection
            done = False
            if not st.ttft_s:
                st.ttft_s = st.prefill_s + (time.perf_counter() - t_start)
            for tok in drafts[:n_acc] + [nxt]:
                ctx.append(tok)
                gen_ids.append(tok)
                st.generated_tokens += 1
                if not self.ignore_eos and self._eog(tok):
                    st.stop_reason = "eos"
                    done = True
                    break
                if out.push(tok):
                    st.stop_reason = "stop"
                    done = True
                    break
                if st.generated_tokens >= n_predict:
                    st.stop_reason = "length"
                    done = True
                    break
            if done:
                break
        st.decode_s = time.perf_counter() - t_start
        self.generated = gen_ids
        return out.finish(), st

    # -- internals ------------------------------------------------------------------------------
    def _draft(self, ctx: list[int], k: int, st: GenerateStats) -> tuple[list[int], list[np.ndarray]]:
        if self.lookup:
            drafts = lookup_draft(ctx, self.lookup, k)
            return drafts, [np.eye(1, self.n_vocab, t).ravel() for t in drafts]
        d = self.draft
        t0 = time.perf_counter()
        common = common_prefix(d.input_ids[:d.n_tokens], ctx)
        d.n_tokens = common
        if common < len(ctx):
            d.eval(ctx[common:])
        drafts, qs = [], []
        for j in range(k):
            # the draft may have a few more or fewer (padding) tokens: it proposes only target ids
            q = distribution(_fit(d.scores[d.n_tokens - 1], self.n_vocab), self.params, _History(ctx, drafts))
            x = sample(q, self.rng)
            drafts.append(x)
            qs.append(q)
            if j < k - 1:
                d.eval([x])
        dt = time.perf_counter() - t0
        st.draft_s += dt
        self.chooser.observe_draft(dt / max(k, 1))
        return drafts, qs

    def _reuse_chunks(self, have: list[int], prompt: list[int], n_past: int, min_chunk: int) -> tuple[int, int]:
        """Keep cached chunks that reappear later in the prompt by shifting their KV positions.

        Exact only where a token's K/V do not depend on the tokens removed before it (e.g. the first
        layer: K/V there come from the token and its RoPE position alone); deeper layers saw the
        removed tokens, so reuse is an approximation there, as in llama-server.
        """
        tgt = self.target
        head_c, head_p = n_past, n_past
        end = len(prompt) - 1  # the last prompt token is evaluated for its logits anyway
        shifted = 0
        while head_c < len(have) and head_p < end:
            n = 0
            while head_c + n < len(have) and head_p + n < end and have[head_c + n] == prompt[head_p + n]:
                n += 1
            if n >= min_chunk:
                delta = head_p - head_c
                tgt._ctx.kv_cache_seq_rm(0, head_p, head_c)
                tgt._ctx.kv_cache_seq_shift(0, head_c, head_c + n, delta)
                tgt.input_ids[head_p:head_p + n] = prompt[head_p:head_p + n]
                head_c += n
                head_p += n
                shifted += n
            else:
                head_c += 1
        tgt._ctx.kv_cache_seq_rm(0, head_p, -1)
        tgt.n_tokens = head_p
        return head_p, shifted

    def _fit_prompt(self, prompt: list[int], n_ctx: int) -> list[int]:
        if len(prompt) < n_ctx:
            return prompt
        if not self.context_shift:
            raise BadInput(f"the prompt has {len(prompt)} tokens but the context holds {n_ctx}. "
                           "Raise -c, shorten the prompt, or pass --context-shift to drop the oldest tokens.")
        keep = min(self.keep, n_ctx // 2)
        tail = n_ctx // 2 - keep
        return prompt[:keep] + prompt[len(prompt) - tail:]

    def _shift(self, ctx: list[int]) -> None:
        """Drop the oldest half after the first `keep` tokens and shift the rest (as llama-server)."""
        tgt = self.target
        keep = min(self.keep, tgt.n_tokens // 2)
        n_left = tgt.n_tokens - keep
        n_discard = max(1, n_left // 2)
        tgt._ctx.kv_cache_seq_rm(0, keep, keep + n_discard)
        tgt._ctx.kv_cache_seq_shift(0, keep + n_discard, tgt.n_tokens, -n_discard)
        tgt.input_ids[keep:tgt.n_tokens - n_discard] = tgt.input_ids[keep + n_discard:tgt.n_tokens]
        tgt.n_tokens -= n_discard
        del ctx[keep:keep + n_discard]
        if self.draft is not None:
            self.draft.n_tokens = 0  # re-synchronised from ctx on the next draft


def _fit(logits: np.ndarray, n: int) -> np.ndarray:
    if len(logits) == n:
        return logits
    if len(logits) > n:
        return logits[:n]
    return np.concatenate([logits, np.full(n - len(logits), -np.inf, dtype=logits.dtype)])


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token sequences.

    >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def eval_no_logits(model, tokens: list[int]) -> None:
    """Evaluate tokens whose logits nobody needs (prefill): computing the vocabulary projection
    for every prompt position made a 1200-token prefill ~10x slower."""
    if not tokens:
        return
    keep = model._logits_all
    model._logits_all = False
    try:
        model.eval(tokens)
    finally:
        model._logits_all = keep


class _History:
    """ctx + extra tokens without copying ctx (for the repeat penalty's window)."""

    def __init__(self, ctx: list[int], extra: list[int]):
        self.ctx, self.extra = ctx, extra

    def __len__(self):
        return len(self.ctx) + len(self.extra)

    def __getitem__(self, s: slice):
        n = len(self.extra)
        start = s.start if s.start is not None else 0
        if start < 0 and -start > n:
            return self.ctx[start + n:] + self.extra
        return (self.ctx + self.extra)[s]


class _TextStream:
    """Incremental detokenization with stop strings; holds back text that may start a stop string."""

    def __init__(self, model, stop: tuple[str, ...], on_text):
        self.model, self.stop, self.on_text = model, tuple(s for s in stop if s), on_text
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")
        self.text = ""
        self.emitted = 0
        self.hold = max((len(s) for s in self.stop), default=1) - 1

    def push(self, tok: int) -> bool:
        self.text += self.dec.decode(self.model.detokenize([tok]))
        if self.stop:
            start = max(0, len(self.text) - 64 - self.hold)
            for s in self.stop:
                i = self.text.find(s, start)
                if i >= 0:
                    self.text = self.text[:i]
                    self._emit(len(self.text))
                    return True
        self._emit(len(self.text) - self.hold)
        return False

    def _emit(self, upto: int) -> None:
        if self.on_text is not None and upto > self.emitted:
            self.on_text(self.text[self.emitted:upto])
        self.emitted = max(self.emitted, upto)

    def finish(self) -> str:
        self.text += self.dec.decode(b"", final=True)
        self._emit(len(self.text))
        return self.text


def _eog_checker(model):
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(model.model)
    return lambda tok: bool(llama_cpp.llama_vocab_is_eog(vocab, tok))


def check_vocab_compatible(target, draft, sample_size: int = 4096) -> None:
    """Refuse a draft model whose token ids mean different text than the target's."""
    nt, nd = target.n_vocab(), draft.n_vocab()
    if abs(nt - nd) > 128:
        raise BadInput(f"the draft model's vocabulary ({nd} tokens) does not match the target's ({nt}). "
                       "Use a draft from the same model family.")
    n = min(nt, nd)
    ids = sorted(set(np.linspace(0, n - 1, min(n, sample_size)).astype(int).tolist()))
    for i in ids:
        if target.detokenize([i]) != draft.detokenize([i]):
            raise BadInput(f"the draft model's token {i} differs from the target's; their vocabularies are "
                           "incompatible. Use a draft from the same model family.")
