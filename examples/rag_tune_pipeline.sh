#!/usr/bin/env bash
# Let the data choose: index a judged collection with an entity graph, tune the fusion without labels,
# compare before/after with the judged queries, follow entities through the graph, ask a question about
# the whole corpus, and try adapting the embedding model to the corpus.
# Usage: examples/rag_tune_pipeline.sh [CRANFIELD_DIR]   (default: ../shared/data/cranfield beside the
# repository; ~15 min). Cranfield: docs/guides/rag.md says where to get it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cran=${1:-$root/../shared/data/cranfield}
[ -d "$cran" ] || { echo "no Cranfield collection at $cran; pass its directory (docs/guides/rag.md)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 "$root/scripts/cranfield.py" "$cran" -o "$work/cran"
llmkit rag index "$work/idx" "$work/cran/docs.jsonl" --graph
# before: the built-in fusion (RRF 1:1, k 60)
llmkit rag eval "$work/idx" --queries "$work/cran/queries.jsonl" --qrels "$work/cran/qrels.txt" --config bm25 --config dense --config hybrid
# tune on pseudo-queries made from the corpus (no labels); the choice is stored in the index
llmkit rag tune "$work/idx"
llmkit rag info "$work/idx" | grep fusion
# after: `tuned` is what `rag query` now uses by default
llmkit rag eval "$work/idx" --queries "$work/cran/queries.jsonl" --qrels "$work/cran/qrels.txt" --config tuned --config hybrid+graph
llmkit rag query "$work/idx" "what similarity laws must be obeyed when constructing aeroelastic models" -k 3 --explain
# the graph list on its own terms: which hits came through entities
llmkit rag query "$work/idx" "shock wave boundary layer interaction" --graph -k 5 --jsonl \
  | python3 -c 'import json,sys; [print(h["rank"], h["doc"], h["ranks"]) for h in map(json.loads, sys.stdin)]'
# a question about the whole collection (community summaries by the packaged SmolLM2, cached in the index)
llmkit rag ask-global "$work/idx" "What are the main research topics of this collection?" -n 120
# adapt the embedding model to the corpus (short budget here; promoted only if it wins on held-out queries)
llmkit rag adapt "$work/idx" -o "$work/model" --minutes 3 --no-promote
