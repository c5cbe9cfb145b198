"""Does GPTQ's gain carry over to text it was not calibrated on? (not a test)

    python benchmarks/gptq_transfer.py BASE-F16.gguf --imatrix IMAT --calib CALIB.txt --other OTHER.txt \
        [--layers 3,14,25] [--kinds attn_q,ffn_up,ffn_down] [--type Q2_K] [--shrink 0,3,5,10] \
        [--calib-chunks 16] [--json]

Per weight matrix W of the chosen layers: H = X^T X of its inputs on the calibration text (what GPTQ
minimises) and on the other text (what a user's prompts look like), both collected through llama.cpp
as `--method gptq` collects them (--calib-chunks chunks of 512 tokens of the calibration text, default
16; 8 of the other).
Round-to-nearest with the imatrix (llama.cpp's bytes) is the reference; for each shrinkage GPTQ
writes the matrix from the calibration H, and the table gives its output error tr(D H D^T),
D = W - Q, as a fraction of round-to-nearest's, on each text. Below 1 is better than llama.cpp.
The whole model's KLD is what counts (`llmkit quant ppl --kld`); this isolates one cause per matrix
in minutes instead of a 50-minute whole-model GPTQ run. `--json` prints one JSON object instead of
the table (what `benchmarks/run.py --area quant-gptq` reads).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
OTHER_CHUNKS = 8  # 512-token chunks of the other text for its H


def main() -> None:
    from llmkit.gguf.reader import read_gguf
    from llmkit.quant.calibration.imatrix import collect_gram, load_imatrix
    from llmkit.quant.formats import get_format, load_f32
    from llmkit.quant.rounding.gptq import output_error, quantize_matrix

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--imatrix", required=True)
    ap.add_argument("--calib", required=True)
    ap.add_argument("--other", required=True)
    ap.add_argument("--layers", default="3,14,25")
    ap.add_argument("--kinds", default="attn_q,ffn_up,ffn_down")
    ap.add_argument("--type", default="Q2_K")
    ap.add_argument("--shrink", default="0,3,5,10")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calib-chunks", type=int, default=16, help="512-token chunks of calibration text for H")
    ap.add_argument("--json", action="store_true", help="print {matrix: {shrink: [calib, other]}} and the means")
    a = ap.parse_args()
    layers = [int(x) for x in a.layers.split(",")]
    kinds = a.kinds.split(",")
    shrinks = [float(x) for x in a.shrink.split(",")]

    def wanted(name: str) -> bool:
        return any(name.startswith(f"blk.{n}.") for n in layers) and any(f".{k}." in name for k in kinds)

    def hessians(path: str, chunks: int) -> dict:
        t = time.perf_counter()
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        sums, counts, _ = collect_gram(a.model, text, n_ctx=512, threads=a.threads, max_chunks=chunks, only=wanted)
        print(f"H from {path}: {chunks} x 512 tokens, {time.perf_counter() - t:.0f} s", file=sys.stderr)
        return {k: v / float(np.asarray(counts[k]).sum()) for k, v in sums.items()}  # `only` chose them

    Hc, Ho = hessians(a.calib, a.calib_chunks), hessians(a.other, OTHER_CHUNKS)
    imx = load_imatrix(a.imatrix)
    g = read_gguf(a.model)
    by = {t.name: t for t in g.tensors}
    fmt = get_format(a.type)
    table = not a.json
    if table:
        print(f"| matrix ({a.type}) | " + " | ".join(f"shrink {s:g}: calib / other" for s in shrinks) + " |")
        print("|---|" + "---|" * len(shrinks))
    ratios = {s: [] for s in shrinks}
    result = {"type": a.type, "calib_chunks": a.calib_chunks, "other_chunks": OTHER_CHUNKS, "matrices": {}}
    with open(a.model, "rb") as f:
        for name in sorted(Hc):
            W = load_f32(f, by[name], g.data_offset)
            qw = np.asarray(imx[name], np.float32)

            def deq(q):
                return fmt.dequantize(q.reshape(-1), W.size).reshape(W.shape)

            rtn = deq(fmt.quantize(W, qw))
            rc, ro = output_error(W, rtn, Hc[name]), output_error(W, rtn, Ho[name])
            cells, row = [], {}
            for s in shrinks:
                q = deq(quantize_matrix(W, Hc[name], a.type, importance=qw, shrink=s)[0])
                c, o = output_error(W, q, Hc[name]) / rc, output_error(W, q, Ho[name]) / ro
                ratios[s].append(o)
                cells.append(f"{c:.3f} / {o:.3f}")
                row[f"{s:g}"] = [float(c), float(o)]
            result["matrices"][name] = row
            if table:
                print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    means = {f"{s:g}": float(np.exp(np.mean(np.log(ratios[s])))) for s in shrinks}
    result["geomean_other"] = means
    if table:
        print("| geometric mean, other text | " + " | ".join(f"{means[f'{s:g}']:.3f}" for s in shrinks) + " |")
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
