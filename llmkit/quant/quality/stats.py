"""What quantization cost per tensor: the error between a tensor and its quantized version, and the
same for every tensor of two models."""

from __future__ import annotations

from dataclasses import asdict, dataclass
import numpy as np

from llmkit.errors import BadInput
from llmkit.gguf.reader import read_gguf
from llmkit.quant.formats import load_f32


@dataclass
class TensorDiff:
    name: str
    shape: list[int]
    type_a: str
    type_b: str
    rmse: float
    max_abs_err: float
    cosine: float

    def to_dict(self) -> dict:
        return asdict(self)


STATS_SLICE = 1 << 22  # elements per slice: 32 MB per float64 temporary


def error_stats(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """(RMSE, max |a - b|, cosine similarity) of two weight arrays (in float64), a slice at a time: whole
    float64 copies of an 8B model's embedding would take ~16 GB."""
    a, b = a.reshape(-1), b.reshape(-1)
    sq = dot = aa = bb = top = 0.0
    for i in range(0, len(a), STATS_SLICE):
        x, y = a[i:i + STATS_SLICE].astype(np.float64), b[i:i + STATS_SLICE].astype(np.float64)
        d = x - y
        sq, dot, aa, bb = sq + float(d @ d), dot + float(x @ y), aa + float(x @ x), bb + float(y @ y)
        top = max(top, float(np.abs(d).max()))
    na, nb = np.sqrt(aa), np.sqrt(bb)
    cos = float(dot / (na * nb)) if na and nb else (1.0 if na == nb else 0.0)
    return float(np.sqrt(sq / len(a))) if len(a) else 0.0, top, cos


def compare(path_a: str, path_b: str) -> list[TensorDiff]:
    """Dequantize both models tensor by tensor and measure the difference (same names and shapes)."""
    ga, gb = read_gguf(path_a), read_gguf(path_b)
    if ga.get("general.architecture") != gb.get("general.architecture"):
        raise BadInput(f"the models have different architectures ({ga.get('general.architecture')} vs "
                       f"{gb.get('general.architecture')}); compare two versions of one model.")
    tb = {t.name: t for t in gb.tensors}
    missing = [t.name for t in ga.tensors if t.name not in tb]
    if missing:
        raise BadInput(f"tensor '{missing[0]}' of '{path_a}' is not in '{path_b}'; compare two versions of one model.")
    out = []
    with open(path_a, "rb") as fa, open(path_b, "rb") as fb:
        for t in ga.tensors:
            u = tb[t.name]
            if tuple(t.shape) != tuple(u.shape):
                raise BadInput(f"tensor '{t.name}' has shape {t.shape} in one model and {u.shape} in the other.")
            x, y = load_f32(fa, t, ga.data_offset), load_f32(fb, u, gb.data_offset)
            out.append(TensorDiff(t.name, list(t.shape), t.type_name, u.type_name, *error_stats(x, y)))
    return out
