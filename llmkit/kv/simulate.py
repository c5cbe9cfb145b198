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

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Iterable

from llmkit.errors import BadInput, OptionError
from llmkit.kv.trace import Request

POLICIES = ("max", "pow2", "oracle", "paged")


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


@dataclass(frozen=True)
class SimConfig:
    """One simulation's settings: the policy, the KV budget in tokens, and how the run proceeds."""

    policy: str
    budget_tokens: int
    block_size: int = 16
    max_len: int = 2048
    preempt: str = "recompute"  # recompute | swap
    step_seconds: float = 0.02
    max_steps: int = 2_000_000

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise BadInput(f"unknown policy '{self.policy}'. Use one of: {', '.join(POLICIES)}.")
        if self.budget_tokens < self.block_size:
            raise BadInput(f"the KV budget ({self.budget_tokens} tokens) is smaller than one block ({self.block_size} "
                           "tokens). Give a larger budget.")
        if self.preempt not in ("recompute", "swap"):
            raise BadInput(f"unknown preemption mode '{self.preempt}'. Use recompute or swap.")


@dataclass(eq=False)
class Sequence:
    """A request being served: tokens generated so far and the memory it holds (blocks, or a reservation)."""

    req: Request
    generated: int = 0
    blocks: int = 0
    reserved: int = 0


_STATES = ("used", "reserved", "internal", "external")  # tokens of the budget in each state at one step


