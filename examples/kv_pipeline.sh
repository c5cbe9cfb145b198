#!/usr/bin/env bash
# KV cache: plan memory, cache a long system prompt in a slot, reuse it across shell invocations.
# Usage: examples/kv_pipeline.sh [MODEL.gguf]   (default: the packaged SmolLM2-135M-Instruct)
set -euo pipefail
model=${1:-$(python3 -c 'from llmkit.llama.runtime import default_model_path as d; print(d())')}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
llmkit kv plan -m "$model" -c 2048 -c 8192 -c 32768 --ctk q8_0 --ctv q8_0
for i in $(seq 40); do echo "Rule $i: answer in one short sentence and cite the rule number you used."; done > "$work/system.txt"
llmkit kv save -m "$model" -c 4096 --prompt-file "$work/system.txt" -o "$work/system.slot"
llmkit kv ls "$work"
# continue after the cached prompt: only the question is evaluated
llmkit kv restore -m "$model" -c 4096 "$work/system.slot" "Question: what is 2+2?" -n 24
# a cross-request prefix cache in a directory: the second call reuses the first one's KV
for q in "What is a hash map?" "What is a binary tree?"; do
  llmkit generate -m "$model" -c 4096 --temp 0 -n 24 --prompt-cache "$work/cache" "$(cat "$work/system.txt") $q"
done
