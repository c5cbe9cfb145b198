#!/usr/bin/env bash
# Quantization in a shell pipeline: importance matrix, quantize (byte-identical to llama.cpp),
# per-tensor report, compare, perplexity side by side.
# Usage: examples/quant_pipeline.sh [MODEL.gguf] [TEXT]
#   default model: the packaged SmolLM2-135M-Instruct (already Q4_1, so it is re-quantized here;
#   start from an F16/BF16/F32 GGUF for real use); default text: the tokenizer test fixture.
#   LLMKIT_EXAMPLE_QUICK=1: less text, fewer chunks.
set -euo pipefail
chars=200000 imatrix_chunks=16 ppl_chunks=8
if [ -n "${LLMKIT_EXAMPLE_QUICK:-}" ]; then  # the test suite's run (with a tiny model as argument 1)
  chars=40000 imatrix_chunks=2 ppl_chunks=1
fi
source "$(dirname "$0")/_defaults.sh"
requant=()
case "$(llmkit gguf inspect "$model" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["metadata"].get("general.file_type", 0))')" in
  0|1|32) ;;                 # F32 / F16 / BF16: quantize directly
  *) requant=(--allow-requantize) ;;
esac
llmkit quant imatrix -m "$model" --text "$text" -o "$work/imatrix.gguf" -c 256 --chunks "$imatrix_chunks"
llmkit quant "$model" --type Q8_0 -o "$work/q8_0.gguf" "${requant[@]}"
llmkit quant "$model" --type Q4_K_M -o "$work/q4_k_m.gguf" "${requant[@]}" --json \
  | python3 -c 'import json,sys; r=json.load(sys.stdin); print("Q4_K_M:", r["bpw"], "bits/weight, ratio", r["ratio"]); [print(" ", t["name"], t["type_out"], round(t["cosine"], 5)) for t in r["tensors"][:6]]'
llmkit quant "$model" --type Q4_K_M --imatrix "$work/imatrix.gguf" -o "$work/q4_k_m-imatrix.gguf" "${requant[@]}"
llmkit quant compare "$model" "$work/q4_k_m.gguf" --json \
  | python3 -c 'import json,sys; ts=json.load(sys.stdin)["tensors"]; w=max(ts, key=lambda t: t["rmse"]); print("largest RMSE:", w["name"], w["rmse"])'
llmkit quant ppl -m "$model" -m "$work/q8_0.gguf" -m "$work/q4_k_m.gguf" -m "$work/q4_k_m-imatrix.gguf" "$text" -c 256 --chunks "$ppl_chunks"
