"""TQ1_0: ternary weights at 1.6875 bits: blocks of 256 = 48 bytes of 5 trits each (3^5 = 243 <= 256),
4 bytes of 4 trits, then the fp16 scale d = max|x|; a weight is (trit - 1) * d.

A byte holding trits t0..t4 (t0 most significant) stores ceil(q * 256 / 243) of q = t0 t1 t2 t3 t4 in
base 3, so the first trit is the top of byte * 3 >> 8 and each next one comes from multiplying the
byte by 3 (mod 256) first. Byte m of the first 32 holds weights m, m+32, ..., m+128; byte 32+m of
the next 16 holds 160+m, 160+m+16, ...; the 4 high bytes hold 240+j, 240+j+4, ... (4 trits and a
zero trit at the bottom)."""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.base import Format
from llmkit.quant.formats.numerics import F32, half_to_f32
from llmkit.quant.formats.lowbit.ternary import powers_of_3, scale_and_trits


def _ceil_byte(q: np.ndarray) -> np.ndarray:
    """ceil(q * 256 / 243): q in base 3 (< 243) as the byte whose repeated *3 reads the trits back."""
    return ((q.astype(np.uint16) * 256 + 242) // 243).astype(np.uint8)


class TQ1_0(Format):
    name = "TQ1_0"
    half_fields = ((52, 54),)

    def quantize_blocks(self, x):
        nb = len(x)
        d16, t = scale_and_trits(x)
        out = np.empty((nb, 54), np.uint8)
        p5 = powers_of_3(5)
        out[:, 0:32] = _ceil_byte(np.einsum("bnm,n->bm", t[:, :160].reshape(nb, 5, 32), p5))
        out[:, 32:48] = _ceil_byte(np.einsum("bnm,n->bm", t[:, 160:240].reshape(nb, 5, 16), p5))
        out[:, 48:52] = _ceil_byte(np.einsum("bmj,m->bj", t[:, 240:].reshape(nb, 4, 4), powers_of_3(4)) * 3)
        out[:, 52:54] = d16
        return out

    def dequantize_blocks(self, b):
        nb = len(b)
        d = half_to_f32(b[:, 52:54])
        pow3 = (3 ** np.arange(5)).astype(np.uint8)  # byte * 3^n mod 256 brings trit n to the top
        lo = (b[:, None, 0:48] * pow3[:, None]).astype(np.uint8)  # (nb, 5, 48)
        hi = (b[:, None, 48:52] * pow3[:4, None]).astype(np.uint8)  # (nb, 4, 4)
        tl = ((lo.astype(np.uint16) * 3) >> 8).astype(np.int16)
        th = ((hi.astype(np.uint16) * 3) >> 8).astype(np.int16)
        t = np.concatenate([tl[:, :, :32].reshape(nb, 160), tl[:, :, 32:].reshape(nb, 80), th.reshape(nb, 16)], axis=1)
        with np.errstate(invalid="ignore"):  # 0 * an infinite scale: NaN, as in C
            return (t - 1).astype(F32) * d[:, None]
