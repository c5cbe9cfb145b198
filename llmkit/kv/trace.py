"""Request traces for the KV simulator (`llmkit kv simulate`): read from JSONL, drawn at random
with ShareGPT-like lengths, or unfolded into the same work without sharing."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Iterable

from llmkit.errors import BadInput


@dataclass
class Request:
    id: int
    arrival: float
    prompt: int
    output: int
    prefix_id: str | None = None
    prefix_tokens: int = 0
    n: int = 1


def read_trace(lines: Iterable[str]) -> list[Request]:
    """Requests from JSONL: arrival, prompt_tokens, output_tokens, optional prefix_id/prefix_tokens, n."""
    reqs = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            r = Request(len(reqs), float(d.get("arrival", 0.0)), int(d["prompt_tokens"]), int(d["output_tokens"]),
                        d.get("prefix_id"), int(d.get("prefix_tokens", 0) or 0), int(d.get("n", 1)))
        except (ValueError, KeyError, TypeError) as e:
            raise BadInput(f"trace line {i} is not a request ({e}); each line needs prompt_tokens and output_tokens.") from None
        if r.prompt < 1 or r.output < 1 or r.n < 1 or r.arrival < 0 or not 0 <= r.prefix_tokens <= r.prompt:
            raise BadInput(f"trace line {i} has a negative or zero length (prompt {r.prompt}, output {r.output}, n {r.n}, "
                           f"prefix {r.prefix_tokens}). Lengths must be positive and prefix_tokens <= prompt_tokens.")
        reqs.append(r)
    if not reqs:
        raise BadInput("the trace is empty. Give JSONL lines with prompt_tokens and output_tokens.")
    return reqs


def synthetic_trace(n: int = 200, rate: float = 2.0, seed: int = 0, prompt_mean: int = 160, output_mean: int = 340,
                    shared_prefix: int = 0, n_samples: int = 1, max_len: int = 2048) -> list[Request]:
    """Poisson arrivals with log-normal prompt/output lengths (ShareGPT-like means), optionally a
    shared system prompt of `shared_prefix` tokens and n parallel samples per request."""
    import numpy as np

    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    sigma = 0.9

    def lengths(mean):
        return np.clip(rng.lognormal(math.log(mean) - sigma ** 2 / 2, sigma, n).astype(int), 1, max_len // 2)

    p, o = lengths(prompt_mean), lengths(output_mean)
    return [Request(i, float(t[i]), int(p[i]) + shared_prefix, int(o[i]), "system" if shared_prefix else None,
                    shared_prefix, n_samples) for i in range(n)]


@dataclass
class TraceShape:
    """The built-in trace (`synthetic_trace`): `requests` arriving at `rate` per second, prompt and
    output lengths around `prompt_mean` / `output_mean`, a common system prompt of `shared_prefix`
    tokens, `samples` parallel samples per request, drawn from `seed`."""

    requests: int = 300
    rate: float = 4.0
    prompt_mean: int = 160
    output_mean: int = 340
    shared_prefix: int = 0
    samples: int = 1
    seed: int = 0

    def draw(self, max_len: int) -> list[Request]:
        """The trace's requests, lengths capped at half of `max_len`."""
        return synthetic_trace(self.requests, self.rate, self.seed, self.prompt_mean, self.output_mean,
                               self.shared_prefix, self.samples, max_len)


def unshared(reqs: list[Request]) -> list[Request]:
    """The same work without sharing: every sample its own request, no common prefixes."""
    out = []
    for r in reqs:
        for _ in range(r.n):
            out.append(Request(len(out), r.arrival, r.prompt, r.output))
    return out
