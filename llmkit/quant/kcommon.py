"""The scale searches of ggml-quants.c (make_qx_quants, make_qkx2/3_quants, make_qp_quants,
make_q3_quants), vectorised over many blocks at once.

Each function takes blocks as rows of a (B, n) float32 array and follows the C loops exactly:
float32 arithmetic in the same order (sums accumulate element by element), round-half-to-even
`nearest_int`, the same clamps and the same strict comparisons, so the chosen levels and scales —
and hence the bytes — equal llama.cpp's. Loops over the candidate scales stay in Python; every
step works on all blocks together.
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.base import F32, abs_max_signed, nearest_int, seq_sum

GROUP_MAX_EPS = F32(1e-15)


def row_sigma2(rows: np.ndarray) -> np.ndarray:
    """sum(x^2) / n per row, summed in order (the imatrix paths of the 32-block formats)."""
    return seq_sum(rows * rows) / F32(rows.shape[1])


def _errs():
    return np.errstate(divide="ignore", invalid="ignore", over="ignore")


def make_qx_quants(x: np.ndarray, nmax: int, rmse_type: int, qw: np.ndarray | None = None):
    """Symmetric levels l in [-nmax, nmax-1] (returned + nmax) and the scale: the start scale
    -nmax/max, refined by least squares, then 18 nearby scales tried. Returns (scale, L)."""
    mx = abs_max_signed(x)
    zero = np.abs(mx) < GROUP_MAX_EPS
    if qw is not None:
        w = qw
    elif rmse_type == 1:
        w = x * x
    elif rmse_type == 2:
        w = np.ones_like(x)
    elif rmse_type == 3:
        w = np.abs(x)
    else:
        w = np.sqrt(np.abs(x))
    with _errs():
        iscale = F32(-nmax) / mx
        l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        L = l + nmax
        if rmse_type == 0:
            scale = F32(1) / iscale
        else:
            lf = l.astype(F32)
            sumlx = seq_sum(w * x * lf)
            suml2 = seq_sum(w * lf * lf)
            scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
            best = scale * sumlx
            for step in range(-9, 10):
                if step == 0:
                    continue
                iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
                l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
                lf = l.astype(F32)
                sumlx = seq_sum(w * x * lf)
                suml2 = seq_sum(w * lf * lf)
                better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
                if better.any():
                    L = np.where(better[:, None], l + nmax, L)
                    scale = np.where(better, sumlx / suml2, scale).astype(F32)
                    best = np.where(better, scale * sumlx, best).astype(F32)
    scale = np.where(zero, F32(0), scale).astype(F32)
    L = np.where(zero[:, None], 0, L)
    return scale, L


def make_qkx(x: np.ndarray, nmax: int, w: np.ndarray, rmin: float, rdelta: float, nstep: int, use_mad: bool):
    """Asymmetric levels in [0, nmax] with a scale and a min (make_qkx2_quants; make_qkx3_quants is
    the same search). Returns (scale, the_min = -min, L)."""
    n = x.shape[1]
    mn = np.take_along_axis(x, x.argmin(axis=1)[:, None], axis=1)[:, 0]
    mx = np.take_along_axis(x, x.argmax(axis=1)[:, None], axis=1)[:, 0]
    sum_w = seq_sum(w)
    sum_x = seq_sum(w * x)
    mn = np.where(mn > 0, F32(0), mn).astype(F32)
    flat = mx <= mn
    with _errs():
        iscale = F32(nmax) / (mx - mn)
        scale = F32(1) / iscale
        L = np.clip(nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax)
        diff = scale[:, None] * L.astype(F32) + mn[:, None] - x
        diff = np.abs(diff) if use_mad else diff * diff
        best = seq_sum(w * diff)
        cur_min = mn.copy()
        for step in range(nstep + 1):
            # `min` moves when a step wins, and later steps start from the moved value (as in C)
            iscale = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / (mx - cur_min)
            la = np.clip(nearest_int(iscale[:, None] * (x - cur_min[:, None])), 0, nmax)
            lf = la.astype(F32)
            sum_l = seq_sum(w * lf)
            sum_l2 = seq_sum(w * lf * lf)
            sum_xl = seq_sum(w * lf * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            ok = D > 0
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_min = np.where(pos, F32(0), this_min).astype(F32)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale).astype(F32)
            diff = this_scale[:, None] * lf + this_min[:, None] - x
            diff = np.abs(diff) if use_mad else diff * diff
            cur = seq_sum(w * diff)
            better = ok & (cur < best)
            if better.any():
                L = np.where(better[:, None], la, L)
                best = np.where(better, cur, best).astype(F32)
                scale = np.where(better, this_scale, scale).astype(F32)
                cur_min = np.where(better, this_min, cur_min).astype(F32)
    scale = np.where(flat, F32(0), scale).astype(F32)
    L = np.where(flat[:, None], 0, L)
    cur_min = np.where(flat, mn, cur_min).astype(F32)
    del n
    return scale, (-cur_min).astype(F32), L


def make_qp_quants(x: np.ndarray, nmax: int, qw: np.ndarray):
    """Non-negative levels in [0, nmax] for the block scales of K-quants with an imatrix:
    a grid of 9 scales, then coordinate descent (5 rounds). Returns (scale, L)."""
    B, n = x.shape
    mx = np.maximum(F32(0), x.max(axis=1)).astype(F32)
    zero = mx < GROUP_MAX_EPS
    with _errs():
        iscale = F32(nmax) / mx
        L = nearest_int(iscale[:, None] * x)
        scale = F32(1) / iscale
        diff = x - scale[:, None] * L.astype(F32)
        best = seq_sum(qw * diff * diff)
        for step in range(-4, 5):
            if step == 0:
                continue
            iscale_is = (F32(0.1) * F32(step) + F32(nmax)) / mx
            scale_is = F32(1) / iscale_is
            l = np.minimum(nmax, nearest_int(iscale_is[:, None] * x))
            diff = x - scale_is[:, None] * l.astype(F32)
            mse = seq_sum(qw * diff * diff)
            better = mse < best
            best = np.where(better, mse, best).astype(F32)
            iscale = np.where(better, iscale_is, iscale).astype(F32)
        L = np.minimum(nmax, nearest_int(iscale[:, None] * x))
        Lf = L.astype(F32)
        sumlx = seq_sum(qw * x * Lf)
        suml2 = seq_sum(qw * Lf * Lf)
        active = ~zero
        for _ in range(5):
            changed_any = np.zeros(B, bool)
            for i in range(n):
                w, xi, li = qw[:, i], x[:, i], L[:, i].astype(F32)
                slx = sumlx - w * xi * li
                sl2 = suml2 - w * li * li
                cond = active & (slx > 0) & (sl2 > 0)
                new_l = np.minimum(nmax, nearest_int(xi * sl2 / slx))
                cond &= new_l != L[:, i]
                nl = new_l.astype(F32)
                slx2 = slx + w * xi * nl
                sl22 = sl2 + w * nl * nl
                accept = cond & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
                if accept.any():
                    L[:, i] = np.where(accept, new_l, L[:, i])
                    sumlx = np.where(accept, slx2, sumlx).astype(F32)
                    suml2 = np.where(accept, sl22, suml2).astype(F32)
                    changed_any |= accept
            active &= changed_any
            if not active.any():
                break
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0)).astype(F32)
    scale = np.where(zero, F32(0), scale).astype(F32)
    L = np.where(zero[:, None], 0, L)
    return scale, L


def make_q3_quants(x: np.ndarray, nmax: int):
    """Q3_K's symmetric search (do_rmse): start at -nmax/max, then coordinate descent on the
    x^2-weighted error (5 rounds). Returns (scale, L + nmax)."""
    B, n = x.shape
    mx = abs_max_signed(x)
    zero = np.abs(mx) < GROUP_MAX_EPS
    w_all = x * x
    with _errs():
        iscale = F32(-nmax) / mx
        L = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        Lf = L.astype(F32)
        sumlx = seq_sum(w_all * x * Lf)
        suml2 = seq_sum(w_all * Lf * Lf)
        active = ~zero
        for _ in range(5):
            changed_any = np.zeros(B, bool)
            for i in range(n):
                xi = x[:, i]
                w = w_all[:, i]
                li = L[:, i].astype(F32)
                slx = sumlx - w * xi * li
                cond = active & (slx > 0)
                sl2 = suml2 - w * li * li
                new_l = np.clip(nearest_int(xi * sl2 / slx), -nmax, nmax - 1)
                cond &= new_l != L[:, i]
                nl = new_l.astype(F32)
                slx2 = slx + w * xi * nl
                sl22 = sl2 + w * nl * nl
                accept = cond & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
                if accept.any():
                    L[:, i] = np.where(accept, new_l, L[:, i])
                    sumlx = np.where(accept, slx2, sumlx).astype(F32)
                    suml2 = np.where(accept, sl22, suml2).astype(F32)
                    changed_any |= accept
            active &= changed_any
            if not active.any():
                break
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0)).astype(F32)
    scale = np.where(zero, F32(0), scale).astype(F32)
    L = np.where(zero[:, None], 0, L + nmax)
    return scale, L


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


def superblock_sigma2(x: np.ndarray, factor: float = 2.0) -> np.ndarray:
    """(nb, 256) -> factor * sum(x^2) / 256 per super-block (the K-quant imatrix weighting)."""
    return F32(factor) * seq_sum(x * x) / F32(x.shape[1])
