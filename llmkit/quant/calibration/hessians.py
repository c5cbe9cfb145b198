"""GPTQ's Hessians: H = X^T X of every matrix's inputs over calibration text (collected by
imatrix.collect), saved as a GGUF file of F32 matrices and read back memory-mapped by name."""

from __future__ import annotations

import json
import os

import numpy as np

from llmkit.errors import BadFileFormat, BadInput
from llmkit.gguf.reader import read_gguf
from llmkit.gguf.writer import write_gguf
from llmkit.quant.calibration.imatrix import collect


HESSIAN_FORMAT = "llmkit-hessians"


def save_hessians(path: str, sums: dict, counts: dict, chunks: int, n_ctx: int, model: str) -> None:
    """Write the collected H matrices (mean over tokens) as a GGUF file: one `NAME.hessian` tensor per
    distinct input, the matrices sharing it listed in `llmkit.hessian.aliases`."""
    first_of: dict[int, str] = {}
    aliases, tensors = {}, []
    for name in sorted(sums):
        h = sums[name]
        key = first_of.setdefault(id(h), name)
        if key == name:
            n = max(int(np.asarray(counts[name]).sum()), 1)
            tensors.append((f"{name}.hessian", np.asarray(h, np.float32) / np.float32(n)))
        aliases[name] = key
    kvs = [("general.type", "str", HESSIAN_FORMAT), ("llmkit.hessian.model", "str", os.path.basename(model)),
           ("llmkit.hessian.aliases", "str", json.dumps(aliases)), ("llmkit.hessian.chunks", "u32", chunks),
           ("llmkit.hessian.chunk_size", "u32", n_ctx)]
    write_gguf(path, kvs, tensors)


def hessian_index(path: str) -> dict[str, tuple[int, int]]:
    """{matrix name: (byte offset of its H in the file, dimension)} of a Hessian file (checked)."""
    g = read_gguf(path)
    if g.get("general.type") != HESSIAN_FORMAT:
        raise BadFileFormat(f"'{path}' is not a Hessian file written by llmkit (GPTQ's saved Hessians).")
    by = {t.name: t for t in g.tensors}
    out = {}
    for name, key in json.loads(g.get("llmkit.hessian.aliases") or "{}").items():
        t = by.get(f"{key}.hessian")
        if t is None or t.type != 0 or len(t.shape) != 2 or t.shape[0] != t.shape[1]:
            raise BadFileFormat(f"'{path}': the Hessian of '{name}' is missing or not a square F32 matrix.")
        out[name] = (g.data_offset + t.offset, int(t.shape[0]))
    return out


def collect_hessians(model_path: str, text: str, out_path: str, n_ctx: int = 512, chunks: int = 0, threads=None,
                     progress=None) -> None:
    """Run the model over calibration text and save every matrix's H (see imatrix.collect)."""
    from llmkit.llama import runtime

    probe = runtime.open_model(model_path, runtime.ModelOptions(n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads),
                               logits_all=False)
    n_tok = len(probe.tokenize(text.encode("utf-8"), add_bos=False, special=False))
    del probe
    if n_tok < n_ctx:
        raise BadInput(f"the calibration text has {n_tok} tokens, fewer than one chunk of {n_ctx}; give more text "
                       "or shorter chunks.")
    sums, counts, n = collect(model_path, text, n_ctx=n_ctx, threads=threads, max_chunks=chunks, progress=progress,
                              hessian=True)
    if not sums:
        raise BadInput("no matrix inputs were seen while running the model; is it a transformer GGUF?")
    save_hessians(out_path, sums, counts, n, n_ctx, model_path)
