"""The scale searches of ggml-quants.c (make_qx_quants, make_qkx2/3_quants, make_qp_quants,
make_q3_quants), vectorised over many blocks at once.

Each function takes blocks as rows of a (B, n) float32 array and follows the C loops exactly:
float32 arithmetic in the same order (sums accumulate element by element), round-half-to-even
`nearest_int`, the same clamps and the same strict comparisons, so the chosen levels and scales —
and hence the bytes — equal llama.cpp's.

Layout: internally the blocks are transposed to (n, B), so "element i of every block" is one
contiguous vector; an in-order sum over a block is then n - 1 vector additions (numpy's own
reductions are pairwise and would round differently). Levels are kept as float32 integers
(exact), so no int/float conversions happen inside the loops.
"""

from __future__ import annotations

import numpy as np

from llmkit.quant.formats.numerics import F32, abs_max_signed_t, blocks_t, colsum, first_max_t, first_min_t, put_rows, seq_sum

GROUP_MAX_EPS = F32(1e-15)


def superblock_sigma2(x: np.ndarray, factor: float = 2.0) -> np.ndarray:
    """(nb, 256) -> factor * sum(x^2) / 256 per super-block (the K-quant imatrix weighting)."""
    return F32(factor) * seq_sum(x * x) / F32(x.shape[1])


