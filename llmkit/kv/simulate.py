"""A PagedAttention simulator: replay requests against a KV memory budget under allocation policies.

Iteration-level (continuous) batching: each step every running sequence produces one token; new
requests are admitted first-come-first-served when memory allows. Policies (vLLM paper, Fig. 2):
  max     reserve prompt + max length contiguously at admission (Orca "Max")
  pow2    reserve prompt + output rounded up to a power of two (Orca "Pow2")
  oracle  reserve exactly prompt + output (Orca "Oracle")
  paged   blocks of `block_size` tokens allocated on demand through a block table; blocks keyed by
          a hash of their tokens and all preceding tokens are shared (reference counts) between
          requests with a common prefix and between the n samples / beams of one request, with
          copy-on-write for a shared partially filled block. When memory runs out the newest
          running request is preempted by recompute (blocks freed, prompt re-read later) or swap.
Memory each step is split into used (tokens stored), reserved (held for future tokens of the same
request), internal fragmentation (held but never used), external fragmentation (free space in
holes too small for the waiting request) and free.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Iterable

import numpy as np

from llmkit.errors import BadInput, OptionError

POLICIES = ("max", "pow2", "oracle", "paged")


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
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    sigma = 0.9

    def lengths(mean):
        return np.clip(rng.lognormal(math.log(mean) - sigma ** 2 / 2, sigma, n).astype(int), 1, max_len // 2)

    p, o = lengths(prompt_mean), lengths(output_mean)
    return [Request(i, float(t[i]), int(p[i]) + shared_prefix, int(o[i]), "system" if shared_prefix else None,
                    shared_prefix, n_samples) for i in range(n)]


@dataclass
class SimResult:
    policy: str
    completed: int
    sim_seconds: float
    throughput_rps: float
    peak_batch: int
    mean_batch: float
    used: float  # shares of the budget, time-averaged over steps
    reserved: float
    internal: float
    external: float
    free: float
    prefix_hit_rate: float
    preemptions: int
    series: dict = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("series")
        d["waste"] = self.reserved + self.internal + self.external
        return d


class _Contiguous:
    """First-fit allocation of contiguous reservations over a linear KV space."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.spans: dict[int, tuple[int, int]] = {}  # seq -> (start, size)

    def holes(self) -> list[int]:
        used = sorted(self.spans.values())
        out, pos = [], 0
        for s, n in used:
            if s > pos:
                out.append(s - pos)
            pos = s + n
        if pos < self.capacity:
            out.append(self.capacity - pos)
        return out

    def alloc(self, seq: int, size: int) -> bool:
        pos = 0
        for s, n in sorted(self.spans.values()):
            if s - pos >= size:
                break
            pos = s + n
        if pos + size > self.capacity:
            return False
        self.spans[seq] = (pos, size)
        return True

    def free(self, seq: int) -> None:
        self.spans.pop(seq, None)


