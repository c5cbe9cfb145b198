#!/usr/bin/env bash
# Which file of this size is best for this model? KL divergence like llama-perplexity, per-tensor
# types chosen under a size budget, GPTQ rounding.
# Usage: examples/quant_budget_pipeline.sh [MODEL.gguf] [TEXT]
#   default model: the packaged SmolLM2-135M-Instruct (Q4_1: dequantized to F16 first, so compare at
#   or under ~4 bits per weight); default text: the tokenizer test fixture (first half calibrates,
#   second half evaluates). LLMKIT_EXAMPLE_QUICK=1: less text, fewer chunks.
set -euo pipefail
chars=300000 imatrix_chunks=8 eval_chunks=6 budget_chunks=2 gptq_chunks=4
if [ -n "${LLMKIT_EXAMPLE_QUICK:-}" ]; then  # the test suite's run (with a tiny model as argument 1)
  chars=40000 imatrix_chunks=2 eval_chunks=1 budget_chunks=1 gptq_chunks=1
fi
source "$(dirname "$0")/_defaults.sh"
cat > "$work/show.py" <<'PY'
import json, sys
for r in map(json.loads, sys.stdin):
    name = r["model"].rsplit("/", 1)[-1]
    print(f"{name:14s} KLD {r['kld']['mean']:.4f} (p99 {r['kld']['p99']:.3f})  "
          f"same top {100 * r['same_top_p']['value']:.1f} %  PPL {r['ppl']['value']:.3f}")
PY
head -c "$((chars / 2))" "$text" > "$work/calib.txt"
tail -c "$((chars / 2))" "$text" > "$work/eval.txt"
llmkit quant "$model" --type F16 --allow-requantize -o "$work/base.gguf"
llmkit quant imatrix -m "$work/base.gguf" --text "$work/calib.txt" -o "$work/imatrix.gguf" -c 256 --chunks "$imatrix_chunks"
# the base model's logits, in llama-perplexity's --kl-divergence-base format
llmkit quant ppl -m "$work/base.gguf" --save-logits "$work/base.kld" "$work/eval.txt" -c 256 --chunks "$eval_chunks"
# llama.cpp's fixed Q3_K_M mix, then the same size with types chosen per tensor, then GPTQ rounding
llmkit quant "$work/base.gguf" --type Q3_K_M --imatrix "$work/imatrix.gguf" -o "$work/q3_k_m.gguf"
size=$(stat -c %s "$work/q3_k_m.gguf")
llmkit quant "$work/base.gguf" --target-size "$size" --imatrix "$work/imatrix.gguf" --calib "$work/calib.txt" \
  -c 256 --chunks "$budget_chunks" -o "$work/budget.gguf" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print("budget file:", r["bpw"], "bits/weight")'
llmkit quant "$work/base.gguf" --type Q3_K_M --method gptq --imatrix "$work/imatrix.gguf" --calib "$work/calib.txt" \
  -c 256 --chunks "$gptq_chunks" --hessian "$work/hessians.gguf" -o "$work/gptq.gguf"
# mean KLD, its p99 and the same-top-token share, one JSON object per model, for a pipeline
llmkit quant ppl -m "$work/q3_k_m.gguf" -m "$work/budget.gguf" -m "$work/gptq.gguf" --kld "$work/base.kld" --json \
  | python3 "$work/show.py"
