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

from llmkit.errors import BadInput, OptionError
from llmkit.llama.cache import common_prefix, eval_logits, eval_no_logits, reuse_chunks, shift_context
from llmkit.llama.draft import DraftLengthChooser, DraftModel, DraftOptions, ModelDrafter, check_vocab_compatible
from llmkit.llama.sampling import History, SamplingParams, distribution, sample
from llmkit.llama import verify_cost
from llmkit.llama.speculative import NgramIndex, verify, verify_greedy, verify_sample_and_match

__all__ = ["GenerateStats", "Generator", "common_prefix", "eval_no_logits"]


@dataclass
class GenerateStats:
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    generated_tokens: int = 0
    decode_s: float = 0.0
    target_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0  # the draft model's evaluations
    lookup_s: float = 0.0  # finding prompt-lookup drafts
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
        steps = max(self.target_steps, 1)
        d.update(tokens_per_s=self.tokens_per_s, acceptance=self.acceptance,
                 mean_accepted_per_step=(self.accepted / self.target_steps) if self.target_steps else 0.0,
                 # decoding time outside llama.cpp's evaluations: sampling, acceptance, lookup, streaming
                 python_ms_per_round=1000 * max(self.decode_s - self.verify_s - self.draft_s, 0.0) / steps)
        return d


