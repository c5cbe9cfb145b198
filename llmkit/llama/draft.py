"""Drafting for speculative decoding: the draft model's side, the draft-length policy, and the
check that a draft model shares the target's vocabulary.

The acceptance rule itself is in `speculative` (pure functions); the loop that verifies drafts
with the target is `generate.Generator`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from llmkit.errors import BadInput
from llmkit.llama.cache import common_prefix, eval_logits
from llmkit.llama.sampling import History, SamplingParams, distribution, sample
from llmkit.llama.speculative import expected_tokens


@dataclass
class DraftOptions:
    """How generation drafts: with the draft model at `path` (opened only once drafting is chosen) or
    by prompt lookup with n-grams up to `lookup` tokens, at most `max` and at least `min` draft tokens
    per step; `adaptive` lets the chooser pick the length (and skip drafting where it does not pay)."""

    path: str | None = None
    lookup: int = 0
    max: int = 8
    min: int = 0
    adaptive: bool = True

    def model(self, open_model: Callable[[str], object]) -> "DraftModel | None":
        """The draft model, loaded by `open_model(path)` on first use; None without one."""
        return DraftModel(self.path, open_model) if self.path else None


class DraftLengthChooser:
    """Picks K each round from measured verify cost T(b) (b = K + 1 tokens), draft cost per token
    and the running acceptance rate: maximise E[tokens](alpha, K) / (K * t_draft + T(K + 1)).

    K stays within [k_min, k_max]; with k_min = 0 the chooser may also not draft at all (K = 0) where
    drafting does not pay, with k_min >= 1 it always drafts at least k_min (llama.cpp's --draft-min).

    With k_min = 0 drafting is also held to a loss budget: what the drafting rounds so far cost beyond
    plain decoding of the tokens they gave, plus the most the next round could lose (every draft
    rejected), may not pass `risk` times the plain decoding time of the tokens generated so far. The
    acceptance rate is a guess until rounds are seen, and a guess that is wrong early in a short run
    costs a large share of it; the budget grows with the run, and drafting that pays earns its own."""

    def __init__(self, k_min: int, k_max: int, adaptive: bool, draft_cost_known_zero: bool = False,
                 draft_cost_ratio: float = 0.2):
        self.k_min, self.k_max, self.adaptive = max(1, k_min), k_max, adaptive
        self.may_skip = k_min == 0
        self.t_batch: dict[int, float] = {}
        self.t_draft = 0.0 if draft_cost_known_zero else None
        # decoding is memory-bound: before measuring, a draft token costs about T(1) times the ratio
        # of the two models' weight bytes
        self.draft_cost_ratio = draft_cost_ratio
        self.alpha = 0.7
        self.rounds_without_draft = 0
        self.probe_every = 32
        self.risk = 0.02
        self.generated = 0  # tokens produced so far, by every round
        self.loss = 0.0  # seconds the drafting rounds took beyond plain decoding of the tokens they gave
        self.measuring = False  # the K last chosen only times a verification (no batch timed yet)

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

    def observe_round(self, seconds: float, produced: int, drafted: int) -> None:
        """A round took `seconds` (drafting and verification) and gave `produced` tokens."""
        self.generated += produced
        if drafted:
            self.loss += seconds - produced * self.cost(1)

    def _affordable(self, k: int, td: float) -> bool:
        """Whether a round of k drafts stays within the loss budget even if every draft is rejected (a
        draft model's catch-up is left out: it serves every later round, and once paid it is in the loss)."""
        worst = k * td + self.cost(k + 1) - self.cost(1)
        return self.loss + worst <= self.risk * self.cost(1) * self.generated

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

    def could_pay(self) -> bool:
        """Whether drafting could pay at all with the costs timed so far: the most it could ever give
        (every draft accepted) beats plain decoding by 30 %."""
        td = self.t_draft if self.t_draft is not None else self.cost(1) * self.draft_cost_ratio
        return self._ideal_rate(td, self.k_max) * self.cost(1) > 1.3

    def _ideal_rate(self, td: float, k_max: int) -> float:
        return max(expected_tokens(1.0, k) / (k * td + self.cost(k + 1)) for k in range(self.k_min, k_max + 1))

    def choose(self, available: int, behind: int = 0) -> int:
        """Best K for the next round; `behind` = tokens the draft model must catch up on first,
        `available` = tokens still to generate (over which a catch-up is paid off)."""
        self.measuring = False
        k_max = min(self.k_max, available)
        if k_max < self.k_min:
            return 0
        if not self.adaptive or self.k_min == self.k_max:  # a fixed length (the clamped k_max is not one)
            return k_max
        if 1 not in self.t_batch and self.may_skip:
            return 0  # measure plain decoding first
        if not any(b > 1 for b in self.t_batch) and self.rounds_without_draft > 0:
            self.measuring = True
            return k_max  # short prompt: no batch was timed in prefill, so measure one verification
        td = self.t_draft if self.t_draft is not None else self.cost(1) * self.draft_cost_ratio
        catch_up = behind * td * 0.5 if self.t_draft != 0.0 else 0.0  # batched catch-up, ~half a step each
        best_k, best_rate = (0, 1.0 / self.cost(1)) if self.may_skip else (self.k_min, 0.0)
        for k in range(self.k_min, k_max + 1):
            if self.may_skip and not self._affordable(k, td):
                break  # a longer round could lose more still
            e = expected_tokens(self.alpha, k)
            # the catch-up is paid once and then serves every round to the end: each round's share
            rate = e / (k * td + self.cost(k + 1) + catch_up * e / max(available, 1))
            if rate > best_rate * 1.001:
                best_k, best_rate = k, rate
        # the most drafting could ever give (every draft accepted): probes re-sync the draft model,
        # which costs real time, so only probe when a changed acceptance rate could pay well
        if (best_k == 0 and self.may_skip and self.rounds_without_draft >= self.probe_every
                and self._ideal_rate(td, k_max) * self.cost(1) > 1.3):
            # occasional probe so a changed acceptance rate is noticed (the loop above checked the
            # budget of every K it chose; a probe's is checked here)
            if not self._affordable(self.k_min, td):
                return 0
            best_k = self.k_min
            self.probe_every *= 2  # back off while probes keep failing
        elif best_k > 0:
            self.probe_every = 32
        return best_k


class DraftModel:
    """A draft GGUF opened on first use, so that a run in which drafting never pays (the target's
    batches cost about as much as that many single steps) never loads it."""

    def __init__(self, path: str, opener: Callable[[str], object]):
        import os

        if not os.path.isfile(path):
            raise BadInput(f"draft model '{path}' does not exist. Check the path given to --draft-model.")
        self.path, self.opener, self.model = path, opener, None
        self.check: Callable[[object], None] | None = None  # run on the model once opened (vocabulary)
        self.load_s = 0.0  # what opening it took (a one-off, not a drafting round's cost)

    def get(self):
        if self.model is None:
            t0 = time.perf_counter()
            model = self.opener(self.path)
            self.load_s = time.perf_counter() - t0
            if self.check is not None:
                self.check(model)
            self.model = model
        return self.model


class ModelDrafter:
    """A draft model reading the same context as the target and proposing tokens by sampling."""

    window = 512  # a draft that fell further behind re-reads only this many recent tokens

    def __init__(self, source, n_vocab: int):
        self.source, self.n_vocab = source, n_vocab  # source: a model, or a DraftModel opened on first use
        self.offset = 0  # the draft's cache holds ctx[offset:] from its position 0
        self.synced = 0  # of those, the first `synced` are known to be in the draft's cache
        self.last = None  # the draft's logits after its last cached token

    @property
    def loaded(self) -> bool:
        return not isinstance(self.source, DraftModel) or self.source.model is not None

    @property
    def model(self):
        return self.source.get() if isinstance(self.source, DraftModel) else self.source

    def prefill(self, prompt: list[int]) -> None:
        """Read the prompt (a draft not loaded yet reads it when it first drafts)."""
        if not self.loaded:
            return
        self.model.reset()
        self.offset = 0
        self.last = eval_logits(self.model, prompt)[0]
        self.synced = len(prompt)

    def behind(self, ctx: list[int]) -> int:
        """Tokens of the context the draft model must read before it can draft."""
        held = self.offset + self.model.n_tokens if self.loaded else 0
        return min(max(len(ctx) - held, 0), self.window)

    def forget(self) -> None:
        """The target's context shifted: re-read it from the start on the next draft."""
        if self.loaded:
            self.model.n_tokens = 0
        self.offset = self.synced = 0

    def draft(self, ctx: list[int], k: int, params: SamplingParams,
              rng: np.random.Generator) -> tuple[list[int], list[np.ndarray]]:
        """k proposed tokens after ctx and the distribution each was drawn from (none for greedy decoding
        without a repeat penalty, whose verification reads only the target's logits)."""
        d = self.model
        n_rel = len(ctx) - self.offset
        # the context only grew since the last round, so the comparison starts where the two last agreed
        s = min(self.synced, d.n_tokens, n_rel)
        common = s + common_prefix(d.input_ids[s:d.n_tokens], ctx[self.offset + s:])
        if n_rel - common > self.window:  # far behind: read only the recent window (positions restart at 0)
            self.offset, common = len(ctx) - self.window, 0
            n_rel = self.window
        if not (common == n_rel == d.n_tokens and self.last is not None):  # else `last` follows the last token
            common = min(common, n_rel - 1)  # the last context token is evaluated again for its logits
            d.n_tokens = common
            # catching up after rounds without drafting: only the last position's logits are read
            self.last = eval_logits(d, ctx[self.offset + common:])[0]
        self.synced = n_rel
        drafts, qs = [], []
        argmax_only = params.greedy and params.repeat_penalty == 1.0  # greedy verification needs no q
        for j in range(k):
            # the draft may have a few more or fewer (padding) tokens: it proposes only target ids
            if argmax_only:
                x = int(np.argmax(fit_vocab(self.last, self.n_vocab)))
            else:
                q = distribution(fit_vocab(self.last, self.n_vocab), params, History(ctx, drafts))
                x = sample(q, rng)
                qs.append(q)
            drafts.append(x)
            if j < k - 1:
                self.last = eval_logits(d, [x])[0]
        return drafts, qs


def fit_vocab(logits: np.ndarray, n: int) -> np.ndarray:
    """Logits cut or padded (with -inf) to n entries.

    >>> fit_vocab(np.array([1.0, 2.0]), 3).tolist()
    [1.0, 2.0, -inf]
    """
    if len(logits) == n:
        return logits
    if len(logits) > n:
        return logits[:n]
    return np.concatenate([logits, np.full(n - len(logits), -np.inf, dtype=logits.dtype)])


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
