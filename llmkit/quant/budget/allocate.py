"""Per-tensor types chosen under a size budget (a target in bits per weight or in bytes).

llama.cpp's mixes (Q4_K_M, ...) give every model the same recipe. Here each tensor's type is chosen
for this model, ExLlamaV2-style:

1. Error of a candidate (`measure.py`): a sample of the tensor's rows quantized with llmkit's
   byte-exact quantizers; the activation-weighted squared error (the imatrix's column weights, or 1),
   scaled to all rows.
2. Sensitivity (`probe.py`): how much the model's output (KL divergence) moves per unit of a kind's
   error, so sensitivity x error predicts a KLD. Without llama.cpp to run the model, or with
   probe=False, each kind keeps the bytes llama.cpp's own mixes give it at this size (`priors.py`)
   and spends them on the tensors and types its errors favour (`solve_by_kind`).
3. Solver: a multiple-choice knapsack by Lagrangian relaxation (each tensor takes the type that
   minimises sensitivity x error + lambda x bytes; lambda bisected to the largest allocation that
   fits), then the remaining bytes go to the upgrades with the best error saved per byte. The result
   is checked against every llama.cpp mix that fits, so it is never predicted worse than llama.cpp's
   recipe of its size.

1-D tensors (norms) and tensors llama.cpp never quantizes keep their type; a candidate needs row
lengths its block size divides. At or below GRID_MAX_BPW bits per weight with an imatrix the
candidates include the lattice i-quants for the tensors it covers. Measurements and what was tried:
docs/design/quant-budget.md.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import numpy as np

from llmkit.errors import BadInput, MissingDependency
from llmkit.gguf.reader import read_gguf
from llmkit.gguf.types import ALIGNMENT
from llmkit.quant.budget.measure import GRID_MAX_BPW, Item, grid_names, measure, shape_items
from llmkit.quant.budget.priors import bracket, group_key, kind_budgets, layer_groups, llama_mixes, mix_bytes
from llmkit.quant.budget.probe import PROBE_SEQS, PROBE_TOKENS, cached_probe, probe_key, probe_sensitivity, store_probe
from llmkit.quant.formats.jit import DEFAULT, Kernels
from llmkit.quant.plan import rules
from llmkit.quant.plan.tensors import check_imatrix_covers
from llmkit.quant.write.quantize import output_header


@dataclass
class Allocation:
    assign: dict  # tensor -> type
    budget: int  # bytes allowed for the tensors' data (+ header for a target size)
    used: int
    predicted: float  # sensitivity-weighted error sum (predicted KLD with probes)
    sensitivity: dict  # kind -> factor
    sensitivity_source: str  # "probe" | "cached probe" | "llama.cpp mixes" | "none"
    items: list[Item]
    seconds: float = 0.0
    probe_text: str | None = None  # what the probes read: "calibration text" | "the model's own text"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["items"] = [{"name": i.name, "kind": i.kind, "type": i.chosen, "bytes": i.bytes.get(i.chosen),
                       "error": i.error.get(i.chosen)} for i in self.items]
        return d


def solve(items: list[Item], budget: int, sensitivity: dict | None = None) -> tuple[int, float]:
    """Choose each item's type: minimise sum(sensitivity x error) with sum(bytes) <= budget.
    Returns (bytes used, predicted error)."""
    used, predicted, _ = lagrange(items, budget, sensitivity)
    return used, predicted


def weighted_cost(sensitivity: dict | None, group: dict | None = None):
    """cost(item, type): the kind's (or the item's group's) sensitivity (1 where it has none) x the
    type's measured error."""
    s = sensitivity or {}
    key = group_key(group)
    return lambda i, t: s.get(key(i), 1.0) * i.error[t]


def settle(items: list[Item], cost) -> float:
    """Fixed tensors keep their type; returns the predicted error of the others' chosen types."""
    for i in items:
        if i.fixed is not None:
            i.chosen = i.fixed
    return float(sum(cost(i, i.chosen) for i in items if i.fixed is None))