def simulate(reqs: list[Request], policy: str, budget_tokens: int, block_size: int = 16, max_len: int = 2048,
             preempt: str = "recompute", step_seconds: float = 0.02, max_steps: int = 2_000_000) -> SimResult:
    """Run the trace to completion under one policy."""
    if policy not in POLICIES:
        raise BadInput(f"unknown policy '{policy}'. Use one of: {', '.join(POLICIES)}.")
    if budget_tokens < block_size:
        raise BadInput(f"the KV budget ({budget_tokens} tokens) is smaller than one block ({block_size} tokens). "
                       "Give a larger budget.")
    if preempt not in ("recompute", "swap"):
        raise BadInput(f"unknown preemption mode '{preempt}'. Use recompute or swap.")
    for r in reqs:
        if r.prompt + r.output > max_len:
            r.output = max(1, max_len - r.prompt)
    paged = policy == "paged"
    cont = None if paged else _Contiguous(budget_tokens)
    n_blocks = budget_tokens // block_size
    free_blocks = n_blocks
    refcount: dict[tuple, int] = {}  # shared prefix blocks: key -> references
    waiting = sorted(reqs, key=lambda r: (r.arrival, r.id))
    running: list[dict] = []
    swapped: list[dict] = []
    done = 0
    t = 0.0
    steps = 0
    hits = lookups = preemptions = 0
    series = {k: [] for k in ("t", "used", "reserved", "internal", "external", "batch")}
    acc = dict(used=0.0, reserved=0.0, internal=0.0, external=0.0, batch=0.0)
    peak = 0
    queue = list(waiting)
    qi = 0
    pending: list[Request] = []

    def prefix_blocks(r: Request) -> list[tuple]:
        if not r.prefix_id:
            return []
        return [(r.prefix_id, i) for i in range(r.prefix_tokens // block_size)]

    def reservation(r: Request) -> int:
        if policy == "max":
            return max_len
        if policy == "pow2":
            return 1 << math.ceil(math.log2(r.prompt + r.output))
        return r.prompt + r.output

    def seq_blocks(state) -> int:
        """Private blocks the request's sequences hold (shared prefix blocks are counted globally)."""
        r = state["req"]
        shared = len(prefix_blocks(r))
        prompt_blocks = math.ceil(r.prompt / block_size) - shared
        gen = state["generated"]
        # the n samples share the prompt's private blocks; a partially filled last prompt block is
        # copied on write for every sample but one
        tail_partial = r.prompt % block_size != 0
        per_sample = math.ceil((r.prompt % block_size + gen) / block_size) if tail_partial else math.ceil(gen / block_size)
        if tail_partial and gen > 0:
            return prompt_blocks - 1 + r.n * per_sample
        return prompt_blocks + r.n * per_sample

    def admit_paged(r: Request, generated: int = 0) -> dict | None:
        nonlocal free_blocks, hits, lookups
        keys = prefix_blocks(r)
        new_shared = [k for k in keys if k not in refcount]
        state = {"req": r, "generated": generated}
        need = len(new_shared) + seq_blocks(state) + 1
        if need > free_blocks:
            return None
        lookups += len(keys)
        hits += len(keys) - len(new_shared)
        for k in keys:
            refcount[k] = refcount.get(k, 0) + 1
        free_blocks -= len(new_shared) + seq_blocks(state)
        state["blocks"] = seq_blocks(state)
        return state

    def release_paged(state) -> None:
        nonlocal free_blocks
        free_blocks += state["blocks"]
        for k in prefix_blocks(state["req"]):
            refcount[k] -= 1
            if refcount[k] == 0:
                del refcount[k]
                free_blocks += 1

    while (qi < len(queue) or pending or running or swapped) and steps < max_steps:
        while qi < len(queue) and queue[qi].arrival <= t:
            pending.append(queue[qi])
            qi += 1
        if not running and not pending and not swapped and qi < len(queue):
            t = queue[qi].arrival
            continue
        # swapped-out requests come back first, then FCFS admission
        while swapped and paged:
            st = swapped[0]
            back = admit_paged(st["req"], st["generated"])
            if back is None:
                break
            back["generated"] = st["generated"]
            running.append(back)
            swapped.pop(0)
        while pending and not swapped:
            r = pending[0]
            if paged:
                st = admit_paged(r, r.__dict__.get("_resume", 0))
                if st is None:
                    if math.ceil((r.prompt + r.output * r.n) / block_size) + 1 > n_blocks:
                        raise BadInput(f"request {r.id} ({r.prompt} + {r.output} tokens x {r.n}) needs more KV blocks "
                                       f"than the budget holds ({n_blocks}). Give a larger budget.")
                    break
                st["generated"] = r.__dict__.pop("_resume", 0)
            else:
                size = reservation(r) * r.n
                if size > budget_tokens:
                    raise BadInput(f"request {r.id} needs {size} tokens reserved, more than the whole budget.")
                if not cont.alloc(r.id, size):
                    break
                st = {"req": r, "generated": 0, "reserved": size}
            running.append(st)
            pending.pop(0)
        # one decode step for every running request
        finished = []
        for st in list(running):
            if paged:
                need = seq_blocks({"req": st["req"], "generated": st["generated"] + 1}) - st["blocks"]
                while need > free_blocks:
                    candidates = [s for s in running if s not in finished]
                    if not candidates:
                        break
                    victim = max(candidates, key=lambda s: (s["req"].arrival, s["req"].id))
                    running.remove(victim)
                    release_paged(victim)
                    preemptions += 1
                    if preempt == "swap":
                        swapped.append(victim)
                    else:
                        victim["req"].__dict__["_resume"] = victim["generated"]
                        pending.insert(0, victim["req"])
                    if victim is st:
                        break
                if st not in running:
                    continue
                if need > free_blocks:
                    raise OptionError("request {req} alone needs more KV blocks than the budget holds. "
                                      "Give a larger budget or a shorter {max_len}.", req=st["req"].id)
                free_blocks -= need
                st["blocks"] += need
            st["generated"] += 1
            if st["generated"] >= st["req"].output:
                finished.append(st)
        for st in finished:
            running.remove(st)
            if paged:
                release_paged(st)
            else:
                cont.free(st["req"].id)
            done += 1
        # memory accounting for this step
        used = reserved = internal = 0
        for st in running:
            r = st["req"]
            cur = (r.prompt + st["generated"] * r.n) if not paged else None
            if paged:
                shared = len(prefix_blocks(r)) * block_size
                private_tokens = r.prompt - shared + st["generated"] * r.n
                used += private_tokens
                internal += st["blocks"] * block_size - private_tokens
            else:
                final = (r.prompt + r.output) * r.n
                used += cur
                reserved += final - cur
                internal += st["reserved"] - final
        if paged:
            used += len(refcount) * block_size
            external = 0
        else:
            hs = cont.holes()
            need = reservation(pending[0]) * pending[0].n if pending else 0
            external = sum(h for h in hs if h < need) if need else 0
        n_run = len(running)
        peak = max(peak, n_run)
        for k, v in (("used", used), ("reserved", reserved), ("internal", internal), ("external", external), ("batch", n_run)):
            acc[k] += v
        if steps % 10 == 0:
            series["t"].append(t)
            for k, v in (("used", used), ("reserved", reserved), ("internal", internal), ("external", external)):
                series[k].append(v / budget_tokens)
            series["batch"].append(n_run)
        steps += 1
        t += step_seconds
    if steps >= max_steps:
        raise BadInput(f"the simulation did not finish in {max_steps} steps; the budget may be too small for the trace.")
    s = max(steps, 1)
    frac = {k: acc[k] / s / budget_tokens for k in ("used", "reserved", "internal", "external")}
    return SimResult(policy=policy, completed=done, sim_seconds=t, throughput_rps=done / t if t else 0.0, peak_batch=peak,
                     mean_batch=acc["batch"] / s, used=frac["used"], reserved=frac["reserved"], internal=frac["internal"],
                     external=frac["external"], free=1 - sum(frac.values()),
                     prefix_hit_rate=hits / lookups if lookups else 0.0, preemptions=preemptions, series=series)


def compare(reqs: list[Request], policies: Iterable[str], budget_tokens: int, block_size: int = 16,
            max_len: int = 2048, preempt: str = "recompute", step_seconds: float = 0.02) -> list[SimResult]:
    """The same trace simulated under each policy (every run on its own copy of the requests)."""
    import copy

    return [simulate(copy.deepcopy(reqs), pol, budget_tokens, block_size, max_len, preempt, step_seconds)
            for pol in policies]


def plot(results: list[SimResult], path: str) -> None:
    """Memory use over time per policy as a PNG (written atomically)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from llmkit.io import atomic_write_bytes

    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.4 * len(results)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        s = r.series
        ax.stackplot(s["t"], s["used"], s["reserved"], s["internal"], s["external"],
                     labels=["used", "reserved", "internal frag.", "external frag."],
                     colors=["#2b8a3e", "#74c0fc", "#ffa94d", "#e03131"])
        ax.set_ylim(0, 1)
        ax.set_ylabel("share of KV")
        ax.set_title(f"{r.policy}: mean batch {r.mean_batch:.1f}, {r.throughput_rps:.2f} req/s, waste "
                     f"{100 * (r.reserved + r.internal + r.external):.0f}%", fontsize=9)
    axes[0, 0].legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("simulated seconds")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def unshared(reqs: list[Request]) -> list[Request]:
    """The same work without sharing: every sample its own request, no common prefixes."""
    out = []
    for r in reqs:
        for _ in range(r.n):
            out.append(Request(len(out), r.arrival, r.prompt, r.output))
    return out
