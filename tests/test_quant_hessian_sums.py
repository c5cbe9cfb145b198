"""The Hessian accumulation GPTQ collects through llama.cpp's eval callback: BLAS's one-triangle
update (ssyrk, in place) mirrored at the end gives x^T x summed over batches, as the general product
did; and the fallback without scipy gives the same sums."""

import builtins

import numpy as np


def _sums(batches, n):
    from llmkit.quant.calibration.imatrix import _add_gram, _mirror_upper

    h = np.zeros((n, n), np.float32)
    for x in batches:
        _add_gram(h, x)
    _mirror_upper(h, block=64)  # several bands and a partial one
    return h


def test_triangle_updates_sum_to_the_gram_matrix():
    rng = np.random.default_rng(5)
    n = 300
    batches = [rng.standard_normal((r, n)).astype(np.float32) * rng.uniform(0.1, 10, n).astype(np.float32)
               for r in (512, 17, 128)]
    ref = sum(x.T.astype(np.float64) @ x.astype(np.float64) for x in batches)
    h = _sums(batches, n)
    assert np.array_equal(h, h.T)
    assert np.abs(h - ref).max() <= 2e-6 * np.abs(ref).max()


def test_without_scipy_the_general_product_gives_the_same_sums(monkeypatch):
    rng = np.random.default_rng(6)
    batches = [rng.standard_normal((64, 70)).astype(np.float32) for _ in range(3)]
    with_blas = _sums(batches, 70)
    real_import = builtins.__import__

    def no_scipy(name, *a, **k):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    without = _sums(batches, 70)
    assert np.abs(with_blas - without).max() <= 1e-5 * np.abs(without).max()