def lagrange(items: list[Item], budget: int, sensitivity: dict | None = None,
             group: dict | None = None) -> tuple[int, float, float]:
    """solve(), also returning the price lambda (error per byte) of the allocation."""
    cost = weighted_cost(sensitivity, group)
    free = [i for i in items if i.fixed is None]
    fixed_bytes = check_budget(items, budget)

    def pick(lam):
        total = fixed_bytes
        for i in free:
            i.chosen = min(i.bytes, key=lambda t: (cost(i, t) + lam * i.bytes[t], i.bytes[t]))
            total += i.bytes[i.chosen]
        return total

    lo, hi = 0.0, 1.0
    while pick(hi) > budget:
        hi *= 4
        if hi > 1e30:
            break
    for _ in range(100):  # bisection on lambda: the smallest lambda whose allocation fits
        mid = (lo + hi) / 2
        if pick(mid) > budget:
            lo = mid
        else:
            hi = mid
    used = spend(free, pick(hi), budget, cost)
    return used, settle(items, cost), hi


def solve_by_kind(items: list[Item], budget: int, kind_bytes: dict,
                  group: dict | None = None) -> tuple[int, float, dict]:
    """Each kind of tensor (or `group`: name -> group) spends `kind_bytes[kind]` (llama.cpp's split
    of this budget), on the types and tensors its measured errors favour; what rounding leaves is
    spent across kinds at the kinds' own prices. Returns (bytes used, predicted error, kind ->
    weight): a kind's weight is the inverse of its price, so that the predicted error counts every
    kind as its budget implies."""
    free = [i for i in items if i.fixed is None]
    fixed_bytes = check_budget(items, budget)
    key = group_key(group)
    price = {}
    for kind, b in kind_bytes.items():
        members = [i for i in free if key(i) == kind]
        least, most = sum(min(i.bytes.values()) for i in members), sum(max(i.bytes.values()) for i in members)
        if least >= most:  # one candidate type only: nothing to choose
            for i in members:
                i.chosen = min(i.bytes, key=i.bytes.get)
            continue
        b = min(max(b, least), most - 1)
        _, _, price[kind] = lagrange(members, b)
    logs = [np.log(p) for p in price.values() if p > 0]
    mid = float(np.exp(-np.mean(logs))) if logs else 1.0
    sens = {k: (1.0 / p / mid if p > 0 else 1.0) for k, p in price.items()}
    used = fixed_bytes + sum(i.bytes[i.chosen] for i in free)
    if used > budget:  # a kind's share clipped up to its smallest types: the global solver decides
        used, predicted, _ = lagrange(items, budget, sens, group)
        return used, predicted, sens

    cost = weighted_cost(sens, group)
    used = spend(free, used, budget, cost)
    return used, settle(items, cost), sens


def kind_weights(items: list[Item], group: dict, by_group: dict) -> dict:
    """kind -> weight for the report: the mean of its groups' weights, each group counted by its
    tensors' weights (how many), so a kind reads as one number."""
    tot: dict = {}
    for i in items:
        if i.fixed is None and group.get(i.name) in by_group:
            n = float(np.prod(i.shape))
            a = tot.setdefault(i.kind, [0.0, 0.0])
            a[0] += n * by_group[group[i.name]]
            a[1] += n
    return {k: a / b for k, (a, b) in tot.items() if b}


def near_types(items: list[Item], near: list[dict]) -> None:
    """Keep each tensor's candidates within one step of the types the mixes around the budget give
    it: from the next smaller candidate below the smallest of them to the next larger above the
    largest (the measured errors choose among neighbours, not across the whole ladder)."""
    for i in items:
        if i.fixed is not None:
            continue
        mine = [t[i.name] for t in near if t.get(i.name) in i.bytes]
        if not mine:
            continue
        lo, hi = min(i.bytes[t] for t in mine), max(i.bytes[t] for t in mine)
        sizes = sorted(set(i.bytes.values()))
        k_lo, k_hi = sizes.index(lo), sizes.index(hi)
        lo_b, hi_b = sizes[max(k_lo - 1, 0)], sizes[min(k_hi + 1, len(sizes) - 1)]
        keep = [t for t, b in i.bytes.items() if lo_b <= b <= hi_b]
        i.bytes = {t: i.bytes[t] for t in keep}
        i.error = {t: i.error[t] for t in keep if t in i.error}


