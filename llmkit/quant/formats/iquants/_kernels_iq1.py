"""numba kernels of the 1-bit i-quants: ggml-quants.c's quantize_row_iq1_s_impl and
quantize_row_iq1_m_impl, loop for loop, in float32 and C's operation order (jit.py says why that
keeps the bytes identical). Imported only through iq1.kernels().

Each kernel takes x (n_blocks, 256) float32 (whole rows, row after row), qw (blocks per row, 256)
float32 (the imatrix, used when use_qw), the 2048-point grid as levels (2048, 8) uint8 (0, 1, 2:
(grid - 1) // 2 of iq2grid.tables(2048)), its kmap and neighbour lists, and fills
out (n_blocks, type_size) uint8. They hold no Python object, so they run without the GIL."""

from __future__ import annotations

import numpy as np
from numba import njit

from llmkit.quant.formats._kernels import OPTS, fp16_bits, nearest_int, put_half

F = np.float32
ZERO, HALF, ONE = F(0.0), F(0.5), F(1.0)
FLT_MAX = F(np.finfo(np.float32).max)
DELTA = F(0.125)  # IQ1S_DELTA = IQ1M_DELTA
EPS_S = F(1e-12)  # GROUP_MAX_EPS_IQ1_S
EPS_M = F(1e-7)  # GROUP_MAX_EPS_IQ1_M


@njit(inline="always", **OPTS)
def _shifted(sign):
    """x_p (sign +1) or x_m (-1): the three values -1, 0, 1 shifted by +-DELTA."""
    d = DELTA if sign > 0 else -DELTA
    v = np.empty(3, F)
    v[0] = F(-1) + d
    v[1] = d
    v[2] = ONE + d
    return v


@njit(inline="always", **OPTS)
def _sort_index(x, b, off, n, idx):
    """idx[0:n] = the order of x[b, off:off+n] ascending; equal values keep their order (glibc's qsort
    of these small arrays is a merge sort, so stable; any stable sort gives the same order)."""
    for j in range(n):
        idx[j] = j
    for j in range(1, n):
        v = idx[j]
        key = x[b, off + v]
        m = j - 1
        while m >= 0 and x[b, off + idx[m]] > key:
            idx[m + 1] = idx[m]
            m -= 1
        idx[m + 1] = v


@njit(inline="always", **OPTS)
def _best_neighbour2(neigh, start, lev, x, b, off, weight, woff, scale, xx, L, loff, terms):
    """iq1_find_best_neighbour2: the listed grid point whose values xx[l] * scale are nearest to
    x[b, off:off+8] (weights weight[woff:]); its levels go to L[loff:loff+8]. Returns its index.
    The distance terms w * diff * diff take only 3 values per coordinate: they are computed once
    (terms[i, l]) and summed per neighbour in C's order, the same floats as computed inline."""
    for i in range(8):
        w = weight[woff + i]
        for l in range(3):
            diff = scale * xx[l] - x[b, off + i]
            terms[i, l] = w * diff * diff
    n = np.int64(neigh[start])
    best = FLT_MAX
    gi = -1
    for j in range(1, n + 1):
        g = np.int64(neigh[start + j])
        d2 = ZERO
        for i in range(8):
            d2 += terms[i, lev[g, i]]
        if d2 < best:
            best = d2
            gi = g
    if gi < 0:  # no finite distance: ggml scans the whole grid (and reads past the group; finite input never gets here)
        for g in range(lev.shape[0]):
            d2 = ZERO
            for i in range(8):
                d2 += terms[i, lev[g, i]]
            if d2 < best:
                best = d2
                gi = g
        if gi < 0:
            gi = 0
    for i in range(8):
        L[loff + i] = lev[gi, i]
    return gi


@njit(inline="always", **OPTS)
def _sigma2(x, b):
    s = ZERO
    for i in range(256):
        s += x[b, i] * x[b, i]
    return F(2) * s / F(256)


@njit(inline="always", **OPTS)
def _weights(x, b, qw, use_qw, off, n, sigma2, weight):
    q = b % qw.shape[0]
    for i in range(n):
        v = x[b, off + i]
        weight[i] = qw[q, off + i] * np.sqrt(sigma2 + v * v) if use_qw else v * v


@njit(inline="always", **OPTS)
def _absmax(x, b, off, n):
    mx = abs(x[b, off])
    for i in range(1, n):
        a = abs(x[b, off + i])
        mx = mx if mx > a else a
    return mx


@njit(inline="always", **OPTS)
def _grid_code(L, off):
    u = 0
    for j in range(8):
        u |= L[off + j] << (2 * j)
    return u


