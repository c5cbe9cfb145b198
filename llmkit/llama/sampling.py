"""Sampling as pure numpy functions: logits + parameters -> a probability distribution.

Speculative decoding needs the *distributions* (not just a sampled token) of both models, so the
same processing runs for target and draft, in llama.cpp's default order: repeat penalty, top-k,
top-p, min-p, temperature (tested against llama.cpp's sampler chain).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmkit.errors import OptionError


@dataclass
class SamplingParams:
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    def validate(self) -> None:
        if self.temp < 0:
            raise OptionError("{temp} must be >= 0, got {value}.", value=self.temp)
        if self.top_k < 0:
            raise OptionError("{top_k} must be >= 0 (0 = off), got {value}.", value=self.top_k)
        if not 0.0 < self.top_p <= 1.0:
            raise OptionError("{top_p} must be in (0, 1], got {value}.", value=self.top_p)
        if not 0.0 <= self.min_p < 1.0:
            raise OptionError("{min_p} must be in [0, 1), got {value}.", value=self.min_p)
        if self.repeat_penalty <= 0:
            raise OptionError("{repeat_penalty} must be > 0, got {value}.", value=self.repeat_penalty)

    @property
    def greedy(self) -> bool:
        return self.temp <= 0


def distribution(logits: np.ndarray, params: SamplingParams, history=()) -> np.ndarray:
    """The probability of every token after the repeat penalty, top-k, top-p, min-p and temperature.

    >>> distribution(np.array([1.0, 3.0, 2.0]), SamplingParams(temp=0)).tolist()
    [0.0, 1.0, 0.0]
    """
    if params.greedy and (params.repeat_penalty == 1.0 or not len(history)):  # no copy of the logits needed
        p = np.zeros(len(logits))
        p[int(np.argmax(logits))] = 1.0
        return p
    x = np.array(logits, dtype=np.float64)
    if params.repeat_penalty != 1.0 and len(history):
        recent = np.unique(np.asarray(history[-params.repeat_last_n:], dtype=np.int64))
        v = x[recent]
        x[recent] = np.where(v > 0, v / params.repeat_penalty, v * params.repeat_penalty)
    if params.greedy:
        p = np.zeros_like(x)
        p[int(np.argmax(x))] = 1.0
        return p
    # llama.cpp's chain order (llama-server, llama-cli, llama-cpp-python): top-k, top-p and min-p
    # choose the candidates on the untempered logits, then temperature reshapes the survivors
    keep = np.ones(len(x), dtype=bool)
    if 0 < params.top_k < len(x):
        kth = np.partition(x, -params.top_k)[-params.top_k]
        keep &= x >= kth
    if params.top_p < 1.0:
        p = _softmax(np.where(keep, x, -np.inf))
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        cut = int(np.searchsorted(cum, params.top_p)) + 1  # smallest prefix with mass >= top_p
        mask = np.zeros(len(p), dtype=bool)
        mask[order[:cut]] = True
        keep &= mask
    if params.min_p > 0.0:
        keep &= x >= x[keep].max() + np.log(params.min_p)  # p >= min_p * p_max
    return _softmax(np.where(keep, x / params.temp, -np.inf))


def _softmax(x: np.ndarray) -> np.ndarray:
    p = np.exp(x - x.max())
    return p / p.sum()


class History:
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


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token from a distribution (inverse CDF; argmax for one-hot)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))