def check_budget(items: list[Item], budget: int) -> int:
    """A budget between the smallest and the largest candidate allocation; returns the fixed tensors' bytes."""
    free = [i for i in items if i.fixed is None]
    fixed_bytes = sum(i.bytes[i.fixed] for i in items if i.fixed is not None)
    lo_total = fixed_bytes + sum(min(i.bytes.values()) for i in free)
    hi_total = fixed_bytes + sum(max(i.bytes.values()) for i in free)
    if budget < lo_total:
        raise BadInput(f"the budget of {budget:,} bytes is below the smallest possible model ({lo_total:,} bytes with "
                       "every tensor at its smallest type). Raise the budget.")
    if budget >= hi_total:
        raise BadInput(f"the budget of {budget:,} bytes reaches the largest candidate mix ({hi_total:,} bytes, F16 "
                       "where it fits): nothing to allocate. Lower the budget, or quantize to F16 without one.")
    return fixed_bytes


def spend(free: list[Item], used: int, budget: int, cost) -> int:
    """Spend what is left of the budget: upgrades by error saved per extra byte, best first."""
    while True:
        best, best_gain = None, 0.0
        for i in free:
            for t, b in i.bytes.items():
                extra = b - i.bytes[i.chosen]
                if extra <= 0 or used + extra > budget:
                    continue
                gain = (cost(i, i.chosen) - cost(i, t)) / extra
                if gain > best_gain:
                    best, best_gain = (i, t, extra), gain
        if best is None:
            return used
        i, t, extra = best
        i.chosen = t
        used += extra


def no_worse_than_mixes(items: list[Item], budget: int, sensitivity: dict, mixes: dict, align: int, used: int,
                        predicted: float, group: dict | None = None) -> tuple[int, float]:
    """The solver's allocation, or (if its predicted error is higher) the best llama.cpp mix that fits
    with the rest of the budget spent on upgrades: never predicted worse than llama.cpp's own mix."""
    cost = weighted_cost(sensitivity, group)
    free = [i for i in items if i.fixed is None]
    best = None
    for name, types in mixes.items():
        if not all(types[i.name] in i.error for i in free) or mix_bytes(items, types, align) > budget:
            continue
        p = sum(cost(i, types[i.name]) for i in free)
        if p < predicted and (best is None or p < best[0]):
            best = (p, types)
    if best is None:
        return used, predicted
    for i in free:
        i.chosen = best[1][i.name]
    used = spend(free, mix_bytes(items, best[1], align), budget, cost)
    return used, settle(items, cost)


def allocate(src: str, *, target_bpw: float | None = None, target_size: int | None = None, imatrix=None,
             calib_text: str | None = None, threads=None, progress=None, n_ctx: int | None = None,
             chunks: int | None = None, hessian_path: str | None = None, probe: bool = True,
             kernels: Kernels = DEFAULT) -> Allocation:
    """Measure, probe and solve for `src` under the budget. The probes read `chunks` sequences of `n_ctx`
    tokens of `calib_text`, or of text the model writes itself (none with probe=False: llama.cpp's
    mixes then split the budget among the kinds); `kernels`: the run's compiled kernels."""
    t0 = time.perf_counter()
    if (target_bpw is None) == (target_size is None):
        raise BadInput("give exactly one budget: target_bpw or target_size.")
    if target_bpw is not None and not 1.0 < target_bpw < 32.0:
        raise BadInput(f"a target of {target_bpw} bits per weight is outside what GGUF types give (about 1.6 to 16 bits).")
    g = read_gguf(src)
    align = int(g.metadata.get("general.alignment", ALIGNMENT))
    shaped = shape_items(g, align)
    if imatrix is not None:  # every candidate type uses the imatrix
        check_imatrix_covers(imatrix, [i.name for i in shaped if i.fixed is None])
    n_weights = sum(int(np.prod(i.shape)) for i in shaped)
    head = header_bytes(src, shaped, imatrix) if target_size is not None else 0
    budget = int(target_bpw * n_weights / 8) if target_bpw is not None else int(target_size) - head
    # a low budget with an imatrix may also use the lattice i-quants (IQ1_S ... IQ3_S)
    grid = imatrix is not None and 8 * budget / n_weights <= GRID_MAX_BPW
    if grid:
        shaped = shape_items(g, align, grid_names(imatrix))
    check_reachable(shaped, budget, head, n_weights, target_bpw is not None)  # before the minutes of measuring
    items = measure(src, imatrix, threads, progress, hessian_path=hessian_path, grid=grid, kernels=kernels)
    mixes = llama_mixes(g, items, imatrix is not None)
    sens, source, origin = None, "none", None
    if probe or calib_text:
        origin = "calibration text" if calib_text else "the model's own text"
        n_seq, n_tok = chunks or PROBE_SEQS, n_ctx or PROBE_TOKENS
        key = probe_key(src, imatrix, calib_text, n_seq, n_tok)
        sens, source = cached_probe(key), "cached probe"
        if sens is None:
            try:
                sens = probe_sensitivity(src, items, imatrix, calib_text, n_seq, n_tok, threads=threads,
                                         progress=progress)
            except MissingDependency:
                if calib_text:
                    raise
                origin = None  # no llama.cpp to run the model: llama.cpp's mixes split the budget
            else:
                source = "probe"
                store_probe(key, sens)
    if sens is not None:
        used, predicted = solve(items, budget, sens)
        used, predicted = no_worse_than_mixes(items, budget, sens, mixes, align, used, predicted)
    elif mixes:  # each kind gets the bytes llama.cpp's mixes give it at this size
        near = [mixes[m] for m in bracket(items, mixes, budget, align)]
        near_types(items, near)
        group = layer_groups(items, near)
        used, predicted, by_group = solve_by_kind(items, budget, kind_budgets(items, mixes, budget, align, group),
                                                  group)
        used, predicted = no_worse_than_mixes(items, budget, by_group, mixes, align, used, predicted, group)
        sens = kind_weights(items, group, by_group)
        source = "llama.cpp mixes"
    else:  # llama.cpp's rules type no file of this model: every kind counts the same
        (used, predicted), sens = solve(items, budget), {}
    return Allocation({i.name: i.chosen for i in items if i.fixed is None}, budget, used, predicted, sens, source,
                      items, time.perf_counter() - t0, origin)


