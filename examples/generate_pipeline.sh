#!/usr/bin/env bash
# Generation in pipelines with the packaged default model (SmolLM2-135M-Instruct).
# Usage: examples/generate_pipeline.sh [MODEL.gguf]
set -euo pipefail
model=${1:-}
m=()
[ -n "$model" ] && m=(-m "$model")
# 1. stream a chat answer (statistics go to stderr)
llmkit generate "${m[@]}" --chat --temp 0 -n 48 "Name three uses of a hash map."
# 2. prompt-lookup drafting pays off when the answer copies the prompt (e.g. editing text)
printf 'Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog.\n' \
  | llmkit generate "${m[@]}" --chat --temp 0 -n 40 --lookup 3 -
# 3. constrained output feeding another program
llmkit constrain "${m[@]}" -n 6 --seed 1 --grammar 'root ::= [1-9] [0-9]*' --json "A random number:" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); print("number:", int(d["text"]), "tok/s:", round(d["stats"]["tokens_per_s"]))'
