"""How a budget is split among the kinds of tensor when no calibration text is given: as llama.cpp's
own mixes split it (module doc of allocate.py, step 2, "without calibration text").

llama.cpp's mixes (Q3_K_M, IQ2_M, ...) encode what its authors learned on many models about which
kinds of tensor matter: attention-V and FFN-down get more bits than the query/key/gate/up matrices,
the output matrix more still. What they cannot know is this model's errors: which tensors within a
kind are hard to quantize, and which type (K-quant or lattice i-quant) serves a tensor best. So
each kind keeps the bytes llama.cpp's rules give it at this size (the mix of this size on this
model, or the straight line between the mixes just below and above it), and spends them on the
tensors and types its measured errors favour (allocate.solve_by_kind).

Finer than kinds: tensors of a kind that the mixes around the budget type alike form one group
with a budget of its own (`layer_groups`), so the mixes' per-layer rules (more bits for FFN-down
and attention-V of some layers) survive. At a mix's own size every group's measured error is then
at most the mix's (the mix's choice for the group is one of the allocations its solver compares),
whatever the groups' true sensitivities: the file cannot be predicted worse than llama.cpp's in
any group.

Worked example: a mix gives four 256-weight attn_v matrices Q5_K (176 bytes each) and four attn_q
Q3_K (110 bytes each): at that size attn_v's share is 704 bytes and attn_q's 440, whatever their
errors; halfway to a mix that gives every matrix Q4_K (144 bytes), attn_v's is 640 and attn_q's 508.
"""

from __future__ import annotations

from llmkit.errors import BadInput
from llmkit.quant.budget.measure import Item, padded
from llmkit.quant.plan import rules

# llama.cpp's file types whose rules mix several tensor types
MIXES = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "IQ4_XS", "IQ4_NL",
         "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M")
ANCHORS = ("Q6_K", "Q8_0")  # one-type files: where the kinds' shares go above the largest mix


def mix_types(g, ftype: str, has_imatrix: bool) -> dict[str, str]:
    """{tensor: type} llama.cpp's rules give this model in file type `ftype`."""
    from llmkit.quant.plan.tensors import plan_tensors

    plan, _ = plan_tensors(g, ftype, has_imatrix=has_imatrix)
    return {t.name: new for t, new in plan}


def mix_bytes(items: list[Item], types: dict[str, str], align: int = 32) -> int:
    """The tensors' bytes (each padded to the file's alignment) under a mix."""
    return sum(i.bytes[i.fixed] if i.fixed else padded(types[i.name], i.shape, align) for i in items)


def llama_mixes(g, items: list[Item], has_imatrix: bool, anchors: bool = True) -> dict[str, dict[str, str]]:
    """llama.cpp's mixes for this model (those it would write: the i-quant files need an imatrix)."""
    out = {}
    for ft in MIXES + (ANCHORS if anchors else ()):
        if ft in rules.IMATRIX_FTYPES and not has_imatrix:
            continue
        try:
            out[ft] = mix_types(g, ft, has_imatrix)
        except BadInput:  # a file type llama.cpp's rules refuse for this model splits nothing
            continue
    return out


def group_key(group: dict[str, str] | None):
    """item -> the key its budget is kept under: its group (`layer_groups`) or, without groups, its kind."""
    return (lambda i: group.get(i.name, i.kind)) if group else (lambda i: i.kind)


def _shares(items: list[Item], types: dict[str, str], key, align: int) -> dict[str, float]:
    """key -> the bytes a mix gives the free tensors under that key."""
    per: dict[str, float] = {}
    for i in items:
        if i.fixed is None:
            per[key(i)] = per.get(key(i), 0.0) + padded(types[i.name], i.shape, align)
    return per


def bracket(items: list[Item], mixes: dict[str, dict[str, str]], budget: int, align: int = 32) -> list[str]:
    """The mixes around this budget: [the largest that fits, the smallest that does not] (one of
    them beyond the smallest or largest mix)."""
    fixed = sum(i.bytes[i.fixed] for i in items if i.fixed is not None)
    kind = group_key(None)
    sizes = sorted(((sum(_shares(items, t, kind, align).values()), name) for name, t in mixes.items()),
                   key=lambda x: x[0])
    room = budget - fixed
    below = [n for b, n in sizes if b <= room]
    above = [n for b, n in sizes if b > room]
    return below[-1:] + above[:1]


def layer_groups(items: list[Item], near: list[dict[str, str]]) -> dict[str, str]:
    """tensor -> its group: its kind and the types the mixes around the budget (`near`, from
    `bracket`) give it. llama.cpp gives some layers of a kind more bits than others (attention-V and
    FFN-down of the first and last eighth of the layers and of every third layer between, in most
    mixes); tensors it types alike share one budget, so that knowledge stays while the measured
    errors choose types within it."""
    return {i.name: "|".join([i.kind] + [t[i.name] for t in near]) for i in items if i.fixed is None}


def kind_budgets(items: list[Item], mixes: dict[str, dict[str, str]], budget: int, align: int = 32,
                 group: dict[str, str] | None = None) -> dict[str, float]:
    """group -> bytes: how llama.cpp's mixes split a budget of this size among the kinds of tensor
    (or the finer `group`s of tensors: name -> group): the mix of this size, or the line between the
    mixes just below and above it; beyond the smallest or largest mix, that mix's shares scaled."""
    room = budget - sum(i.bytes[i.fixed] for i in items if i.fixed is not None)
    key = group_key(group)
    split = [_shares(items, mixes[m], key, align) for m in bracket(items, mixes, budget, align)]
    if len(split) == 2:
        p0, p1 = split
        t0, t1 = sum(p0.values()), sum(p1.values())
        f = (room - t0) / (t1 - t0)
        return {k: p0[k] + f * (p1[k] - p0[k]) for k in p0}
    t = sum(split[0].values())
    return {k: v * room / t for k, v in split[0].items()}
