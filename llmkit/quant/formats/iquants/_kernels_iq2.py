"""numba kernels of the 2-bit i-quants: ggml-quants.c's quantize_row_iq2_xxs_impl, _iq2_xs_impl and
_iq2_s_impl loop for loop, in float32 and C's operation order (the rules are in jit.py's docstring).
Each kernel takes rows x (n_rows, n) float32, the column weights qw (n,) float32 (the imatrix; IQ2_S
also runs with an empty qw), the search tables of iq2grid.py (levels, kmap, neighbours) and fills
out (n_rows, row bytes) uint8. Imported only through iq2.kernels() (numba is slow to import).

One liberty, exact: iq2_find_best_neighbour's distance terms w * (scale * q - x)^2 take only 3
values per coordinate (q = 1, 3, 5), so they are computed once per call and looked up per
neighbour (faster, the same floats in the same order)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from llmkit.quant.formats._kernels import fp16_bits, make_qp_quants, nint

F = np.float32
ZERO, HALF, ONE = F(0.0), F(0.5), F(1.0)
GROUP_MAX_EPS = F(1e-15)
GROUP_MAX_EPS_IQ2_S = F(1e-8)
TENTH = F(0.1)
FLT_MAX = F(3.4028234663852886e38)
OPTS = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")


@njit(inline="always", **OPTS)
def best_neighbour(nbrs, start, lev, xval, waux, o, scale, L, t):
    """iq2_find_best_neighbour: the grid point of the list at nbrs[start] nearest (weights waux) to
    xval[o:o+8] / scale; writes its levels into L[o:o+8], returns its index. A coordinate takes one
    of 3 values (2l + 1), so its 3 possible terms w * diff * diff are computed once (t, 24 floats),
    each exactly as ggml computes it, and each neighbour's distance sums them in ggml's order."""
    for i in range(8):
        xi = xval[o + i]
        wi = waux[o + i]
        for q in range(3):
            diff = scale * F(2 * q + 1) - xi
            t[3 * i + q] = wi * diff * diff
    best_d2 = FLT_MAX
    gi = -1
    for j in range(start + 1, start + 1 + nbrs[start]):
        p = nbrs[j]
        d2 = ZERO
        for i in range(8):
            d2 += t[3 * i + lev[p, i]]
        if d2 < best_d2:
            best_d2 = d2
            gi = p
    if gi < 0:
        gi = nbrs[start + 1]  # ggml asserts here (a NaN distance); cannot happen for finite input
    for i in range(8):
        L[o + i] = lev[gi, i]
    return gi


@njit(inline="always", **OPTS)
def _levels(xval, o, idd, L, kmax):
    """Levels nearest_int(0.5 * (id * x - 1)) clamped to [0, kmax-1] for xval[o:o+8]; returns their key u."""
    u = 0
    for i in range(8):
        l = nint(HALF * (idd * xval[o + i] - ONE))
        l = max(0, min(kmax - 1, l))
        L[o + i] = l
        u |= l << (2 * i)
    return u


@njit(inline="always", **OPTS)
def _fit(xval, weight, L, n):
    """sum w x q and sum w q^2 over q = 2 L + 1."""
    sumqx = ZERO
    sumq2 = ZERO
    for i in range(n):
        w = weight[i]
        q = F(2 * L[i] + 1)
        sumqx += w * xval[i] * q
        sumq2 += w * q * q
    return sumqx, sumq2


@njit(inline="always", **OPTS)
def _weights(xr, qw, o, n, sigma2, weight, waux, has_qw):
    for i in range(n):
        v = xr[o + i]
        if has_qw:
            weight[i] = qw[o + i] * F(math.sqrt(sigma2 + v * v))
        else:
            weight[i] = F(0.25) * sigma2 + v * v
    for i in range(n):
        waux[i] = F(math.sqrt(weight[i]))


@njit(inline="always", **OPTS)
def _signs(xr, o, weight, xval, k, even):
    """Absolute values of group k (8 weights at xr[o+8k]) into xval; the sign bits. With `even` the
    number of flipped signs is made even by keeping the sign of the least important weight (7 bits kept)."""
    s = 0
    nflip = 0
    for i in range(8):
        v = xr[o + 8 * k + i]
        if v >= ZERO:
            xval[8 * k + i] = v
        else:
            xval[8 * k + i] = -v
            nflip += 1
            s |= 1 << i
    if even:
        if nflip % 2:
            imin = 0
            v0 = xr[o + 8 * k]
            mn = weight[8 * k] * v0 * v0
            for i in range(1, 8):
                v = xr[o + 8 * k + i]
                ax = weight[8 * k + i] * v * v
                if ax < mn:
                    mn = ax
                    imin = i
            xval[8 * k + imin] = -xval[8 * k + imin]
            s ^= 1 << imin
        return s & 127
    return s


@njit(inline="always", **OPTS)
def _sumx2(xr, o):
    s = ZERO
    for i in range(256):
        s += xr[o + i] * xr[o + i]
    return s



@njit(inline="always", **OPTS)
def _super_scale(out, r, ob, max_scale, stored, clear):
    """Write d = max_scale / 31 as fp16 (times `stored`) at out[r, ob] -> (1/d, False); all-zero: (0, True)."""
    if max_scale == ZERO:
        for i in range(clear):
            out[r, ob + i] = 0
        return ZERO, True
    d = max_scale / F(31)
    b = fp16_bits(d * stored)
    out[r, ob] = b & 0xFF
    out[r, ob + 1] = b >> 8
    return ONE / d, False

@njit(**OPTS)
def iq2_xxs(x, qw, out, lev, kmap, nbrs):
    """quantize_row_iq2_xxs_impl: 8 sub-blocks of 32, 4-bit scales, 256-point grid, 7 sign bits per 8."""
    n_rows, n = x.shape
    weight = np.empty(32, F)
    waux = np.empty(32, F)
    xval = np.empty(32, F)
    L = np.zeros(32, np.int64)
    Laux = np.zeros(32, np.int64)
    Lqp = np.zeros(32, np.int64)
    scales = np.empty(8, F)
    q2 = np.zeros(16, np.int64)
    bsig = np.zeros(4, np.int64)
    t = np.empty(24, F)
    for r in range(n_rows):
        xr = x[r]
        for ibl in range(n // 256):
            ob = 66 * ibl
            for i in range(16):
                q2[i] = 0
            max_scale = ZERO
            sigma2 = _sumx2(xr, 256 * ibl) / F(256)
            for ib in range(8):
                o = 256 * ibl + 32 * ib
                _weights(xr, qw, o, 32, sigma2, weight, waux, True)
                for k in range(4):
                    bsig[k] = _signs(xr, o, weight, xval, k, True)
                mx = xval[0]
                for i in range(1, 32):
                    mx = mx if mx > xval[i] else xval[i]
                if mx < GROUP_MAX_EPS:
                    scales[ib] = ZERO
                    continue
                scale = make_qp_quants(32, 4, xval, weight, Lqp)
                for i in range(32):
                    L[i] = Lqp[i]
                eff_max = scale * F(3)
                if eff_max <= ZERO:
                    scales[ib] = ZERO
                    continue
                best = ZERO
                for is_ in range(-6, 7):
                    idd = (F(5) + F(is_) * TENTH) / eff_max
                    this_scale = ONE / idd
                    for k in range(4):
                        u = _levels(xval, 8 * k, idd, Laux, 3)
                        if kmap[u] < 0:
                            best_neighbour(nbrs, -kmap[u] - 1, lev, xval, waux, 8 * k, this_scale, Laux, t)
                    sumqx, sumq2 = _fit(xval, weight, Laux, 32)
                    if sumq2 > ZERO and sumqx * sumqx > best * sumq2:
                        scale = sumqx / sumq2
                        best = scale * sumqx
                        for i in range(32):
                            L[i] = Laux[i]
                if scale > ZERO:
                    idd = ONE / scale
                    for k in range(4):
                        u = _levels(xval, 8 * k, idd, Laux, 3)
                        gi = kmap[u]
                        if gi < 0:
                            gi = best_neighbour(nbrs, -gi - 1, lev, xval, waux, 8 * k, scale, L, t)
                        for i in range(8):
                            L[8 * k + i] = lev[gi, i]
                    sumqx, sumq2 = _fit(xval, weight, L, 32)
                    if sumq2 > ZERO:
                        scale = sumqx / sumq2
                if scale < ZERO:
                    scale = -scale
                    for k in range(4):
                        bsig[k] = (~bsig[k]) & 127
                for k in range(4):
                    u = 0
                    for i in range(8):
                        u |= L[8 * k + i] << (2 * i)
                    q2[2 * ib] |= np.int64(kmap[u]) << (8 * k)  # on the grid by construction
                    q2[2 * ib + 1] |= bsig[k] << (7 * k)
                scales[ib] = scale
                max_scale = max_scale if max_scale > scale else scale
            idd, empty = _super_scale(out, r, ob, max_scale, ONE, 66)
            if empty:
                continue
            for ib in range(8):
                l = max(0, min(15, nint(HALF * (idd * scales[ib] - ONE))))
                q2[2 * ib + 1] |= l << 28
            for i in range(16):
                v = q2[i]
                for j in range(4):
                    out[r, ob + 2 + 4 * i + j] = (v >> (8 * j)) & 0xFF


@njit(inline="always", **OPTS)
def _sub16(xr, qw, o, sigma2, has_qw, even, eps, weight, waux, xval, L, Laux, bsig, onk, onk_aux,
           lev, kmap, nbrs, gis, t):
    """The search of one sub-block of 16 (IQ2_XS, IQ2_S): writes the grid indices gis[0:2] and the
    signs bsig[0:2]; returns the sub-block scale, or -1 where ggml skips the sub-block (all near zero)."""
    _weights(xr, qw, o, 16, sigma2, weight, waux, has_qw)
    for k in range(2):
        bsig[k] = _signs(xr, o, weight, xval, k, even)
    mx = xval[0]
    for i in range(1, 16):
        mx = mx if mx > xval[i] else xval[i]
    for i in range(16):
        L[i] = 0
    if mx < eps:
        return F(-1)
    best = ZERO
    scale = mx / F(5)
    onk[0] = True
    onk[1] = True
    for is_ in range(-9, 10):
        idd = (F(5) + F(is_) * TENTH) / mx
        this_scale = ONE / idd
        for k in range(2):
            u = _levels(xval, 8 * k, idd, Laux, 3)
            onk_aux[k] = kmap[u] >= 0
            if kmap[u] < 0:
                best_neighbour(nbrs, -kmap[u] - 1, lev, xval, waux, 8 * k, this_scale, Laux, t)
        sumqx, sumq2 = _fit(xval, weight, Laux, 16)
        if sumq2 > ZERO and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            for i in range(16):
                L[i] = Laux[i]
            onk[0] = onk_aux[0]
            onk[1] = onk_aux[1]
    if (not onk[0] or not onk[1]) and scale > ZERO:
        idd = ONE / scale
        for k in range(2):
            if onk[k]:
                continue
            u = _levels(xval, 8 * k, idd, L, 3)
            if kmap[u] < 0:
                best_neighbour(nbrs, -kmap[u] - 1, lev, xval, waux, 8 * k, scale, L, t)
        sumqx, sumq2 = _fit(xval, weight, L, 16)
        if sumq2 > ZERO:
            scale = sumqx / sumq2
    if scale < ZERO:
        scale = -scale
        for k in range(2):
            bsig[k] = (~bsig[k]) & (127 if even else 255)
    for k in range(2):
        u = 0
        for i in range(8):
            u |= L[8 * k + i] << (2 * i)
        gis[k] = np.int64(kmap[u])
    return scale


@njit(inline="always", **OPTS)
def _scratch16():
    return (np.empty(16, F), np.empty(16, F), np.empty(16, F), np.zeros(16, np.int64), np.zeros(16, np.int64),
            np.zeros(2, np.int64), np.ones(2, np.bool_), np.ones(2, np.bool_), np.zeros(2, np.int64), np.empty(16, F),
            np.empty(24, F))


@njit(**OPTS)
def iq2_xs(x, qw, out, lev, kmap, nbrs):
    """quantize_row_iq2_xs_impl: 16 sub-blocks of 16, 4-bit scales, 512-point grid, 7 sign bits per 8."""
    n_rows, n = x.shape
    weight, waux, xval, L, Laux, bsig, onk, onk_aux, gis, scales, t = _scratch16()
    q2 = np.zeros(32, np.int64)
    for r in range(n_rows):
        xr = x[r]
        for ibl in range(n // 256):
            ob = 74 * ibl
            for i in range(32):
                q2[i] = 0
            for i in range(8):
                out[r, ob + 66 + i] = 0
            max_scale = ZERO
            sigma2 = _sumx2(xr, 256 * ibl) / F(256)
            for ib in range(16):
                s = _sub16(xr, qw, 256 * ibl + 16 * ib, sigma2, True, True, GROUP_MAX_EPS, weight, waux, xval, L,
                           Laux, bsig, onk, onk_aux, lev, kmap, nbrs, gis, t)
                if s < ZERO:
                    scales[ib] = ZERO
                    continue
                scales[ib] = s
                for k in range(2):
                    q2[2 * ib + k] = gis[k] | (bsig[k] << 9)
                max_scale = max_scale if max_scale > s else s
            idd, empty = _super_scale(out, r, ob, max_scale, ONE, 66)
            if empty:
                continue
            for ib in range(16):
                l = max(0, min(15, nint(HALF * (idd * scales[ib] - ONE))))
                out[r, ob + 66 + ib // 2] |= l << (4 * (ib % 2))
            for i in range(32):
                out[r, ob + 2 + 2 * i] = q2[i] & 0xFF
                out[r, ob + 3 + 2 * i] = (q2[i] >> 8) & 0xFF


@njit(**OPTS)
def iq2_s(x, qw, out, lev, kmap, nbrs):
    """quantize_row_iq2_s_impl: 16 sub-blocks of 16, 4-bit scales, 1024-point grid, 8 sign bits per 8;
    without column weights (qw empty) the weights are sigma2/4 + x^2."""
    n_rows, n = x.shape
    has_qw = qw.shape[0] > 0
    weight, waux, xval, L, Laux, bsig, onk, onk_aux, gis, scales, t = _scratch16()
    for r in range(n_rows):
        xr = x[r]
        for ibl in range(n // 256):
            ob = 82 * ibl
            for i in range(82):
                out[r, ob + i] = 0
            max_scale = ZERO
            sigma2 = F(2) * _sumx2(xr, 256 * ibl) / F(256)
            for ib in range(16):
                s = _sub16(xr, qw, 256 * ibl + 16 * ib, sigma2, has_qw, False, GROUP_MAX_EPS_IQ2_S, weight, waux,
                           xval, L, Laux, bsig, onk, onk_aux, lev, kmap, nbrs, gis, t)
                if s < ZERO:
                    scales[ib] = ZERO
                    continue
                scales[ib] = s
                for k in range(2):
                    i8 = 2 * ib + k
                    out[r, ob + 2 + i8] = gis[k] & 0xFF
                    out[r, ob + 66 + i8 // 4] |= (gis[k] >> 8) << (2 * (i8 % 4))
                    out[r, ob + 34 + i8] = bsig[k] & 0xFF
                max_scale = max_scale if max_scale > s else s
            idd, empty = _super_scale(out, r, ob, max_scale, F(0.9875), 0)
            if empty:
                continue
            for ib in range(16):
                l = max(0, min(15, nint(HALF * (idd * scales[ib] - ONE))))
                out[r, ob + 74 + ib // 2] |= l << (4 * (ib % 2))
