"""numba kernels of the 3-bit i-quants: ggml-quants.c's quantize_row_iq3_xxs_impl (grid 256) and
quantize_row_iq3_s_impl (grid 512), loop for loop, in float32 and C's operation order (jit.py says
why that keeps the bytes identical). Imported only through iq3.kernels().

Each kernel takes x (n_blocks, 256) float32 (whole rows, row after row), qw (blocks per row, 256)
float32 (the imatrix, used when use_qw), the tables of iq3grid.tables(grid size) and the values
of each listed neighbour (together: iq3grid.kernel_tables), and fills
out (n_blocks, type_size) uint8. They hold no Python object, so they run without the GIL."""

from __future__ import annotations

import numpy as np
from numba import njit

from llmkit.quant.formats._kernels import MAGIC, OPTS, nearest_int, put_half

F = np.float32
ZERO, HALF, ONE = F(0.0), F(0.5), F(1.0)
FLT_MAX = F(np.finfo(np.float32).max)
EPS_XXS = F(1e-8)  # GROUP_MAX_EPS_IQ3_XXS


@njit(inline="always", **OPTS)
def _best_neighbour(neigh, nbq, start, grid, xval, waux, off, scale, lf, qa):
    """iq3_find_best_neighbour: the listed grid point nearest to xval[off:off+4] / scale (weights waux);
    its levels go to lf[off:off+4] and its values 2l+1 to qa[off:off+4] (as floats). Returns its index.
    nbq[p] holds the values of the grid point listed at neigh[p] (one load less per neighbour)."""
    n = np.int64(neigh[start])
    best = FLT_MAX
    gj = start + 1  # only NaN distances keep it (ggml aborts there); NaN input is refused before quantizing
    for j in range(start + 1, start + n + 1):
        d2 = ZERO
        for i in range(4):
            diff = scale * nbq[j, i] - xval[off + i]
            d2 += waux[off + i] * diff * diff
        if d2 < best:
            best = d2
            gj = j
    gi = np.int64(neigh[gj])
    for i in range(4):
        lf[off + i] = F((grid[gi, i] - 1) // 2)
        qa[off + i] = F(grid[gi, i])
    return gi


@njit(inline="always", **OPTS)
def _levels_code(xval, off, idv):
    """The grid code u of the 4 levels nearest to xval[off:off+4] * idv (levels clamped to 0..7)."""
    u = 0
    for i in range(4):
        l = nearest_int(HALF * (idv * xval[off + i] - ONE))
        l = max(0, min(7, l))
        u |= l << (3 * i)
    return u


@njit(inline="always", **OPTS)
def _search(xval, weight, waux, mx, nstep, on_init, refine_all, grid, kmap, neigh, nbq, L, S, on, on_aux):
    """The scale search of one sub-block of 32 (2*nstep + 1 trial scales around max/15, each weight
    to its level, each group of 4 onto the grid), then the refit of the groups found off the grid
    (all groups when refine_all, as IQ3_S does). Levels in L; returns the scale.

    S: (6, 32) float32 scratch. Per trial, the levels and the products of the sums are computed in
    loops of their own (LLVM vectorizes them; each product is the same float32 as C's inline
    w*x*q, since w*x is computed once and (w*x)*q is C's order), and only the two sums run in
    C's sequential order."""
    lf = S[0]  # the trial's levels (as floats)
    qa = S[1]  # ... and their values 2l+1
    wx = S[2]  # w * x, fixed per sub-block
    pa = S[3]
    pb = S[4]
    for i in range(32):
        wx[i] = weight[i] * xval[i]
    best = ZERO
    scale = mx / F(15)
    for k in range(8):
        on[k] = on_init
    for s in range(-nstep, nstep + 1):
        idv = (F(15) + F(s) * F(0.2)) / mx
        this_scale = ONE / idv
        for i in range(32):  # nearest_int, clamped to 0..7, kept as a float
            r = (HALF * (idv * xval[i] - ONE) + MAGIC) - MAGIC
            lf[i] = min(F(7), max(ZERO, r))
        for i in range(32):
            qa[i] = F(2) * lf[i] + ONE
        for k in range(8):
            u = 0
            for i in range(4):
                u |= int(lf[4 * k + i]) << (3 * i)
            on_aux[k] = True
            if kmap[u] < 0:
                on_aux[k] = False
                _best_neighbour(neigh, nbq, -kmap[u] - 1, grid, xval, waux, 4 * k, this_scale, lf, qa)
        for i in range(32):
            pa[i] = wx[i] * qa[i]
            pb[i] = weight[i] * qa[i] * qa[i]
        sumqx = ZERO
        sumq2 = ZERO
        for i in range(32):
            sumqx += pa[i]
            sumq2 += pb[i]
        if sumq2 > ZERO and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            for i in range(32):
                L[i] = int(lf[i])
            for k in range(8):
                on[k] = on_aux[k]
    n_off = 0
    for k in range(8):
        if not on[k]:
            n_off += 1
    if n_off > 0 and scale > ZERO:
        idv = ONE / scale
        for i in range(32):
            lf[i] = F(L[i])
            qa[i] = F(2 * L[i] + 1)
        for k in range(8):
            if on[k] and not refine_all:
                continue
            u = _levels_code(xval, 4 * k, idv)
            gi = np.int64(kmap[u])
            if gi < 0:
                gi = _best_neighbour(neigh, nbq, -gi - 1, grid, xval, waux, 4 * k, scale, lf, qa)
            for i in range(4):
                lf[4 * k + i] = F((grid[gi, i] - 1) // 2)
                qa[4 * k + i] = F(grid[gi, i])
        sumqx = ZERO
        sumq2 = ZERO
        for i in range(32):
            sumqx += wx[i] * qa[i]
            sumq2 += weight[i] * qa[i] * qa[i]
        for i in range(32):
            L[i] = int(lf[i])
        if sumq2 > ZERO:
            scale = sumqx / sumq2
    return scale


@njit(inline="always", **OPTS)
def _weights(x, b, qw, use_qw, ib, sigma2, weight, waux):
    """weight = qw * sqrt(sigma2 + x^2) with an imatrix, x^2 without; waux = sqrt(weight)."""
    q = b % qw.shape[0]
    for i in range(32):
        v = x[b, 32 * ib + i]
        if use_qw:
            weight[i] = qw[q, 32 * ib + i] * np.sqrt(sigma2 + v * v)
        else:
            weight[i] = v * v
        waux[i] = np.sqrt(weight[i])


@njit(inline="always", **OPTS)
def _sigma2(x, b):
    s = ZERO
    for i in range(256):
        s += x[b, i] * x[b, i]
    return F(2) * s / F(256)


@njit(inline="always", **OPTS)
def _scratch():
    return (np.empty(32, F), np.empty(32, F), np.empty(32, F), np.empty(32, np.int64), np.empty((6, 32), F),
            np.empty(8, np.bool_), np.empty(8, np.bool_), np.empty(8, F), np.empty(4, np.int64))


@njit(**OPTS)
def iq3_xxs(x, qw, use_qw, grid, kmap, neigh, nbq, out):
    """quantize_row_iq3_xxs_impl(256, ...): d, 64 grid indices, 8 u32 of 4x7 sign bits + a 4-bit scale."""
    weight, waux, xval, L, S, on, on_aux, scales, signs = _scratch()
    for b in range(x.shape[0]):
        for j in range(98):
            out[b, j] = 0
        max_scale = ZERO
        sigma2 = _sigma2(x, b)
        for ib in range(8):
            _weights(x, b, qw, use_qw, ib, sigma2, weight, waux)
            for k in range(4):  # 7 sign bits per 8: an odd count flips the least important weight
                nflip = 0
                s = 0
                for i in range(8):
                    v = x[b, 32 * ib + 8 * k + i]
                    if v >= ZERO:
                        xval[8 * k + i] = v
                    else:
                        xval[8 * k + i] = -v
                        nflip += 1
                        s |= 1 << i
                if nflip % 2:
                    imin = 0
                    v = x[b, 32 * ib + 8 * k]
                    mn = weight[8 * k] * v * v
                    for i in range(1, 8):
                        v = x[b, 32 * ib + 8 * k + i]
                        ax = weight[8 * k + i] * v * v
                        if ax < mn:
                            mn = ax
                            imin = i
                    xval[8 * k + imin] = -xval[8 * k + imin]
                    s ^= 1 << imin
                signs[k] = s & 127
            mx = xval[0]
            for i in range(1, 32):
                mx = mx if mx > xval[i] else xval[i]
            for i in range(32):
                L[i] = 0
            if mx < EPS_XXS:
                scales[ib] = ZERO
                continue
            scale = _search(xval, weight, waux, mx, 15, True, False, grid, kmap, neigh, nbq, L, S, on, on_aux)
            if scale < ZERO:
                scale = -scale
                for k in range(4):
                    signs[k] = (~signs[k]) & 127
            for k in range(8):
                u = 0
                for i in range(4):
                    u |= L[4 * k + i] << (3 * i)
                out[b, 2 + 8 * ib + k] = kmap[u] & 0xFF  # on the grid by construction
            w32 = signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21)
            for j in range(4):
                out[b, 66 + 4 * ib + j] = (w32 >> (8 * j)) & 0xFF
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == ZERO:
            for j in range(98):
                out[b, j] = 0
            continue
        d = max_scale / F(31)
        put_half(out, b, 0, d * F(1.0125))
        idv = ONE / d
        for ib in range(8):
            l = nearest_int(HALF * (idv * scales[ib] - ONE))
            l = max(0, min(15, l))
            out[b, 66 + 4 * ib + 3] |= l << 4


@njit(**OPTS)
def iq3_s(x, qw, use_qw, grid, kmap, neigh, nbq, out):
    """quantize_row_iq3_s_impl(32, ...): d, 64 low index bytes, 8 bytes of 9th bits, 32 of 8 sign bits,
    4 of two 4-bit scales. As in ggml, an all-zero sub-block does not advance the qs/signs positions."""
    weight, waux, xval, L, S, on, on_aux, scales, signs = _scratch()
    for b in range(x.shape[0]):
        for j in range(110):
            out[b, j] = 0
        qs = 2
        sg = 74
        max_scale = ZERO
        sigma2 = _sigma2(x, b)
        for ib in range(8):
            _weights(x, b, qw, use_qw, ib, sigma2, weight, waux)
            for k in range(4):
                s = 0
                for i in range(8):
                    v = x[b, 32 * ib + 8 * k + i]
                    if v >= ZERO:
                        xval[8 * k + i] = v
                    else:
                        xval[8 * k + i] = -v
                        s |= 1 << i
                signs[k] = s
            mx = xval[0]
            for i in range(1, 32):
                mx = mx if mx > xval[i] else xval[i]
            for i in range(32):
                L[i] = 0
            if mx == ZERO:
                scales[ib] = ZERO
                continue
            scale = _search(xval, weight, waux, mx, 9, False, True, grid, kmap, neigh, nbq, L, S, on, on_aux)
            if scale < ZERO:
                scale = -scale
                for k in range(4):
                    signs[k] = (~signs[k]) & 0xFF
            for k in range(8):
                u = 0
                for i in range(4):
                    u |= L[4 * k + i] << (3 * i)
                gi = kmap[u]
                out[b, qs + k] = gi & 0xFF
                out[b, 66 + ib] |= (gi >> 8) << k
            qs += 8
            for k in range(4):
                out[b, sg + k] = signs[k]
            sg += 4
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == ZERO:
            continue
        d = max_scale / F(31)
        put_half(out, b, 0, d * F(1.033))
        idv = ONE / d
        for j in range(4):
            l1 = max(0, min(15, nearest_int(HALF * (idv * scales[2 * j] - ONE))))
            l2 = max(0, min(15, nearest_int(HALF * (idv * scales[2 * j + 1] - ONE))))
            out[b, 106 + j] = l1 | (l2 << 4)
