"""How much the model's output cares about each kind of tensor (module doc of allocate.py, step 2):
one probe per kind (that kind quantized to Q4_0, everything else Q8_0), its KL divergence to the
all-Q8_0 model on the calibration text, per unit of the kind's added error. Probes are cached by
model file, imatrix and text, so trying several budgets probes once.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from llmkit.gguf.reader import read_gguf
from llmkit.io import atomic_write_text, cache_dir
from llmkit.quant.budget.measure import Item
from llmkit.quant.quality.kld import kl_divergence, save_base
from llmkit.quant.write.quantize import quantize_file


def probe_sensitivity(src: str, items: list[Item], calib_text: str, imatrix=None, n_ctx: int = 256, chunks: int = 4,
                      threads=None, progress=None) -> dict:
    """KLD per unit of added error for each tensor kind (allocate.py's module doc, step 2)."""
    kinds = sorted({i.kind for i in items if i.fixed is None and "Q4_0" in i.bytes and "Q8_0" in i.bytes})
    out = {}
    with tempfile.TemporaryDirectory(prefix="llmkit-probe-") as tmp:
        ref = os.path.join(tmp, "ref.gguf")
        base = os.path.join(tmp, "ref.kld")
        assign = {i.name: ("Q8_0" if "Q8_0" in i.bytes else max(i.bytes, key=i.bytes.get))
                  for i in items if i.fixed is None}
        quantize_file(src, ref, "Q8_0", pure=True, imatrix=imatrix, allow_requantize=True, threads=threads,
                      assign=assign)
        save_base(ref, calib_text, base, n_ctx, chunks, threads)
        # a probe differs from the reference only in one kind's tensors: the others are copied from
        # the reference file's quantized bytes instead of being quantized again
        refg = read_gguf(ref)
        mm = np.memmap(ref, np.uint8, "r")
        ref_bytes = {t.name: mm[refg.data_offset + t.offset:refg.data_offset + t.offset + t.nbytes]
                     for t in refg.tensors if t.name in assign}
        for n, kind in enumerate(kinds):
            if progress:
                progress(n, len(kinds), f"probe {kind}")
            probe = os.path.join(tmp, "probe.gguf")
            a = dict(assign)
            added = 0.0
            for i in items:
                if i.kind == kind and i.fixed is None and "Q4_0" in i.bytes:
                    a[i.name] = "Q4_0"
                    added += i.error["Q4_0"] - i.error[assign[i.name]]
            keep = {name: b for name, b in ref_bytes.items() if a[name] == assign[name]}
            quantize_file(src, probe, "Q8_0", pure=True, imatrix=imatrix, allow_requantize=True, threads=threads,
                          assign=a, replace=keep)
            kld = kl_divergence(probe, base, threads).kld_mean
            out[kind] = max(kld, 0.0) / added if added > 0 else 0.0
            os.unlink(probe)
    # kinds that could not be probed take the median factor
    known = [v for v in out.values() if v > 0]
    fill = float(np.median(known)) if known else 1.0
    for i in items:
        if i.fixed is None and i.kind not in out:
            out[i.kind] = fill
    return out


PROBE_VERSION = 1


def probe_key(src, imatrix, calib_text, n_ctx, chunks) -> str:
    """Identity of a sensitivity probe: the model file (path, size, mtime), the imatrix's contents,
    the calibration text and its chunking. Trying several budgets probes once."""
    import hashlib

    h = hashlib.sha256()
    st = os.stat(src)
    h.update(f"{PROBE_VERSION}|{os.path.abspath(src)}|{st.st_size}|{st.st_mtime_ns}|{n_ctx}|{chunks}|".encode())
    h.update(calib_text.encode("utf-8"))
    for name in sorted(imatrix or {}):
        h.update(name.encode())
        h.update(np.ascontiguousarray(imatrix[name], np.float32).tobytes())
    return h.hexdigest()[:32]


def _probe_cache(key: str) -> str:
    return os.path.join(os.environ.get("LLMKIT_PROBE_CACHE") or str(cache_dir("quant-probes")), key + ".json")


def cached_probe(key: str) -> dict | None:
    try:
        with open(_probe_cache(key), encoding="utf-8") as f:
            d = json.load(f)
        return {str(k): float(v) for k, v in d.items()}
    except (OSError, ValueError, AttributeError):
        return None


def store_probe(key: str, sens: dict) -> None:
    try:
        os.makedirs(os.path.dirname(_probe_cache(key)), exist_ok=True)
        atomic_write_text(_probe_cache(key), json.dumps(sens))
    except OSError:
        pass  # a cache that cannot be written only costs time
