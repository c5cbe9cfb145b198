"""Write synthetic importance matrices for tests: llama-imatrix's legacy .dat layout, which both
llama-quantize and llmkit read, with positive random values for every blk.* matrix of a model."""

from __future__ import annotations

import struct

import numpy as np


def write_imatrix_dat(path, model, *, seed=0, skip=(), ncall=4, dataset="synthetic.txt"):
    """Every quantizable blk.* matrix of the GGUF `model` gets ne0 (x experts) values, except the names
    in `skip`. Values are sums over `ncall` calls (the readers divide by it)."""
    from llmkit.gguf.reader import read_gguf

    rng = np.random.default_rng(seed)
    entries = []
    for t in read_gguf(str(model)).tensors:
        if not t.name.startswith("blk.") or len(t.shape) < 2 or "norm" in t.name or "gate_inp" in t.name:
            continue
        if t.name in skip:
            continue
        n = t.shape[0] * (t.shape[2] if len(t.shape) > 2 else 1)
        v = (rng.gamma(0.5, 1.0, n) + 1e-3).astype(np.float32)
        v[rng.random(n) < 0.05] *= 30.0  # a few strongly driven columns
        entries.append((t.name, v))
    out = [struct.pack("<i", len(entries))]
    for name, v in entries:
        b = name.encode()
        out += [struct.pack("<i", len(b)), b, struct.pack("<ii", ncall, len(v)),
                (v * np.float32(ncall)).astype("<f4").tobytes()]
    ds = dataset.encode()
    out += [struct.pack("<i", ncall), struct.pack("<i", len(ds)), ds]
    with open(path, "wb") as f:
        f.write(b"".join(out))
    return path