def check_reachable(items: list[Item], budget: int, head: int, n_weights: int, per_weight: bool) -> None:
    """A budget below the smallest file this model can make (every tensor at its smallest type) is
    refused in one line that gives that minimum, before anything is measured."""
    least = sum(min(i.bytes.values()) for i in items)
    if budget >= least:
        return
    if per_weight:
        raise BadInput(f"a target of {8 * budget / n_weights:.3f} bits per weight is below the smallest possible model: "
                       f"{8 * least / n_weights:.3f} bits per weight (every tensor at its smallest type).")
    raise BadInput(f"a target size of {budget + head:,} bytes is below the smallest possible model: "
                   f"{least + head:,} bytes ({(least + head) / 2**20:.2f} MiB, every tensor at its smallest type).")


RECIPE_KEY = "llmkit.quantize.recipe"
RECIPE_RESERVE = 4096  # bytes kept for the recipe metadata when a whole-file size is the target


def header_bytes(src: str, items: list[Item], imatrix=None) -> int:
    """The output header's size (types do not change it; an imatrix file's keys do) plus room for the
    recipe entry."""
    g = read_gguf(src)
    align = int(g.metadata.get("general.alignment", ALIGNMENT))
    by = {i.name: i for i in items}
    tensors = [(n, tuple(by[n].shape), "F16" if by[n].fixed is None else by[n].fixed)
               for n in rules.tensor_order(list(by))]
    return len(output_header(g, tensors, 1, align, imatrix=imatrix)) + RECIPE_RESERVE


def recipe(a: Allocation, target_bpw=None, target_size=None, imatrix: bool = False, method: str = "rtn") -> str:
    """The recipe stored in the output's metadata."""
    counts: dict[str, int] = {}
    for i in a.items:
        counts[i.chosen] = counts.get(i.chosen, 0) + 1
    return json.dumps({"tool": "llmkit quant", "target_bpw": target_bpw, "target_size": target_size,
                       "imatrix": imatrix, "method": method, "sensitivity": a.sensitivity_source,
                       "predicted": a.predicted, "types": counts}, separators=(",", ":"))


def file_type_for(a: Allocation) -> str:
    """The llama.cpp file type named after the type holding most weights."""
    weights: dict[str, int] = {}
    for i in a.items:
        if i.fixed is None:
            weights[i.chosen] = weights.get(i.chosen, 0) + int(np.prod(i.shape))
    top = max(weights, key=weights.get)
    return {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}.get(top, top if top in rules.FTYPES else "Q4_K_M")