@njit(**OPTS)
def iq1_s(x, qw, use_qw, lev, kmap, neigh, out):
    """quantize_row_iq1_s_impl: d, 32 low index bytes, per sub-block of 32 a u16 of 4x3 high index
    bits, a 3-bit scale and the sign of its shift (bit 15)."""
    weight = np.empty(32, F)
    L = np.empty(32, np.int64)
    idx = np.empty(32, np.int64)
    sumx = np.empty(33, F)
    sumw = np.empty(33, F)
    scales = np.empty(8, F)
    shifts = np.empty(8, np.int64)
    index = np.empty(4, np.int64)
    ep = np.empty(33, F)
    em = np.empty(33, F)
    ewp = np.empty(33, F)
    ewm = np.empty(33, F)
    terms = np.empty((8, 3), F)
    x_p = _shifted(1)
    x_m = _shifted(-1)
    for b in range(x.shape[0]):
        for j in range(50):
            out[b, j] = 0
        max_scale = ZERO
        sigma2 = _sigma2(x, b)
        for ib in range(8):
            off = 32 * ib
            _weights(x, b, qw, use_qw, off, 32, sigma2, weight)
            if _absmax(x, b, off, 32) < EPS_S:
                scales[ib] = ZERO
                shifts[ib] = 1
                continue
            # the exact weighted least squares over the two boundaries splitting the sorted weights
            # into levels -1, 0, 1 (ggml's comment), each with both shifts
            _sort_index(x, b, off, 32, idx)
            sumx[0] = ZERO
            sumw[0] = ZERO
            for j in range(32):
                i = idx[j]
                sumx[j + 1] = sumx[j] + weight[i] * x[b, off + i]
                sumw[j + 1] = sumw[j] + weight[i]
            best_score = -FLT_MAX
            scale = _absmax(x, b, off, 32)
            besti1 = -1
            besti2 = -1
            best_shift = 0
            for i2 in range(33):  # the terms of the top group, per boundary i2 (the same values C computes inline)
                e = sumx[32] - sumx[i2]
                ew = sumw[32] - sumw[i2]
                ep[i2] = e * x_p[2]
                em[i2] = e * x_m[2]
                ewp[i2] = ew * x_p[2] * x_p[2]
                ewm[i2] = ew * x_m[2] * x_m[2]
            for i1 in range(33):
                a = sumx[i1] - sumx[0]
                aw = sumw[i1] - sumw[0]
                ap = a * x_p[0]
                am = a * x_m[0]
                awp = aw * x_p[0] * x_p[0]
                awm = aw * x_m[0] * x_m[0]
                for i2 in range(i1, 33):
                    c = sumx[i2] - sumx[i1]
                    cw = sumw[i2] - sumw[i1]
                    sumqx = ap + c * x_p[1] + ep[i2]
                    sumq2 = awp + cw * x_p[1] * x_p[1] + ewp[i2]
                    if sumq2 > ZERO and sumqx * sumqx > best_score * sumq2:
                        scale = sumqx / sumq2
                        best_score = scale * sumqx
                        besti1 = i1
                        besti2 = i2
                        best_shift = 1
                    sumqx = am + c * x_m[1] + em[i2]
                    sumq2 = awm + cw * x_m[1] * x_m[1] + ewm[i2]
                    if sumq2 > ZERO and sumqx * sumqx > best_score * sumq2:
                        scale = sumqx / sumq2
                        best_score = scale * sumqx
                        besti1 = i1
                        besti2 = i2
                        best_shift = -1
            if besti1 < 0 or besti2 < 0 or best_shift == 0:
                scales[ib] = ZERO
                shifts[ib] = 1
                continue
            for j in range(32):
                L[idx[j]] = 0 if j < besti1 else (1 if j < besti2 else 2)
            if scale < ZERO:
                for j in range(32):
                    L[j] = 2 - L[j]
                scale = -scale
                best_shift = -best_shift
            xx = x_p if best_shift == 1 else x_m
            all_on_grid = True
            for k in range(4):
                u = _grid_code(L, 8 * k)
                gi = np.int64(kmap[u])
                if gi < 0:
                    all_on_grid = False
                    gi = _best_neighbour2(neigh, -gi - 1, lev, x, b, off + 8 * k, weight, 8 * k, scale, xx, L, 8 * k,
                                          terms)
                index[k] = gi
            if not all_on_grid:
                sumqx = ZERO
                sumq2 = ZERO
                for k in range(4):
                    for j in range(8):
                        w = weight[8 * k + j]
                        q = xx[lev[index[k], j]]
                        sumqx += w * q * x[b, off + 8 * k + j]
                        sumq2 += w * q * q
                if sumqx > ZERO and sumq2 > ZERO:
                    scale = sumqx / sumq2
            h = 0
            for k in range(4):
                out[b, 2 + 4 * ib + k] = index[k] & 255
                h |= (index[k] >> 8) << (3 * k)
            out[b, 34 + 2 * ib] = h & 0xFF
            out[b, 35 + 2 * ib] = h >> 8
            scales[ib] = scale
            shifts[ib] = best_shift
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == ZERO:
            continue
        d = max_scale / F(15)
        put_half(out, b, 0, d * F(1.125))
        idv = ONE / d
        for ib in range(8):
            l = nearest_int(HALF * (idv * scales[ib] - ONE))
            l = max(0, min(7, l))
            if shifts[ib] == -1:
                l |= 8
            out[b, 35 + 2 * ib] |= l << 4


