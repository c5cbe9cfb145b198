"""Which type each tensor gets: llama.cpp's rules (llama-quant.cpp) for the file types llmkit writes.

Only 2-D+ tensors whose name ends in `weight` are quantized (not norms, positional/token-type
embeddings, MoE routers, ...). The `_S/_M/_L` mixes give attention-V and FFN-down layers more bits
(`use_more_bits`: the first and last eighth of the layers and every third in between), the
output tensor (or the token embedding when the output is tied to it) gets Q6_K (Q5_K in the 1-2
bit i-quant files, Q8_0 in MXFP4_MOE), the 1-3 bit i-quant files mix in K-quants and IQ3_S where
errors cost most, and a row length that is not a multiple of the block size falls back to a
32-block type (or F16). The lowest-bit types need an importance matrix (`requires_imatrix`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from llmkit.errors import BadInput
from llmkit.gguf.types import block_size, n_dims

# file type name -> (llama_ftype number, default tensor type), in llama-quantize's listing order
FTYPES = {
    "Q1_0": (40, "Q1_0"), "Q2_0": (41, "Q2_0"), "Q4_0": (2, "Q4_0"), "Q4_1": (3, "Q4_1"), "MXFP4_MOE": (38, "MXFP4"),
    "Q5_0": (8, "Q5_0"), "Q5_1": (9, "Q5_1"),
    "IQ2_XXS": (19, "IQ2_XXS"), "IQ2_XS": (20, "IQ2_XS"), "IQ2_S": (28, "IQ2_XS"), "IQ2_M": (29, "IQ2_S"),
    "IQ1_S": (24, "IQ1_S"), "IQ1_M": (31, "IQ1_M"), "TQ1_0": (36, "TQ1_0"), "TQ2_0": (37, "TQ2_0"),
    "Q2_K": (10, "Q2_K"), "Q2_K_S": (21, "Q2_K"), "IQ3_XXS": (23, "IQ3_XXS"), "IQ3_S": (26, "IQ3_S"),
    "IQ3_M": (27, "IQ3_S"), "IQ3_XS": (22, "IQ3_S"), "Q3_K_S": (11, "Q3_K"), "Q3_K_M": (12, "Q3_K"),
    "Q3_K_L": (13, "Q3_K"), "IQ4_NL": (25, "IQ4_NL"), "IQ4_XS": (30, "IQ4_XS"), "Q4_K_S": (14, "Q4_K"),
    "Q4_K_M": (15, "Q4_K"), "Q5_K_S": (16, "Q5_K"), "Q5_K_M": (17, "Q5_K"), "Q6_K": (18, "Q6_K"),
    "Q8_0": (7, "Q8_0"), "F16": (1, "F16"), "BF16": (32, "BF16"), "F32": (0, "F32"),
}
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}  # llama-quantize's shorthands
TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0",
         "MXFP4", "Q1_0", "Q2_0")  # the tensor types llmkit writes
BLOCK = {t: block_size(t) for t in TYPES}  # from ggml's type table
QUANTIZED = {k for k, b in BLOCK.items() if b > 1}
# tensor_type_fallback: a 256-block (or Q2_0's 64-block) type whose rows do not fit; a 32-block type (or
# one whose fallback does not fit either) becomes F16; Q1_0 has none (llama.cpp refuses the tensor)
FALLBACK = {**dict.fromkeys(("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"), "IQ4_NL"),
            **dict.fromkeys(("Q2_0", "Q2_K", "Q3_K", "TQ1_0", "TQ2_0"), "Q4_0"), "Q4_K": "Q5_0", "Q5_K": "Q5_1",
            "Q6_K": "Q8_0"}
# tensor_requires_imatrix: the types llama.cpp refuses to write without an importance matrix (any
# tensor but the token embedding and the output), and Q2_K inside a Q2_K_S file
NEEDS_IMATRIX = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS")
# the file types whose mixture puts such a type on some blk.* matrix (of rows that fit 256-blocks)
IMATRIX_FTYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S")
_LOW_IQ = ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M")  # the file types with their own branch
_ATTN_V = ("attn_v", "attn_qkv", "attn_kv_b")
_NO_QUANT = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
             "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
             "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
             "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
             "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
             "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
             "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
             ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")


def resolve_ftype(name: str) -> str:
    key = name.upper()
    key = ALIASES.get(key, key)
    if key not in FTYPES:
        raise BadInput(f"unknown quantization type {name!r}. Use one of: {', '.join(FTYPES)}.")
    return key


def requires_imatrix(name: str, t: str, ftype: str) -> bool:
    """Does llama.cpp refuse to write tensor `name` as type `t` of file type `ftype` without an imatrix?"""
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    return t in NEEDS_IMATRIX or (t == "Q2_K" and ftype == "Q2_K_S")


def allows_quantization(name: str, shape: tuple[int, ...]) -> bool:
    if n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    return not any(s in name for s in _NO_QUANT)


def category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"), ("attn_v.weight", "attn_v"),
                     ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                     ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


def layer_of(name: str) -> int:
    """The `blk.N.` layer of a tensor name (-1 if none): llama.cpp's tensor order key."""
    m = re.match(r"blk\.\s*([+-]?\d+)", name)  # like C's sscanf(name, "blk.%d.", &i)
    return int(m.group(1)) if m else -1


