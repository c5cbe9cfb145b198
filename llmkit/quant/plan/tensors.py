"""The plan of one output file: every tensor with its output type, in llama.cpp's tensor order."""

from __future__ import annotations

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
