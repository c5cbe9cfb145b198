#!/usr/bin/env bash
# Let the data choose: index a judged collection with an entity graph, tune the fusion without labels,
# compare before/after with the judged queries, follow entities through the graph, ask a question about
# the whole corpus, and try adapting the embedding model to the corpus.
# Usage: examples/rag_tune_pipeline.sh [CRANFIELD_DIR]   (default: the copy in examples/data/cranfield;
# ~15 min). LLMKIT_EXAMPLE_QUICK=1: the first 60 documents and small budgets (the test suite's run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cran=${1:-$root/examples/data/cranfield}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 "$root/scripts/cranfield.py" "$cran" -o "$work/cran"
docs=$work/cran/docs.jsonl
tune=(); limit=(); ask=(-n 120); adapt=(--minutes 3)
if [ -n "${LLMKIT_EXAMPLE_QUICK:-}" ]; then
  head -n 60 "$docs" > "$work/docs-60.jsonl" && docs=$work/docs-60.jsonl
  tune=(--pseudo-queries 40); limit=(--limit 20); ask=(-k 1 -n 24); adapt=(--steps 2 --pairs 50 --batch-size 8)
fi
judged=(--queries "$work/cran/queries.jsonl" --qrels "$work/cran/qrels.txt" "${limit[@]}")
llmkit rag index "$work/idx" "$docs" --graph
# before: the built-in fusion (RRF 1:1, k 60)
llmkit rag eval "$work/idx" "${judged[@]}" --config bm25 --config dense --config hybrid
# tune on pseudo-queries made from the corpus (no labels); the choice is stored in the index
llmkit rag tune "$work/idx" "${tune[@]}"
llmkit rag info "$work/idx" | grep fusion
# after: `tuned` is what `rag query` now uses by default
llmkit rag eval "$work/idx" "${judged[@]}" --config tuned --config hybrid+graph
llmkit rag query "$work/idx" "what similarity laws must be obeyed when constructing aeroelastic models" -k 3 --explain
# the graph list on its own terms: which hits came through entities
llmkit rag query "$work/idx" "shock wave boundary layer interaction" --graph -k 5 --jsonl \
  | python3 -c 'import json,sys; [print(h["rank"], h["doc"], h["ranks"]) for h in map(json.loads, sys.stdin)]'
# a question about the whole collection (community summaries by the packaged SmolLM2, cached in the index)
llmkit rag ask-global "$work/idx" "What are the main research topics of this collection?" "${ask[@]}"
# adapt the embedding model to the corpus (short budget here; promoted only if it wins on held-out queries)
llmkit rag adapt "$work/idx" -o "$work/model" "${adapt[@]}" --no-promote
