#!/usr/bin/env bash
# Search a source repository the way a shell user would: index llmkit's own code (Python, chunked at
# functions/classes/methods; .gitignore honoured), with int8 embeddings, then ask questions and jump
# to path:line. Queries run on ONNX Runtime: no torch is imported, so each one is a fresh process.
# Usage: examples/rag_code_pipeline.sh [REPO_DIR]   (default: this repository; LLMKIT_EXAMPLE_QUICK=1, the
# test suite's run: five of its files instead of the llmkit package)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=${1:-.}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=("$repo/llmkit")
if [ -n "${LLMKIT_EXAMPLE_QUICK:-}" ]; then
  src=("$repo"/llmkit/{io.py,rag/index/bm25.py,rag/index/manifest.py,rag/retrieve/fusion.py,quant/formats/jit.py})
fi

# index the code and docs; skipped files are reported per extension on stderr
llmkit rag index "$work/idx" "${src[@]}" "$repo/README.md" --collection code --embed-precision int8
llmkit rag info "$work/idx"

# identifiers match by their parts: parse_config, parseConfig and "parse config" all find a function
llmkit rag query "$work/idx" "split camelCase identifiers into parts" -k 3 --mode bm25
# hybrid (BM25 + dense), one fresh process per question, timed (bash's own `time`: no GNU time needed)
TIMEFORMAT='  %R s wall'
for q in "where is the writer lock taken" "how are temp files cleaned up after kill -9" \
         "reciprocal rank fusion weights"; do
  time llmkit rag query "$work/idx" "$q" -k 1
done
# path:line of the best hit, ready for an editor ($EDITOR +LINE PATH)
llmkit rag query "$work/idx" "atomic file write with fsync and rename" -k 1 --jsonl \
  | python3 -c 'import json,sys; h=json.load(sys.stdin); print(h["doc"] + ":" + str(h["line"]), h["meta"]["symbol"])'
# only functions, only Python, as JSON lines for the next program
llmkit rag query "$work/idx" "quantize a block of weights" -k 5 --jsonl --filter kind=function --filter language=python \
  | python3 -c 'import json,sys; [print(h["rank"], h["meta"]["symbol"], h["doc"] + ":" + str(h["line"])) for h in map(json.loads, sys.stdin)]'
