"""Bit packing shared by several block layouts: 4-bit pairs, the fifth bit of 32 weights, 2-bit
quarters (Q2_K, Q3_K), and the 6-bit scale/min codes of Q4_K and Q5_K."""

from __future__ import annotations

import numpy as np


def nibbles_t(qt: np.ndarray) -> np.ndarray:
    """(32, B) uint8 levels -> (B, 16) bytes: the low 4 bits of weight j in the low nibble of byte j,
    those of weight j+16 in the high nibble."""
    return ((qt[:16] & 0x0F) | (qt[16:] << 4)).T


def high_bits_t(qt: np.ndarray) -> np.ndarray:
    """(32, B) 5-bit levels -> (B, 4) bytes: bit 4 of weight j at bit j of a little-endian uint32."""
    bits = (qt >> 4).reshape(4, 8, -1) << np.arange(8, dtype=np.uint8)[:, None]  # byte k gets weights 8k..8k+7
    return np.add.reduce(bits, axis=1, dtype=np.uint8).T  # distinct bits: the sum is an OR (faster than packbits)


def unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """Inverse of nibbles_t: (B, 16) bytes -> (B, 32) levels (low nibbles first)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def unpack_high_bits(qh: np.ndarray) -> np.ndarray:
    """Inverse of high_bits_t: (B, 4) bytes -> (B, 32) int32 values 0 or 16 (bit 4 of each weight)."""
    u = np.ascontiguousarray(qh).view("<u4")
    return ((u >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32) << 4


def pack_2bit(L: np.ndarray) -> np.ndarray:
    """(nb, 256) 2-bit values -> (nb, 64): byte l of half h holds weights h*128 + l + 32k at bits 2k."""
    q = L.reshape(len(L), 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(len(L), 64)


def unpack_2bit(qs: np.ndarray) -> np.ndarray:
    """Inverse of pack_2bit: (nb, 64) -> (nb, 256)."""
    q = qs.reshape(len(qs), 2, 1, 32)
    return ((q >> (2 * np.arange(4)[None, None, :, None])) & 3).reshape(len(qs), 256)


def pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: eight 6-bit scales and eight 6-bit mins in 12 bytes (get_scale_min_k4's layout)."""
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    s = np.zeros((len(ls), 12), np.uint8)
    s[:, 0:4] = ls[:, 0:4]
    s[:, 4:8] = lm[:, 0:4]
    s[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    s[:, 0:4] |= (ls[:, 4:8] >> 4) << 6
    s[:, 4:8] |= (lm[:, 4:8] >> 4) << 6
    return s


def unpack_scales_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of pack_scales_k4: (scales, mins), each (n, 8)."""
    sc = np.empty((len(s), 8), np.uint8)
    mn = np.empty((len(s), 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn
