"""Shared cases for the lattice i-quant tests (test_quant_iq1/iq2/iq3.py): hard rows, and the checks
every type runs against ggml's own quantizer and dequantizer (formats/ggml_lib.py)."""

from __future__ import annotations

import threading

import numpy as np


def hard_rows(seed: int, n_rows: int = 48, n: int = 512):
    """Gaussian rows with outliers, exact zeros, all-zero sub-blocks (of 16 and 32: IQ3_S then packs
    the next sub-block's bytes in their place) and super-blocks, values below each type's epsilon,
    one-signed rows (odd sign counts in every group), many equal values (the order of ties decides
    IQ1's split) and -0.0; heavy-tailed importance weights, some zero, like an imatrix's."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, n)).astype(np.float32) * np.float32(0.02)
    x[rng.random(x.shape) < 0.01] *= 30  # outliers
    x[rng.random(x.shape) < 0.02] = 0
    x[1, 32:64] = 0
    x[1, 160:176] = 0
    x[2, 256:512] = 0
    x[3, :256] = np.float32(1e-9) * rng.standard_normal(256).astype(np.float32)
    x[8, :256] = np.float32(1e-13) * rng.standard_normal(256).astype(np.float32)
    x[4] = np.abs(x[4])
    x[5] = -np.abs(x[5])
    x[6] = np.round(x[6] * 100)
    x[7, ::2] = np.float32(-0.0)
    qw = (rng.lognormal(0, 1.5, n) ** 2).astype(np.float32)
    qw[rng.random(n) < 0.03] = 0
    return x, qw


def assert_equal_ggml(name: str, x: np.ndarray, qw) -> None:
    """llmkit's bytes for rows x (column weights qw, or None) equal ggml_quantize_chunk's, row by row."""
    from llmkit.quant.formats import get_format, ggml_lib

    f = get_format(name)
    ours = f.quantize(x, qw)
    ref = ggml_lib.quantize(f.type_id, x, qw)
    assert ours.shape == ref.shape == (len(x), x.shape[1] // f.block * f.type_size)
    bad = np.nonzero((ours != ref).any(axis=1))[0]
    assert len(bad) == 0, f"{name}: rows {bad[:8]} differ from ggml"


def model_rows(setup, names=("blk.0.ffn_down.weight", "blk.1.attn_q.weight")):
    """(tensor name, its float32 rows, llmkit's imatrix entry) of the test_quant_binary model."""
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.calibration.imatrix import load_imatrix
    from llmkit.quant.formats import load_f32

    _, base, imx, _ = setup
    g, imatrix = read_gguf(str(base)), load_imatrix(str(imx))
    infos = {t.name: t for t in g.tensors}
    with open(base, "rb") as fh:
        for tname in names:
            yield tname, load_f32(fh, infos[tname], g.data_offset), np.asarray(imatrix[tname], np.float32)


def assert_dequantize_equals_ggml(name: str, scale_byte: int = 1) -> None:
    """On quantized rows and on random blocks (every index, sign and scale code; finite d)."""
    from llmkit.quant.formats import get_format, ggml_lib

    f = get_format(name)
    x, qw = hard_rows(7, n_rows=9)
    q = f.quantize(x, qw).reshape(-1)
    assert np.array_equal(f.dequantize(q, x.size), ggml_lib.dequantize(f.type_id, q, x.size))
    rng = np.random.default_rng(3)
    b = rng.integers(0, 256, (64, f.type_size), dtype=np.uint8)
    b[:, scale_byte] &= 0x3F  # the top byte of the fp16 super-scale below 2: finite
    n = 64 * f.block
    assert np.array_equal(f.dequantize(b.reshape(-1), n), ggml_lib.dequantize(f.type_id, b, n))


def assert_threads_same(name: str) -> None:
    """The write layer quantizes row slices from several threads at once (the kernels release the GIL)."""
    from llmkit.quant.formats import get_format

    f = get_format(name)
    x, qw = hard_rows(5, n_rows=64)
    want = f.quantize(x, qw)
    got = [None] * 4

    def work(i):
        got[i] = f.quantize(x[16 * i:16 * (i + 1)], qw)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert np.array_equal(np.concatenate(got), want)