class _PagedMemory:
    """Blocks allocated on demand; prefix blocks shared through reference counts, samples share the prompt."""

    def __init__(self, cfg: SimConfig):
        self.block = cfg.block_size
        self.n_blocks = cfg.budget_tokens // cfg.block_size
        self.free = self.n_blocks
        self.refcount: dict[tuple, int] = {}  # shared prefix blocks: key -> references
        self.hits = self.lookups = 0

    def prefix_blocks(self, r: Request) -> list[tuple]:
        if not r.prefix_id:
            return []
        return [(r.prefix_id, i) for i in range(r.prefix_tokens // self.block)]

    def private_blocks(self, r: Request, generated: int) -> int:
        """Private blocks the request's sequences hold (shared prefix blocks are counted globally)."""
        prompt_blocks = math.ceil(r.prompt / self.block) - len(self.prefix_blocks(r))
        # the n samples share the prompt's private blocks; a partially filled last prompt block is
        # copied on write for every sample but one
        tail_partial = r.prompt % self.block != 0
        per_sample = math.ceil((r.prompt % self.block + generated) / self.block) if tail_partial else \
            math.ceil(generated / self.block)
        if tail_partial and generated > 0:
            return prompt_blocks - 1 + r.n * per_sample
        return prompt_blocks + r.n * per_sample

    def admit(self, r: Request, generated: int = 0) -> Sequence | None:
        """A sequence holding its blocks, or None when they do not fit (one block is kept for growth)."""
        keys = self.prefix_blocks(r)
        new_shared = [k for k in keys if k not in self.refcount]
        private = self.private_blocks(r, generated)
        if len(new_shared) + private + 1 > self.free:
            return None
        self.lookups += len(keys)
        self.hits += len(keys) - len(new_shared)
        for k in keys:
            self.refcount[k] = self.refcount.get(k, 0) + 1
        self.free -= len(new_shared) + private
        return Sequence(r, generated, blocks=private)

    def fits_alone(self, r: Request) -> bool:
        return math.ceil((r.prompt + r.output * r.n) / self.block) + 1 <= self.n_blocks

    def growth(self, seq: Sequence) -> int:
        """Blocks the sequence needs for its next token."""
        return self.private_blocks(seq.req, seq.generated + 1) - seq.blocks

    def release(self, seq: Sequence) -> None:
        self.free += seq.blocks
        for k in self.prefix_blocks(seq.req):
            self.refcount[k] -= 1
            if self.refcount[k] == 0:
                del self.refcount[k]
                self.free += 1

    def usage(self, running: list[Sequence], pending: list) -> dict[str, int]:
        u = dict.fromkeys(_STATES, 0)
        u["used"] = len(self.refcount) * self.block
        for seq in running:
            r = seq.req
            private_tokens = r.prompt - len(self.prefix_blocks(r)) * self.block + seq.generated * r.n
            u["used"] += private_tokens
            u["internal"] += seq.blocks * self.block - private_tokens
        return u


class _ReservedMemory:
    """Contiguous reservations made at admission (Orca's max, pow2 and oracle policies), first fit."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.space = _Contiguous(cfg.budget_tokens)

    def reservation(self, r: Request) -> int:
        if self.cfg.policy == "max":
            return self.cfg.max_len * r.n
        if self.cfg.policy == "pow2":
            return (1 << math.ceil(math.log2(r.prompt + r.output))) * r.n
        return (r.prompt + r.output) * r.n

    def admit(self, r: Request, generated: int = 0) -> Sequence | None:
        size = self.reservation(r)
        if size > self.cfg.budget_tokens:
            raise BadInput(f"request {r.id} needs {size} tokens reserved, more than the whole budget.")
        if not self.space.alloc(r.id, size):
            return None
        return Sequence(r, generated, reserved=size)

    def release(self, seq: Sequence) -> None:
        self.space.free(seq.req.id)

    def usage(self, running: list[Sequence], pending: list) -> dict[str, int]:
        u = dict.fromkeys(_STATES, 0)
        for seq in running:
            r = seq.req
            cur, final = r.prompt + seq.generated * r.n, (r.prompt + r.output) * r.n
            u["used"] += cur
            u["reserved"] += final - cur
            u["internal"] += seq.reserved - final
        if pending:
            need = self.reservation(pending[0].req)
            u["external"] = sum(h for h in self.space.holes() if h < need)
        return u


@dataclass(eq=False)
class _Waiting:
    """A request waiting for admission; after a recompute preemption it resumes at `generated`."""

    req: Request
    generated: int = 0


class _Run:
    """The state of one simulation: arrivals, the waiting queue, running and swapped sequences, statistics."""

    def __init__(self, reqs: list[Request], cfg: SimConfig):
        self.cfg = cfg
        self.paged = cfg.policy == "paged"
        self.memory = _PagedMemory(cfg) if self.paged else _ReservedMemory(cfg)
        self.arrivals = sorted(reqs, key=lambda r: (r.arrival, r.id))
        self.next_arrival = 0
        self.pending: list[_Waiting] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.t, self.steps, self.done, self.preemptions, self.peak = 0.0, 0, 0, 0, 0
        self.acc = dict(used=0.0, reserved=0.0, internal=0.0, external=0.0, batch=0.0)
        self.series = {k: [] for k in ("t", "used", "reserved", "internal", "external", "batch")}

    def busy(self) -> bool:
        return bool(self.next_arrival < len(self.arrivals) or self.pending or self.running or self.swapped)

    def arrive(self) -> bool:
        """Move arrived requests to the queue; when nothing is in flight, jump to the next arrival (True)."""
        while self.next_arrival < len(self.arrivals) and self.arrivals[self.next_arrival].arrival <= self.t:
            self.pending.append(_Waiting(self.arrivals[self.next_arrival]))
            self.next_arrival += 1
        if not (self.running or self.pending or self.swapped) and self.next_arrival < len(self.arrivals):
            self.t = self.arrivals[self.next_arrival].arrival
            return True
        return False

    def admit(self) -> None:
        """Swapped-out sequences come back first, then first-come-first-served admission."""
        while self.swapped and self.paged:
            back = self.memory.admit(self.swapped[0].req, self.swapped[0].generated)
            if back is None:
                break
            self.running.append(back)
            self.swapped.pop(0)
        while self.pending and not self.swapped:
            w = self.pending[0]
            seq = self.memory.admit(w.req, w.generated)
            if seq is None:
                if self.paged and not self.memory.fits_alone(w.req):
                    r = w.req
                    raise BadInput(f"request {r.id} ({r.prompt} + {r.output} tokens x {r.n}) needs more KV blocks than "
                                   f"the budget holds ({self.memory.n_blocks}). Give a larger budget.")
                break
            self.running.append(seq)
            self.pending.pop(0)

    def preempt_for(self, seq: Sequence, need: int, finished: list[Sequence]) -> None:
        """Preempt the newest running sequences until `need` blocks are free (or `seq` itself went)."""
        mem = self.memory
        while need > mem.free:
            candidates = [s for s in self.running if s not in finished]
            if not candidates:
                return
            victim = max(candidates, key=lambda s: (s.req.arrival, s.req.id))
            self.running.remove(victim)
            mem.release(victim)
            self.preemptions += 1
            if self.cfg.preempt == "swap":
                self.swapped.append(victim)
            else:
                self.pending.insert(0, _Waiting(victim.req, victim.generated))
            if victim is seq:
                return

    def step(self) -> None:
        """One decoding step: every running sequence produces a token (paged ones grow first)."""
        finished: list[Sequence] = []
        for seq in list(self.running):
            if self.paged:
                need = self.memory.growth(seq)
                self.preempt_for(seq, need, finished)
                if seq not in self.running:
                    continue
                if need > self.memory.free:
                    raise OptionError("request {req} alone needs more KV blocks than the budget holds. "
                                      "Give a larger budget or a shorter {max_len}.", req=seq.req.id)
                self.memory.free -= need
                seq.blocks += need
            seq.generated += 1
            if seq.generated >= seq.req.output:
                finished.append(seq)
        for seq in finished:
            self.running.remove(seq)
            self.memory.release(seq)
            self.done += 1

    def account(self) -> None:
        """Add this step's memory split to the averages and, every tenth step, to the time series."""
        u = self.memory.usage(self.running, self.pending)
        n_run = len(self.running)
        self.peak = max(self.peak, n_run)
        for k in _STATES:
            self.acc[k] += u[k]
        self.acc["batch"] += n_run
        if self.steps % 10 == 0:
            self.series["t"].append(self.t)
            for k in _STATES:
                self.series[k].append(u[k] / self.cfg.budget_tokens)
            self.series["batch"].append(n_run)
        self.steps += 1
        self.t += self.cfg.step_seconds

    def result(self) -> SimResult:
        s, budget = max(self.steps, 1), self.cfg.budget_tokens
        frac = {k: self.acc[k] / s / budget for k in ("used", "reserved", "internal", "external")}
        mem = self.memory
        hits, lookups = (mem.hits, mem.lookups) if self.paged else (0, 0)
        return SimResult(policy=self.cfg.policy, completed=self.done, sim_seconds=self.t,
                         throughput_rps=self.done / self.t if self.t else 0.0, peak_batch=self.peak,
                         mean_batch=self.acc["batch"] / s, used=frac["used"], reserved=frac["reserved"],
                         internal=frac["internal"], external=frac["external"], free=1 - sum(frac.values()),
                         prefix_hit_rate=hits / lookups if lookups else 0.0, preemptions=self.preemptions,
                         series=self.series)


def simulate(reqs: list[Request], policy: str, budget_tokens: int, block_size: int = 16, max_len: int = 2048,
             preempt: str = "recompute", step_seconds: float = 0.02, max_steps: int = 2_000_000) -> SimResult:
    """Run the trace to completion under one policy (the requests themselves are not changed)."""
    cfg = SimConfig(policy, budget_tokens, block_size, max_len, preempt, step_seconds, max_steps)
    cfg.validate()
    # an output longer than the longest sequence stops at it
    reqs = [r if r.prompt + r.output <= max_len else replace(r, output=max(1, max_len - r.prompt)) for r in reqs]
    run = _Run(reqs, cfg)
    while run.busy() and run.steps < cfg.max_steps:
        if run.arrive():
            continue
        run.admit()
        run.step()
        run.account()
    if run.steps >= cfg.max_steps:
        raise BadInput(f"the simulation did not finish in {cfg.max_steps} steps; the budget may be too small for the trace.")
    return run.result()


def compare(reqs: list[Request], policies: Iterable[str], budget_tokens: int, block_size: int = 16,
            max_len: int = 2048, preempt: str = "recompute", step_seconds: float = 0.02) -> list[SimResult]:
    """The same trace simulated under each policy."""
    return [simulate(reqs, pol, budget_tokens, block_size, max_len, preempt, step_seconds) for pol in policies]


def memory_chart(results: list[SimResult]):
    """Memory use over time per policy (used, reserved, internal and external fragmentation, stacked)."""
    from llmkit.plot import Panel, Series

    parts = (("used", "used", "#2b8a3e"), ("reserved", "reserved", "#74c0fc"),
             ("internal", "internal frag.", "#ffa94d"), ("external", "external frag.", "#e03131"))
    return [Panel(f"{r.policy}: mean batch {r.mean_batch:.1f}, {r.throughput_rps:.2f} req/s, waste "
                  f"{100 * (r.reserved + r.internal + r.external):.0f}%", "simulated seconds", "share of KV",
                  [Series(label, r.series["t"], r.series[key], style="area", color=color) for key, label, color in parts],
                  ylim=(0, 1))
            for r in results]
