"""The plan of one output file: every tensor with its output type, in llama.cpp's tensor order."""

from __future__ import annotations

from llmkit.errors import BadInput
from llmkit.gguf.reader import GGUFFile, TensorInfo, read_gguf
from llmkit.quant.plan import rules


def plan_tensors(g: GGUFFile, ftype: str, pure: bool = False, has_imatrix: bool = False,
                 overrides: rules.Overrides | None = None,
                 assign: dict[str, str] | None = None) -> tuple[list[tuple[TensorInfo, str]], rules.TypeChooser]:
    """[(tensor, output type)] in llama.cpp's order, and the chooser (its fallback count). `ftype` is
    a resolved file type; `assign` fixes the type of named tensors (a budget allocation's choice)."""
    info = rules.model_info(g.metadata)
    by_name = {t.name: t for t in g.tensors}
    order = rules.tensor_order(list(by_name))
    chooser = rules.TypeChooser(info, ftype, order, pure, has_imatrix, overrides)
    plan = []
    for name in order:
        t = by_name[name]
        new = chooser.choose(name, t.shape, t.type_name)
        plan.append((t, assign[name] if assign and name in assign else new))
    return plan, chooser


def plan_types(src: str, ftype: str, pure: bool = False, has_imatrix: bool = False, overrides=None,
               assign=None) -> dict[str, str]:
    """{tensor: output type} that quantizing `src` to `ftype` would use."""
    plan, _ = plan_tensors(read_gguf(src), rules.resolve_ftype(ftype), pure, has_imatrix, overrides, assign)
    return {t.name: new for t, new in plan}


def check_imatrix_covers(imatrix, names) -> None:
    """Every blk.* matrix in `names` (those the plan quantizes with an imatrix) must have an entry:
    an imatrix that covers some layers but not others comes from another model or a cut-short run,
    and would weight some tensors and not others. (llama-quantize only logs "did not find weights";
    llama-imatrix always collects every blk.* matrix, so a complete file has them all.) Tensors
    llama-imatrix never collects (token_embd, output) may be absent."""
    missing = [n for n in names if n.startswith("blk.") and n not in imatrix]
    if missing:
        more = f" (nor for {len(missing) - 1} other matrices)" if len(missing) > 1 else ""
        raise BadInput(f"the imatrix has no entry for '{missing[0]}'{more}, which this plan quantizes with it; "
                       "collect the imatrix again from this model.")