def tensor_order(names: list[str]) -> list[str]:
    """llama.cpp writes tensors sorted by (layer, name), non-layer tensors first."""
    return sorted(names, key=lambda n: (layer_of(n), n.encode("utf-8")))


@dataclass
class ModelInfo:
    arch: str
    n_layer: int
    n_gqa: int
    n_expert: int
    is_70b: bool = False


def model_info(meta: dict) -> ModelInfo:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise BadInput("the model has no general.architecture; llama.cpp's quantizer cannot type its tensors.")

    def num(key, default=0):
        v = meta.get(f"{arch}.{key}", default)
        if hasattr(v, "__len__"):  # per-layer arrays (e.g. head_count_kv): the first layer's value
            v = v[0] if len(v) else default
        return int(v)

    n_head = num("attention.head_count", 0)
    n_head_kv = num("attention.head_count_kv", n_head) or n_head
    n_layer = num("block_count", 0)
    return ModelInfo(arch, n_layer, n_head // n_head_kv if n_head_kv else 0, num("expert_count", 0),
                     is_70b=arch == "llama" and n_layer == 80)


@dataclass
class Overrides:
    """llama-quantize's per-tensor type options: the output tensor's type, the token embedding's type
    and (PATTERN, TYPE) pairs (first regex found in the name wins; patterns are lower-cased)."""

    output: str | None = None
    token_embd: str | None = None
    tensor_types: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self):
        self.output = _known_type(self.output, "output tensor type")
        self.token_embd = _known_type(self.token_embd, "token embedding type")
        compiled = []
        for pattern, t in self.tensor_types:
            try:
                compiled.append((re.compile(pattern.lower()), _known_type(t, f"tensor type for {pattern!r}")))
            except re.error as e:
                raise BadInput(f"tensor type pattern {pattern!r} is not a valid regular expression ({e}).") from None
        self._compiled = compiled

    def pattern_type(self, name: str) -> str | None:
        return next((t for rx, t in self._compiled if rx.search(name)), None)


def _known_type(t: str | None, what: str) -> str | None:
    if t is None:
        return None
    u = t.upper()
    if u not in BLOCK:
        raise BadInput(f"{what}: unknown tensor type {t!r}; use one of {', '.join(TYPES)}.")
    return u


def _fixed(name: str, shape, t: str, what: str) -> str:
    if shape[0] % BLOCK[t]:
        raise BadInput(f"{what} {t}: tensor '{name}' has rows of {shape[0]} weights, not a multiple of "
                       f"{t}'s block of {BLOCK[t]}; choose another type.")
    return t