class Generator:
    """Generate from a llama-cpp-python model, optionally with a draft model (a model, or a DraftModel
    that is loaded only once drafting is chosen) or prompt lookup."""

    def __init__(self, target, params: SamplingParams, draft=None, lookup: int = 0, draft_max: int = 8,
                 draft_min: int = 0, adaptive: bool = True, ignore_eos: bool = False,
                 context_shift: bool = False, keep: int = 0, acceptance_rule: str = "rejection",
                 drafting: DraftOptions | None = None):
        """`drafting`, when given, sets lookup, draft_max, draft_min and adaptive (the CLI's draft
        options whole); `draft` is the draft model itself (a model or a DraftModel)."""
        if drafting is not None:
            lookup, draft_max, draft_min, adaptive = drafting.lookup, drafting.max, drafting.min, drafting.adaptive
        params.validate()
        if acceptance_rule not in ("rejection", "match"):
            raise BadInput(f"unknown acceptance rule {acceptance_rule!r}; use 'rejection' or 'match'.")
        self.acceptance_rule = acceptance_rule
        if draft is not None and lookup:
            raise OptionError("use either {draft_path} or {lookup}, not both.")
        if draft_max < 1 or draft_min < 0 or draft_min > draft_max:
            raise OptionError("need 0 <= {draft_min} <= {draft_max} and {draft_max} >= 1 (got {lo}, {hi}).",
                              lo=draft_min, hi=draft_max)
        self.target, self.draft, self.lookup = target, draft, lookup
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        # greedy without a repeat penalty takes each token as the logits' argmax: no distributions built
        self.argmax_only = params.greedy and params.repeat_penalty == 1.0
        self.ignore_eos = ignore_eos
        self.context_shift, self.keep = context_shift, keep
        self.n_vocab = target.n_vocab()
        ratio = 0.2
        if draft is not None:
            import os

            try:
                path = draft.path if isinstance(draft, DraftModel) else draft.model_path
                ratio = os.path.getsize(path) / os.path.getsize(target.model_path)
            except (OSError, AttributeError, TypeError):
                pass
        self.chooser = DraftLengthChooser(draft_min, draft_max, adaptive, draft_cost_known_zero=bool(lookup),
                                          draft_cost_ratio=ratio)
        self.drafting = draft is not None or lookup > 0
        self._primed = None  # the logits of the context's last token when the prompt's evaluation gave them
        self.drafter = None
        if draft is not None:
            if isinstance(draft, DraftModel):
                # its vocabulary is compared once it is opened: a run that never drafts never reads it
                draft.check = lambda d: check_vocab_compatible(target, d)
                if not adaptive:
                    draft = draft.get()  # it drafts every round: load it now, its prompt read as part of prefill
            else:
                check_vocab_compatible(target, draft)
            self.drafter = ModelDrafter(draft, self.n_vocab)
        self.ngram = NgramIndex(lookup) if lookup else None
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
            raise OptionError("{n_predict} must be a positive number of tokens, got {value}.", value=n_predict)
        self._check_ids(prompt)
        # llama.cpp may round the context up; llama-cpp-python keeps token ids for the size requested
        n_ctx = min(self.target.n_ctx(), len(self.target.input_ids))
        prompt = self._fit_prompt(list(prompt), n_ctx)
        st = GenerateStats(prompt_tokens=len(prompt))
        self._timed: set[int] = set()  # the batch sizes this run timed itself
        t0 = time.perf_counter()
        st.prefill_reused = self._reuse_cache(prompt, cache_reuse, st) if reuse_cache and self.target.n_tokens else 0
        self._prefill(prompt, st.prefill_reused)
        st.prefill_s = time.perf_counter() - t0
        ctx = list(prompt)
        gen_ids: list[int] = []
        out = _TextStream(self.target, stop, on_text)
        t_start = time.perf_counter()
        while not st.stop_reason:
            room = self._make_room(ctx, n_ctx, st)
            if room is None:
                break
            tokens = self._round(ctx, min(room, n_predict - st.generated_tokens - 1), st)
            if not st.ttft_s:
                st.ttft_s = st.prefill_s + (time.perf_counter() - t_start)
            for tok in tokens:
                ctx.append(tok)
                gen_ids.append(tok)
                st.generated_tokens += 1
                st.stop_reason = self._stop_reason(tok, out, st.generated_tokens, n_predict)
                if st.stop_reason:
                    break
        st.decode_s = time.perf_counter() - t_start
        self.generated = gen_ids
        # only sizes this run timed are saved: re-dating figures it only read would keep them forever
        if self.drafting and self.chooser.adaptive and self._timed:
            verify_cost.save(self.target, self.chooser.k_max + 1, {b: self.chooser.t_batch[b] for b in self._timed})
        return out.finish(), st

    # -- the steps of run -------------------------------------------------------------------------
    def _check_ids(self, prompt: list[int]) -> None:
        if not prompt:
            raise BadInput("the prompt is empty. Give some text to continue.")
        bad = [t for t in prompt if not 0 <= t < self.n_vocab]
        if bad:
            raise BadInput(f"token id {bad[0]} is outside the model's vocabulary (0..{self.n_vocab - 1}).")

    def _reuse_cache(self, prompt: list[int], cache_reuse: int, st: GenerateStats) -> int:
        """Keep the cached tokens the prompt starts with (and, with cache_reuse, later chunks shifted
        into place); the number of prompt tokens whose KV is reused."""
        tgt = self.target
        have = [int(t) for t in tgt.input_ids[:tgt.n_tokens]]
        reused = common_prefix(have, prompt[:-1])
        tgt.n_tokens = reused
        if cache_reuse > 0:
            reused, st.shifted = reuse_chunks(tgt, have, prompt, reused, cache_reuse)
        return reused

    def _prefill(self, prompt: list[int], reused: int) -> None:
        """Evaluate the prompt as plain decoding does: all of it in one evaluation whose last logits give
        the first token. Two exceptions while drafting: where only the last prompt token is left (a
        restored cache) it waits for the first round's drafts, and where no earlier run measured the
        verification cost the last k_max + 1 tokens are evaluated apart as a timed batch."""
        tgt, b = self.target, self.chooser.k_max + 1
        known = None
        if self.drafting and self.chooser.adaptive and self.chooser.may_skip and not reused:
            known = verify_cost.load(tgt, b)
            if known is not None:  # timed by earlier runs: no timed batch, and no drafting if it cannot pay
                for size, seconds in known.items():
                    self.chooser.observe_batch(size, seconds)
                self.drafting = self.chooser.could_pay()
        if not reused:
            tgt.reset()
        if self.drafting and len(prompt) - reused == 1:
            pass  # the last prompt token rides with the first round's drafts instead of a step of its own
        elif self.drafting and self.chooser.adaptive and known is None and not reused and len(prompt) > b + 8:
            self._primed = self._prefill_timing_a_verify_batch(prompt, b)
        else:
            self._primed = eval_logits(tgt, prompt[reused:])[0]
        if self.drafting and self.ngram is not None:  # indexing the prompt is prompt processing, not a round's work
            self.ngram.extend(prompt)
        if self.drafting and self.drafter is not None:  # the draft reads the prompt too: part of prefill
            self.drafter.prefill(prompt)

    def _prefill_timing_a_verify_batch(self, prompt: list[int], b: int) -> np.ndarray:
        """Evaluate the last b prompt tokens as one timed batch with every position's logits, as a
        verification of k_max drafts is, and return the last position's: the cost is measured during
        prefill instead of by a wasted drafting round."""
        eval_no_logits(self.target, prompt[:-b])
        t1 = time.perf_counter()
        logits = eval_logits(self.target, prompt[-b:], b)
        self.chooser.observe_batch(b, time.perf_counter() - t1)
        self._timed.add(b)
        return logits[-1]

    def _make_room(self, ctx: list[int], n_ctx: int, st: GenerateStats) -> int | None:
        """Free context positions for this round (shifting the context when allowed); None when full."""
        room = n_ctx - self.target.n_tokens - 1
        if room >= 0:
            return room
        if not self.context_shift:
            st.stop_reason = "context"
            return None
        shift_context(self.target, ctx, self.keep)
        if self.drafter is not None:
            self.drafter.forget()
        if self.ngram is not None:
            self.ngram.reset()
        return n_ctx - self.target.n_tokens - 1

    def _round(self, ctx: list[int], available: int, st: GenerateStats) -> list[int]:
        """One target evaluation: draft K tokens, verify [pending] + drafts in one batch, keep the accepted
        prefix and the next token; the tokens this round adds."""
        tgt = self.target
        if self._primed is not None:  # the prompt's evaluation gave the first token's logits
            logits, self._primed = self._primed, None
            self.chooser.observe_round(0.0, 1, 0)
            if self.argmax_only:
                return [int(np.argmax(logits))]
            return [sample(distribution(logits, self.params, History(ctx, [])), self.rng)]
        behind = self.drafter.behind(ctx) if self.drafter is not None else 0
        k = self.chooser.choose(available, behind) if self.drafting else 0
        timing_only = k > 0 and self._timing_only()
        t0 = time.perf_counter()
        drafts, qs = self._draft(ctx, k, st) if k > 0 else ([], [])
        n0 = tgt.n_tokens
        t1 = time.perf_counter()
        logits = eval_logits(tgt, [ctx[-1]] + drafts, 1 + len(drafts))
        dt = time.perf_counter() - t1
        st.verify_s += dt
        st.target_steps += 1
        self.chooser.observe_batch(1 + len(drafts), dt)
        self._timed.add(1 + len(drafts))
        if self.argmax_only:  # both acceptance rules reduce to argmax matching
            n_acc, nxt = verify_greedy(drafts, logits)
        else:
            ps = [distribution(logits[i], self.params, History(ctx, drafts[:i])) for i in range(len(drafts) + 1)]
            if not drafts:
                n_acc, nxt = 0, sample(ps[0], self.rng)
            elif self.acceptance_rule == "rejection":
                n_acc, nxt = verify(drafts, qs, ps, self.rng)
            else:  # sample-and-match, for comparison (llama-cpp-python's draft hook)
                n_acc, nxt = verify_sample_and_match(drafts, ps, self.rng)
        if drafts:
            if timing_only:
                self.chooser.rounds_without_draft += 1
            else:
                st.drafted += len(drafts)
                st.accepted += n_acc
                st.draft_lengths[len(drafts)] = st.draft_lengths.get(len(drafts), 0) + 1
                self.chooser.observe_acceptance(n_acc, len(drafts))
                self.chooser.rounds_without_draft = 0
        else:
            self.chooser.rounds_without_draft += 1
        tgt.n_tokens = n0 + 1 + n_acc  # roll back past the first rejection
        took = time.perf_counter() - t0 - self._load_s()
        self.chooser.observe_round(took, n_acc + 1, 0 if timing_only else len(drafts))
        return drafts[:n_acc] + [nxt]

    def _stop_reason(self, tok: int, out: "_TextStream", generated: int, n_predict: int) -> str:
        """Why generation stops after `tok` ('eos', 'stop', 'length'), or '' to go on."""
        if not self.ignore_eos and self._eog(tok):
            return "eos"
        if out.push(tok):
            return "stop"
        if generated >= n_predict:
            return "length"
        return ""

    # -- internals ------------------------------------------------------------------------------
    def _draft(self, ctx: list[int], k: int, st: GenerateStats) -> tuple[list[int], list[np.ndarray]]:
        t0 = time.perf_counter()
        if self.lookup or self._timing_only():
            # a round that only times a verification takes any drafts (verifying them keeps the
            # target's distribution), so the draft model is not loaded for it
            drafts = self.ngram.draft(ctx, k) if self.lookup else [ctx[-1]] * k
            st.lookup_s += time.perf_counter() - t0
            # one-hot proposals; greedy verification reads only the logits
            return drafts, [] if self.argmax_only else [np.eye(1, self.n_vocab, t).ravel() for t in drafts]
        drafts, qs = self.drafter.draft(ctx, k, self.params, self.rng)
        dt = time.perf_counter() - t0
        st.draft_s += dt
        self.chooser.observe_draft(dt / max(k, 1))
        return drafts, qs

    def _load_s(self) -> float:
        """The draft model's opening time, the first time it is asked for (then 0)."""
        src = self.drafter.source if self.drafter is not None else None
        if not isinstance(src, DraftModel) or not src.load_s:
            return 0.0
        s, src.load_s = src.load_s, 0.0
        return s

    def _timing_only(self) -> bool:
        """This round measures a verification's cost for a draft model that is not loaded yet."""
        return self.drafter is not None and self.chooser.measuring and not self.drafter.loaded

    def _fit_prompt(self, prompt: list[int], n_ctx: int) -> list[int]:
        if len(prompt) < n_ctx:
            return prompt
        if not self.context_shift:
            raise OptionError("the prompt has {n} tokens but the context holds {ctx}. Raise {n_ctx}, shorten the "
                              "prompt, or pass {context_shift} to drop the oldest tokens.", n=len(prompt), ctx=n_ctx)
        keep = min(self.keep, n_ctx // 2)
        tail = n_ctx // 2 - keep
        return prompt[:keep] + prompt[len(prompt) - tail:]


class _TextStream:
    """Incremental detokenization with stop strings; holds back text that may start a stop string.
    Emitted text is kept as pieces and joined once, so a long generation costs linear time."""

    def __init__(self, model, stop: tuple[str, ...], on_text):
        self.model, self.stop, self.on_text = model, tuple(s for s in stop if s), on_text
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")
        self.done: list[str] = []
        self.tail = ""  # decoded but not emitted yet: never longer than a stop string plus one token
        self.hold = max((len(s) for s in self.stop), default=1) - 1

    def push(self, tok: int) -> bool:
        self.tail += self.dec.decode(self.model.detokenize([tok]))
        # emitted text never holds a stop string's start (it is held back), so the tail is all to search
        for s in self.stop:
            i = self.tail.find(s)
            if i >= 0:
                self.tail = self.tail[:i]
                self._emit(len(self.tail))
                return True
        self._emit(len(self.tail) - self.hold)
        return False

    def _emit(self, upto: int) -> None:
        if upto > 0:
            piece, self.tail = self.tail[:upto], self.tail[upto:]
            self.done.append(piece)
            if self.on_text is not None:
                self.on_text(piece)

    def finish(self) -> str:
        self.tail += self.dec.decode(b"", final=True)
        self._emit(len(self.tail))
        return "".join(self.done)


def _eog_checker(model):
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(model.model)
    return lambda tok: bool(llama_cpp.llama_vocab_is_eog(vocab, tok))