@njit(inline="always", **OPTS)
def _half_values(k, best_k, x_p, x_m):
    """The shifted values of group k (0 or 1) of an IQ1_M sub-block under shift choice best_k."""
    if k == 0:
        return x_p if best_k < 2 else x_m
    return x_p if best_k % 2 == 0 else x_m


@njit(**OPTS)
def iq1_m(x, qw, use_qw, lev, kmap, neigh, out):
    """quantize_row_iq1_m_impl: 32 low index bytes, per sub-block of 16 a byte of 2x3 high index bits
    and 2 shift signs, 8 bytes of 3-bit scales whose top nibbles carry the fp16 super-scale."""
    weight = np.empty(16, F)
    L = np.empty(16, np.int64)
    idx = np.empty(16, np.int64)
    px = np.empty((2, 17), F)
    pw = np.empty((2, 17), F)
    scales = np.empty(16, F)
    shifts = np.empty(16, np.int64)
    index = np.empty(2, np.int64)
    c2p = np.empty((2, 17), F)
    c2m = np.empty((2, 17), F)
    sc = np.empty(4, np.int64)
    terms = np.empty((8, 3), F)
    x_p = _shifted(1)
    x_m = _shifted(-1)
    p2 = x_p[2]
    m2 = x_m[2]
    cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1]
    cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2]
    cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1]
    cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2]
    for b in range(x.shape[0]):
        for j in range(56):
            out[b, j] = 0
        max_scale = ZERO
        sigma2 = _sigma2(x, b)
        for ib in range(16):
            off = 16 * ib
            _weights(x, b, qw, use_qw, off, 16, sigma2, weight)
            mx = _absmax(x, b, off, 16)
            if mx < EPS_M:
                scales[ib] = ZERO
                shifts[ib] = 0
                continue
            _sort_index(x, b, off, 16, idx)
            best_score = -FLT_MAX
            scale = mx
            besti1 = -1
            besti2 = -1
            best_k = -1
            # prefix sums per half (each half of 8 has its own shift), as ggml keeps them
            px[0, 0] = ZERO
            px[1, 0] = ZERO
            pw[0, 0] = ZERO
            pw[1, 0] = ZERO
            for j in range(16):
                i = idx[j]
                h = 0 if i < 8 else 1
                px[h, j + 1] = px[h, j] + weight[i] * x[b, off + i]
                px[1 - h, j + 1] = px[1 - h, j]
                pw[h, j + 1] = pw[h, j] + weight[i]
                pw[1 - h, j + 1] = pw[1 - h, j]
            tx0 = px[0, 16]
            tx1 = px[1, 16]
            tp0 = tx0 * p2
            tp1 = tx1 * p2
            tm0 = tx0 * m2
            tm1 = tx1 * m2
            for i2 in range(17):  # the per-i2 products (the same values C computes inline)
                c2p[0, i2] = pw[0, i2] * cp2
                c2p[1, i2] = pw[1, i2] * cp2
                c2m[0, i2] = pw[0, i2] * cm2
                c2m[1, i2] = pw[1, i2] * cm2
            for i1 in range(17):
                # tws*p2*p2 + pw[i1]*cp1, per half and shift: the part of q2 fixed by i1
                bp0 = pw[0, 16] * p2 * p2 + pw[0, i1] * cp1
                bp1 = pw[1, 16] * p2 * p2 + pw[1, i1] * cp1
                bm0 = pw[0, 16] * m2 * m2 + pw[0, i1] * cm1
                bm1 = pw[1, 16] * m2 * m2 + pw[1, i1] * cm1
                a0 = px[0, i1]
                a1 = px[1, i1]
                for i2 in range(i1, 17):
                    sx0 = a0 + px[0, i2]
                    sx1 = a1 + px[1, i2]
                    qxp0 = tp0 - sx0
                    qxp1 = tp1 - sx1
                    qxm0 = tm0 - sx0
                    qxm1 = tm1 - sx1
                    q2p0 = bp0 + c2p[0, i2]
                    q2p1 = bp1 + c2p[1, i2]
                    q2m0 = bm0 + c2m[0, i2]
                    q2m1 = bm1 + c2m[1, i2]
                    # the four shift choices (+,+), (+,-), (-,+), (-,-) in ggml's order
                    sqx = qxp0 + qxp1
                    sq2 = q2p0 + q2p1
                    if sq2 > ZERO and sqx * sqx > best_score * sq2:
                        scale = sqx / sq2
                        best_score = scale * sqx
                        besti1, besti2, best_k = i1, i2, 0
                    sqx = qxp0 + qxm1
                    sq2 = q2p0 + q2m1
                    if sq2 > ZERO and sqx * sqx > best_score * sq2:
                        scale = sqx / sq2
                        best_score = scale * sqx
                        besti1, besti2, best_k = i1, i2, 1
                    sqx = qxm0 + qxp1
                    sq2 = q2m0 + q2p1
                    if sq2 > ZERO and sqx * sqx > best_score * sq2:
                        scale = sqx / sq2
                        best_score = scale * sqx
                        besti1, besti2, best_k = i1, i2, 2
                    sqx = qxm0 + qxm1
                    sq2 = q2m0 + q2m1
                    if sq2 > ZERO and sqx * sqx > best_score * sq2:
                        scale = sqx / sq2
                        best_score = scale * sqx
                        besti1, besti2, best_k = i1, i2, 3
            if besti1 < 0 or besti2 < 0 or best_k < 0:
                scales[ib] = ZERO
                shifts[ib] = 0
                continue
            for j in range(16):
                L[idx[j]] = 0 if j < besti1 else (1 if j < besti2 else 2)
            if scale < ZERO:
                for j in range(16):
                    L[j] = 2 - L[j]
                scale = -scale
                best_k = 3 - best_k
            all_on_grid = True
            for k in range(2):
                xx = _half_values(k, best_k, x_p, x_m)
                u = _grid_code(L, 8 * k)
                gi = np.int64(kmap[u])
                if gi < 0:
                    all_on_grid = False
                    gi = _best_neighbour2(neigh, -gi - 1, lev, x, b, off + 8 * k, weight, 8 * k, scale, xx, L, 8 * k,
                                          terms)
                index[k] = gi
            if not all_on_grid:
                sqx = ZERO
                sq2 = ZERO
                for k in range(2):
                    xx = _half_values(k, best_k, x_p, x_m)
                    for j in range(8):
                        w = weight[8 * k + j]
                        q = xx[lev[index[k], j]]
                        sqx += w * q * x[b, off + 8 * k + j]
                        sq2 += w * q * q
                if sqx > ZERO and sq2 > ZERO:
                    scale = sqx / sq2
            out[b, 2 * ib] = index[0] & 255
            out[b, 2 * ib + 1] = index[1] & 255
            out[b, 32 + ib] = (index[0] >> 8) | ((index[1] >> 8) << 4)
            scales[ib] = scale
            shifts[ib] = best_k
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == ZERO:
            continue
        for j in range(4):
            sc[j] = 0
        d = max_scale / F(15)
        idv = ONE / d
        sqx = ZERO
        sq2 = ZERO
        for ib in range(16):
            l = nearest_int(HALF * (idv * scales[ib] - ONE))
            l = max(0, min(7, l))
            sc[ib // 4] |= l << (3 * (ib % 4))
            m = shifts[ib]
            out[b, 32 + ib] |= (0x80 if m & 1 else 0) | (0x08 if m & 2 else 0)  # masks {0x00, 0x80, 0x08, 0x88}
            off = 16 * ib
            _weights(x, b, qw, use_qw, off, 16, sigma2, weight)
            qh = np.int64(out[b, 32 + ib])
            fl = F(2 * l + 1)
            for k in range(2):
                xx = _half_values(k, m, x_p, x_m)
                g = np.int64(out[b, 2 * ib + k]) + ((qh << (8 - 4 * k)) & 0x700)
                for j in range(8):
                    w = weight[8 * k + j]
                    q = xx[lev[g, j]] * fl
                    sqx += w * q * x[b, off + 8 * k + j]
                    sq2 += w * q * q
        if sq2 > ZERO:
            d = sqx / sq2
        s = fp16_bits(d * F(1.1125))
        sc[0] |= (s & 0x000F) << 12
        sc[1] |= (s & 0x00F0) << 8
        sc[2] |= (s & 0x0F00) << 4
        sc[3] |= s & 0xF000
        for j in range(4):
            out[b, 48 + 2 * j] = sc[j] & 0xFF
            out[b, 49 + 2 * j] = (sc[j] >> 8) & 0xFF