class TypeChooser:
    """Stateful like llama.cpp's quantize_state: counters advance as tensors are visited in order."""

    def __init__(self, info: ModelInfo, ftype: str, names: list[str], pure: bool, has_imatrix: bool,
                 overrides: "Overrides | None" = None):
        self.info, self.ftype, self.pure, self.has_imatrix = info, ftype, pure, has_imatrix
        self.ov = overrides or Overrides()
        self.default = FTYPES[ftype][1]
        cats = [category(n) for n in names]
        self.n_attention_wv = sum(c in _ATTN_V for c in cats)
        self.tied = "output" not in cats
        self.n_ffn = info.n_layer
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self.n_fallback = 0

    def choose(self, name: str, shape: tuple[int, ...], cur_type: str) -> str:
        """The output type of one tensor (visited in llama.cpp's order). Raises BadInput, as llama.cpp's
        first pass over the tensors does, when the type needs an imatrix and there is none."""
        if not allows_quantization(name, shape):
            return cur_type
        new = self._choose(name, shape)
        if not self.has_imatrix and requires_imatrix(name, new, self.ftype):
            raise BadInput(f"{self.ftype} needs an importance matrix: tensor '{name}' would be {new}, which llama.cpp "
                           "refuses to write without one; give an imatrix (llmkit quant imatrix makes one).")
        return new

    def _choose(self, name: str, shape: tuple[int, ...]) -> str:
        cat, ov = category(name), self.ov
        # the token-embedding / output types win outright (no mixture, no fallback); an explicit
        # pattern may still name per_layer_token_embd (llama_tensor_get_type)
        if ov.token_embd and cat == "token_embd" and not (
                name == "per_layer_token_embd.weight" and ov.pattern_type(name)):
            return _fixed(name, shape, ov.token_embd, "token embedding type")
        if ov.output and cat == "output":
            return _fixed(name, shape, ov.output, "output tensor type")
        new = self.default
        if new in QUANTIZED:
            manual = ov.pattern_type(name)
            if manual:
                new = manual
            elif not self.pure:
                new = self._mix(name, shape, new)
            new = self._fallback(name, shape, new)
        return new

    def _fallback(self, name: str, shape, new: str) -> str:
        if shape[0] % BLOCK[new] == 0:
            return new
        if new not in FALLBACK and BLOCK[new] > 32:
            raise BadInput(f"tensor '{name}' has rows of {shape[0]} weights, not a multiple of {new}'s block of "
                           f"{BLOCK[new]}, and {new} has no smaller type to fall back to (llama.cpp refuses it too); "
                           "choose another type for this tensor or this model.")
        self.n_fallback += 1
        ret = FALLBACK.get(new, new)
        if shape[0] % BLOCK[ret]:
            ret = "F16"
        return ret

    def _more_bits(self, i: int, n: int) -> bool:
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    def _layer(self, counter: int, name: str) -> tuple[int, int]:
        if self.info.n_expert > 1:
            i = layer_of(name)
            if not 0 <= i < self.n_ffn:
                raise BadInput(f"tensor {name} has layer {i}, outside 0..{self.n_ffn - 1}.")
            return i, self.n_ffn
        return counter, self.n_ffn

    def _mix(self, name: str, shape, new: str) -> str:
        """llama_tensor_get_type_impl: the branches in llama.cpp's order (the first that applies decides)."""
        ft, info, cat = self.ftype, self.info, category(name)
        if info.arch == "glm5-next" and any(s in name for s in ("attn_q_a", "attn_q_b", "nextn.eh_proj")):
            return "Q8_0"  # never below Q8_0 (a float default never gets here)
        if cat == "output" or (self.tied and cat == "token_embd"):
            return self._output(shape, new)
        if ft == "MXFP4_MOE":  # expert tensors (3-D) -> MXFP4, every other -> Q8_0
            experts = len(shape) > 2 and shape[2] > 1
            if info.arch == "bailingmoe3":  # its MLA projections are 3-D too
                experts = experts and cat in ("ffn_up", "ffn_gate", "ffn_down")
            return "MXFP4" if experts else "Q8_0"
        if cat == "token_embd":
            if ft in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
                return "Q2_K"
            if ft in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
                return "IQ3_S"
            if ft in ("TQ1_0", "TQ2_0", "Q2_0"):
                return "Q4_K"
            return new
        if ft in _LOW_IQ:
            return self._low_iq(cat, new)
        if cat in _ATTN_V:
            return self._attn_v(new)
        if cat == "attn_k":
            if info.n_expert == 8:
                return "Q8_0"
            return {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}.get(ft, new)
        if cat == "attn_q":
            return {"IQ3_XS": "IQ3_XXS", "IQ3_XXS": "IQ2_S"}.get(ft, new)
        if cat == "ffn_down":
            return self._ffn_down(name, new)
        if cat == "attn_output":
            return self._attn_output(new)
        # (llama.cpp's attn_qkv branch after this point is never reached: attn_qkv is attention-V-like)
        if cat in ("ffn_gate", "ffn_up"):
            if cat == "ffn_gate":
                i, n = self._layer(self.i_ffn_gate, name)
                self.i_ffn_gate += 1
            else:
                i, n = self._layer(self.i_ffn_up, name)
                self.i_ffn_up += 1
            if ft == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
                return "IQ3_XXS"
        return new

    def _output(self, shape, new: str) -> str:
        """The output tensor (and a token embedding tied to it)."""
        ft = self.ftype
        if self.ov.output:  # only a tied token embedding gets here: it takes the output's type
            return self.ov.output
        if ft == "MXFP4_MOE" or self.info.arch == "falcon" or shape[0] % BLOCK[new]:
            return "Q8_0"
        if ft in ("IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"):
            return "Q5_K"
        return new if new == "Q8_0" else "Q6_K"

    def _low_iq(self, cat: str, new: str) -> str:
        """The 1-2 bit i-quant files (IQ1_S/M, IQ2_XXS/XS/S/M): their own branch for every other tensor."""
        ft, info = self.ftype, self.info
        two_s = ft in ("IQ2_S", "IQ2_M")
        if cat in _ATTN_V:
            self.i_attention_wv += 1
            if info.n_gqa >= 4 or info.n_expert >= 4:
                return "Q4_K"
            return "IQ3_S" if two_s else "Q2_K"
        if info.n_expert == 8 and cat == "attn_k":
            return "Q4_K"
        if cat == "ffn_down":  # the plain counter, not the layer of the name
            first = self.i_ffn_down < self.n_ffn // 8
            self.i_ffn_down += 1
            if first:
                return "IQ3_S" if two_s else "Q2_K"
            return new
        if cat == "attn_output":
            if info.n_expert == 8:
                return "Q5_K"
            if ft in ("IQ1_S", "IQ1_M"):
                return "IQ2_XXS"
            if two_s:
                return "IQ3_S"
        return new

    def _attn_v(self, new: str) -> str:
        ft, info = self.ftype, self.info
        gqa4 = info.n_gqa >= 4
        if ft == "Q2_K":
            new = "Q4_K" if gqa4 else "Q3_K"
        elif ft == "Q2_K_S" and gqa4:
            new = "Q4_K"
        elif ft == "IQ3_XXS":
            new = "Q4_K" if gqa4 else ("IQ3_XXS" if self.has_imatrix else "IQ3_S")
        elif ft in ("IQ3_XS", "IQ3_S") and gqa4:
            new = "Q4_K"
        elif ft == "IQ3_M":
            new = "Q4_K"
        elif ft == "Q3_K_M":
            new = "Q5_K" if self.i_attention_wv < 2 else "Q4_K"
        elif ft == "Q3_K_L":
            new = "Q5_K"
        elif ft in ("IQ4_NL", "IQ4_XS") and gqa4:
            new = "Q5_K"
        elif ft in ("Q4_K_M", "Q5_K_M") and self._more_bits(self.i_attention_wv, self.n_attention_wv):
            new = "Q6_K"
        elif ft == "Q4_K_S" and self.i_attention_wv < 4:
            new = "Q5_K"
        if info.is_70b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"
        if info.n_expert == 8:
            new = "Q8_0"
        self.i_attention_wv += 1
        return new

    def _ffn_down(self, name: str, new: str) -> str:
        ft, info = self.ftype, self.info
        i, n = self._layer(self.i_ffn_down, name)
        falcon = info.arch == "falcon"
        if ft == "Q2_K":
            new = "Q3_K"
        elif ft == "Q2_K_S":
            if i < n // 8:
                new = "Q4_K"
        elif ft == "IQ3_XXS" and not self.has_imatrix:
            new = "Q4_K" if i < n // 8 else "Q3_K"
        elif ft == "Q3_K_M":
            new = "Q5_K" if i < n // 16 else ("Q4_K" if not falcon or self._more_bits(i, n) else "Q3_K")
        elif ft == "IQ3_M" and (i < n // 8 or (info.n_expert == 8 and self._more_bits(i, n))):
            new = "Q4_K"
        elif ft == "Q3_K_L":
            new = "Q4_K" if falcon else "Q5_K"
        elif ft == "Q4_K_M":
            if falcon:
                new = "Q6_K" if i < n // 16 else ("Q5_K" if self._more_bits(i, n) else "Q4_K")
            elif self._more_bits(i, n):
                new = "Q6_K"
        elif ft in ("IQ4_NL", "IQ4_XS") and i < n // 8 and not self.has_imatrix:
            new = "Q5_K"
        elif ft == "Q5_K_M" and self._more_bits(i, n):
            new = "Q6_K"
        elif ft == "Q4_K_S" and not falcon and i < n // 8:
            new = "Q5_K"
        elif ft in ("Q4_0", "Q5_0") and self.has_imatrix and i < n // 8:
            new = "Q4_1" if ft == "Q4_0" else "Q5_1"
        self.i_ffn_down += 1
        return new

    def _attn_output(self, new: str) -> str:
        ft, info = self.ftype, self.info
        if info.arch == "falcon":
            return "Q4_K" if ft == "Q3_K_L" else new
        if info.n_expert == 8:
            if ft in ("Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S", "IQ3_M",
                      "IQ4_XS"):
                return "Q5_K"
            return new
        return {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "IQ3_M": "Q4_K"}.get(ft, new)
