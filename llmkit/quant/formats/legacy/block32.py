"""What Q4_0, Q5_0, Q4_1 and Q5_1 share: blocks of 32 weights with fp16 scale(s) first, then 4-bit low
parts (weights j and j+16 share a byte), for the 5-bit types after 32 high bits (a uint32).

Symmetric (Q4_0, Q5_0): d = m / -nmax where m is the signed value of largest magnitude,
q = min(2 nmax - 1, trunc(x/d + nmax + 0.5)). With min (Q4_1, Q5_1): d = (max - min) / (levels - 1),
the min stored as the second fp16, q = trunc((x - min)/d + 0.5) (clamped in Q4_1 only, as ggml).
With an imatrix: the weights qw * sqrt(sigma2 + x^2), sigma2 = mean x^2 of the row, and ggml's
make_qx_quants (symmetric) or make_qkx3_quants (with min) search (quantize_row_q4_0_impl and siblings).
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.base import Format
from llmkit.quant.formats.numerics import (
    F32, abs_max_signed_t, blocks_t, first_max_t, first_min_t, fp16_bytes, half_to_f32, put_rows, safe_inv, seq_sum)
from llmkit.quant.formats.packing import high_bits_t, nibbles_t, unpack_high_bits, unpack_nibbles
from llmkit.quant.formats.search import make_qkx, make_qx_quants


def block32_weights(rows: np.ndarray, imatrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """32-blocks of the rows and their imatrix weights qw * sqrt(sigma2 + x^2), sigma2 = mean x^2 of
    the row (quantize_row_q4_0_impl and its Q4_1/Q5_0/Q5_1 siblings)."""
    sigma2 = row_sigma2(rows)
    x = rows.reshape(rows.shape[0], -1, 32)
    w = imatrix.reshape(1, -1, 32) * np.sqrt(sigma2[:, None, None] + x * x)
    return x.reshape(-1, 32), w.reshape(-1, 32)


def row_sigma2(rows: np.ndarray) -> np.ndarray:
    """sum(x^2) / n per row, summed in order (the imatrix paths of the 32-block formats)."""
    return seq_sum(rows * rows) / F32(rows.shape[1])


def _c_levels(xt: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """The levels as uint8, as C computes them. A subnormal scale has an infinite reciprocal, so every
    weight of its block scales to +-inf or NaN; C converts those to an integer before any clamp, and
    x86's conversion gives 0 (the "integer indefinite" value's low byte): the block's levels are all 0."""
    with np.errstate(invalid="ignore"):
        q = xt.astype(np.uint8)
    bad = ~np.isfinite(inv)
    if bad.any():
        q[:, bad] = 0
    return q


class Block32(Format):
    """The level layout: 4-bit pairs at byte `qs_at`, for 5-bit types the high bits at `qh_at`."""

    qs_at = 2
    qh_at = 0  # 0: no high bits (4-bit levels)
    uses_imatrix = True
    nan_reaches_scale = True

    def pack_levels_t(self, out: np.ndarray, qt: np.ndarray) -> None:
        """Levels given transposed, (32, n_blocks) uint8, into the blocks `out`."""
        if self.qh_at:
            put_rows(out[:, self.qh_at:self.qh_at + 4], high_bits_t(qt))
        put_rows(out[:, self.qs_at:], nibbles_t(qt))

    def pack_levels(self, out, L):
        self.pack_levels_t(out, np.ascontiguousarray(np.asarray(L, np.uint8).T))

    def unpack_levels(self, b):
        q = unpack_nibbles(b[:, self.qs_at:])
        return q.astype(np.int32) | unpack_high_bits(b[:, self.qh_at:self.qh_at + 4]) if self.qh_at else q

    def _blocks(self, qt: np.ndarray, *halves: np.ndarray) -> np.ndarray:
        """Blocks from their fp16 fields (in order) and transposed levels."""
        out = np.empty((qt.shape[1], self.type_size), np.uint8)
        for k, h in enumerate(halves):
            out[:, 2 * k:2 * k + 2] = fp16_bytes(h)
        self.pack_levels_t(out, qt)
        return out


class Symmetric32(Block32):
    """Q4_0 and Q5_0: one fp16 scale d, levels 0 .. 2 nmax - 1 standing for d * (q - nmax)."""

    nmax = 8
    half_fields = ((0, 2),)

    def quantize_blocks(self, x):
        xt = blocks_t(x)  # (32, n_blocks)
        d = abs_max_signed_t(xt) / F32(-self.nmax)
        inv = safe_inv(d)
        xt *= inv
        xt += F32(self.nmax + 0.5)  # >= 0.5, so the cast truncates like C's (int8_t)
        np.minimum(xt, F32(2 * self.nmax - 1), out=xt)
        return self._blocks(_c_levels(xt, inv), d)

    def quantize_weighted(self, rows, imatrix):
        x, w = block32_weights(rows, imatrix)
        d, q = make_qx_quants(x, self.nmax, 1, w)
        return self._blocks(np.ascontiguousarray(q.T, dtype=np.uint8), d)

    def dequantize_blocks(self, b):
        d = half_to_f32(b[:, :2])
        q = self.unpack_levels(b).astype(np.int32) - self.nmax
        return d[:, None] * q.astype(F32)


class WithMin32(Block32):
    """Q4_1 and Q5_1: fp16 scale d and fp16 min m, levels 0 .. nmax standing for d * q + m."""

    nmax = 15
    clamp = True
    half_fields = ((0, 4),)
    qs_at = 4

    def quantize_blocks(self, x):
        xt = blocks_t(x)  # (32, n_blocks)
        mn, mx = first_min_t(xt), first_max_t(xt)
        d = (mx - mn) / F32(self.nmax)
        xt -= mn
        inv = safe_inv(d)
        xt *= inv
        xt += F32(0.5)  # >= 0.5: the cast truncates
        if self.clamp:
            np.minimum(xt, F32(self.nmax), out=xt)
        return self._blocks(_c_levels(xt, inv), d, mn)

    def quantize_weighted(self, rows, imatrix):
        x, w = block32_weights(rows, imatrix)
        d, the_min, q = make_qkx(x, self.nmax, w, -0.9, 0.05, 36, use_mad=False)
        return self._blocks(np.ascontiguousarray(q.T, dtype=np.uint8), d, -the_min)

    def dequantize_blocks(self, b):
        d, m = half_to_f32(b[:, :2]), half_to_f32(b[:, 2:4])
        q = self.unpack_levels(b).astype(F32)
        return d[:, None] * q + m[:, None]