def imatrix_weights_t(xt: np.ndarray, qwt: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
    """qw * sqrt(sigma2 + x^2) on the transposed layout (sigma2 per column): ggml's imatrix weighting
    of the K-quant and IQ4 searches."""
    wt = xt * xt
    wt += sigma2
    np.sqrt(wt, out=wt)
    wt *= qwt
    return wt


def levels_to_blocks(Lt: np.ndarray, lt: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The levels lt (n, B) requantized from the final scales, except in columns whose scale is 0,
    which keep the search's Lt (ggml: `if (!d) continue;`); returned as (B, n) uint8."""
    np.copyto(Lt, lt, where=scale != 0)
    L = np.empty(Lt.shape[::-1], np.uint8)
    put_rows(L, Lt.astype(np.uint8).T)
    return L


def _errs():
    return np.errstate(divide="ignore", invalid="ignore", over="ignore")


def _levels(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """nearest_int then clamp, kept in float32 (every value is an exact small integer)."""
    r = np.rint(v)
    np.clip(r, lo, hi, out=r)
    return r


def make_qx_quants(x: np.ndarray, nmax: int, rmse_type: int, qw: np.ndarray | None = None, transposed: bool = False):
    """Symmetric levels l in [-nmax, nmax-1] (returned + nmax) and the scale: the start scale
    -nmax/max, refined by least squares, then 18 nearby scales tried. Returns (scale, L): L as
    (blocks, n) int32, or with `transposed` (x and qw given as (n, B)) as (n, B) float32."""
    xt = x if transposed else blocks_t(x)
    mx = abs_max_signed_t(xt)
    zero = np.abs(mx) < GROUP_MAX_EPS
    if qw is not None:
        w = qw if transposed else blocks_t(qw)
    elif rmse_type == 1:
        w = xt * xt
    elif rmse_type == 2:
        w = np.ones_like(xt)
    elif rmse_type == 3:
        w = np.abs(xt)
    else:
        w = np.sqrt(np.abs(xt))
    wx = w * xt
    with _errs():
        iscale = F32(-nmax) / mx
        if rmse_type == 0:
            scale = F32(1) / iscale
        else:
            l, tmp = np.empty_like(xt), np.empty_like(xt)

            def sums(isc):
                np.multiply(xt, isc, out=l)
                np.rint(l, out=l)
                np.clip(l, -nmax, nmax - 1, out=l)
                np.multiply(wx, l, out=tmp)
                sumlx = np.add.reduce(tmp, axis=0)
                np.multiply(w, l, out=tmp)
                np.multiply(tmp, l, out=tmp)
                return sumlx, np.add.reduce(tmp, axis=0)

            sumlx, suml2 = sums(iscale)
            scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
            best = scale * sumlx
            best_iscale = iscale  # the levels are recomputed once at the end from the winning scale
            for step in range(-9, 10):
                if step == 0:
                    continue
                iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
                sumlx, suml2 = sums(iscale)
                better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
                if better.any():
                    best_iscale = np.where(better, iscale, best_iscale)
                    scale = np.where(better, sumlx / suml2, scale)
                    best = np.where(better, scale * sumlx, best)
            iscale = best_iscale
        L = _levels(xt * iscale, -nmax, nmax - 1)
    scale = np.where(zero, F32(0), scale).astype(F32)
    L += F32(nmax)
    L[:, zero] = 0
    return scale, (L if transposed else L.T.astype(np.int32))


def make_qkx(x: np.ndarray, nmax: int, w: np.ndarray, rmin: float, rdelta: float, nstep: int, use_mad: bool,
             transposed: bool = False):
    """Asymmetric levels in [0, nmax] with a scale and a min (make_qkx2_quants; make_qkx3_quants is
    the same search). Returns (scale, the_min = -min, L). With `transposed`, x and w are already
    (n, B) float32 (blocks as columns) and L comes back as (n, B) float32.

    Per step only the per-block sums are kept; the winning step's (iscale, min) is remembered and
    its levels recomputed once at the end (the same float32 operations give the same levels)."""
    xt = x if transposed else blocks_t(x)
    wt = w if transposed else blocks_t(w)
    mn = first_min_t(xt)
    mx = first_max_t(xt)
    add = np.add.reduce
    sum_w = add(wt, axis=0)
    la, wl, tmp = np.empty_like(xt), np.empty_like(xt), np.empty_like(xt)
    np.multiply(wt, xt, out=tmp)
    sum_x = add(tmp, axis=0)
    mn = np.where(mn > 0, F32(0), mn).astype(F32)
    flat = mx <= mn
    xm = np.empty_like(xt)  # x - min for the current min

    with _errs():
        np.subtract(xt, mn, out=xm)
        iscale = F32(nmax) / (mx - mn)
        scale = F32(1) / iscale
        _qkx_levels(xm, iscale, nmax, la)
        best = _qkx_error(la, scale, mn, xt, wt, use_mad, tmp)
        cur_min = mn
        best_iscale, best_base = iscale, mn  # levels = clip(rint(best_iscale * (x - best_base)))
        for step in range(nstep + 1):
            # `min` moves when a step wins, and later steps start from the moved value (as in C)
            iscale = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / (mx - cur_min)
            _qkx_levels(xm, iscale, nmax, la)
            this_scale, this_min, D = _qkx_fit(la, xt, wt, sum_w, sum_x, wl, tmp)
            cur = _qkx_error(la, this_scale, this_min, xt, wt, use_mad, tmp)
            better = (D > 0) & (cur < best)
            if better.any():
                best_iscale = np.where(better, iscale, best_iscale)
                best_base = np.where(better, cur_min, best_base)
                best = np.where(better, cur, best)
                scale = np.where(better, this_scale, scale)
                cur_min = np.where(better, this_min, cur_min)
                np.subtract(xt, cur_min, out=xm)
        np.subtract(xt, best_base, out=xm)
        _qkx_levels(xm, best_iscale, nmax, la)
    scale = np.where(flat, F32(0), scale).astype(F32)
    la[:, flat] = 0
    cur_min = np.where(flat, mn, cur_min).astype(F32)
    return scale, (-cur_min).astype(F32), (la if transposed else la.T.astype(np.int32))


def _qkx_levels(xm, iscale, nmax: int, la) -> None:
    """la = clip(nearest_int(iscale * (x - min)), 0, nmax), `xm` holding x - min."""
    np.multiply(xm, iscale, out=la)
    np.rint(la, out=la)
    np.clip(la, 0, nmax, out=la)


def _qkx_error(la, scale, the_min, xt, wt, use_mad: bool, tmp):
    """Per block, the sum of w * |d| (use_mad) or w * d^2, d = scale * l + min - x, in C's order."""
    np.multiply(la, scale, out=tmp)
    np.add(tmp, the_min, out=tmp)
    np.subtract(tmp, xt, out=tmp)
    if use_mad:
        np.abs(tmp, out=tmp)
    else:
        np.multiply(tmp, tmp, out=tmp)
    np.multiply(tmp, wt, out=tmp)
    return np.add.reduce(tmp, axis=0)


def _qkx_fit(la, xt, wt, sum_w, sum_x, wl, tmp):
    """The weighted least-squares (scale, min) for the levels `la`, and its determinant D (the fit
    counts only where D > 0); a positive min is replaced by 0 with the scale refitted alone."""
    add = np.add.reduce
    np.multiply(wt, la, out=wl)
    sum_l = add(wl, axis=0)
    np.multiply(wl, la, out=tmp)
    sum_l2 = add(tmp, axis=0)
    np.multiply(wl, xt, out=tmp)
    sum_xl = add(tmp, axis=0)
    D = sum_w * sum_l2 - sum_l * sum_l
    this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
    this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
    pos = this_min > 0
    if pos.any():
        this_min = np.where(pos, F32(0), this_min)
        this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
    return this_scale, this_min, D


def make_qp_quants(x: np.ndarray, nmax: int, qw: np.ndarray):
    """Non-negative levels in [0, nmax] for the block scales of K-quants with an imatrix:
    a grid of 9 scales, then coordinate descent (5 rounds). Returns (scale, L)."""
    xt = blocks_t(x)
    wt = blocks_t(qw)
    n, B = xt.shape
    mx = np.maximum(F32(0), xt.max(axis=0)).astype(F32)
    zero = mx < GROUP_MAX_EPS
    with _errs():
        iscale = F32(nmax) / mx
        L = np.rint(iscale * xt)
        scale = F32(1) / iscale
        diff = xt - scale * L
        best = colsum(wt * diff * diff)
        for step in range(-4, 5):
            if step == 0:
                continue
            iscale_is = (F32(0.1) * F32(step) + F32(nmax)) / mx
            scale_is = F32(1) / iscale_is
            l = np.minimum(F32(nmax), np.rint(iscale_is * xt))
            diff = xt - scale_is * l
            mse = colsum(wt * diff * diff)
            better = mse < best
            best = np.where(better, mse, best)
            iscale = np.where(better, iscale_is, iscale)
        L = np.minimum(F32(nmax), np.rint(iscale * xt))
        scale = _descend(xt, wt, L, ~zero, None, nmax, q3=False)
    scale = np.where(zero, F32(0), scale).astype(F32)
    L = np.where(zero, F32(0), L)
    return scale, L.T.astype(np.int32)


def _descend(xt, wt, L, active, lo, hi, q3: bool) -> np.ndarray:
    """Coordinate descent on the levels L (updated in place), maximising sumlx^2 / suml2: each
    level in turn moves to round(x * suml2 / sumlx) of the others when that improves the block;
    at most 5 rounds, a block stops after a round without change. Returns the scale sumlx/suml2.

    make_qp_quants (q3=False) only tries when both partial sums are positive and clamps at hi;
    make_q3_quants (q3=True) tests sumlx > 0 first, clamps to [lo, hi] and needs suml2 > 0 after."""
    n, B = xt.shape
    sumlx = colsum(wt * xt * L)
    suml2 = colsum(wt * L * L)
    cols = np.flatnonzero(active)  # blocks still descending: after one round few remain
    for _ in range(5):
        if len(cols) == 0:
            break
        full = len(cols) == B
        x_, w_, L_ = (xt, wt, L) if full else (xt[:, cols], wt[:, cols], L[:, cols])
        sx, s2 = (sumlx, suml2) if full else (sumlx[cols], suml2[cols])
        changed = np.zeros(len(cols), bool)
        for i in range(n):
            xi, w, li = x_[i], w_[i], L_[i]
            slx = sx - w * xi * li
            sl2 = s2 - w * li * li
            new_l = np.rint(xi * sl2 / slx)
            new_l = np.clip(new_l, lo, hi) if lo is not None else np.minimum(F32(hi), new_l)
            slx2 = slx + w * xi * new_l
            sl22 = sl2 + w * new_l * new_l
            ok = (sl22 > 0) if q3 else (sl2 > 0)
            accept = (slx > 0) & ok & (new_l != li) & (slx2 * slx2 * s2 > sx * sx * sl22)
            if accept.any():
                L_[i] = np.where(accept, new_l, li)
                sx = np.where(accept, slx2, sx)
                s2 = np.where(accept, sl22, s2)
                changed |= accept
        if full:
            sumlx, suml2 = sx, s2
        else:
            L[:, cols], sumlx[cols], suml2[cols] = L_, sx, s2
        cols = cols[changed]
    return np.where(suml2 > 0, sumlx / suml2, F32(0)).astype(F32)


def make_q3_quants(x: np.ndarray, nmax: int, transposed: bool = False):
    """Q3_K's symmetric search (do_rmse): start at -nmax/max, then coordinate descent on the
    x^2-weighted error (5 rounds). Returns (scale, L + nmax); with `transposed`, x is (n, B) and
    L comes back as (n, B) float32."""
    xt = x if transposed else blocks_t(x)
    n, B = xt.shape
    mx = abs_max_signed_t(xt)
    zero = np.abs(mx) < GROUP_MAX_EPS
    wt = xt * xt
    with _errs():
        iscale = F32(-nmax) / mx
        L = _levels(iscale * xt, -nmax, nmax - 1)
        scale = _descend(xt, wt, L, ~zero, -nmax, nmax - 1, q3=True)
    scale = np.where(zero, F32(0), scale).astype(F32)
    L = np.where(zero, F32(0), L + F32(nmax))
    return scale, (L if transposed else L.T.astype(np.int32))
