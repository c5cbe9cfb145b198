#!/usr/bin/env bash
# RAG in a shell pipeline: index two collections, query them (hybrid, filters, routing, batch),
# evaluate on the Cranfield collection, answer with the packaged SmolLM2.
# Usage: examples/rag_pipeline.sh [CRANFIELD_DIR]   (default: the copy in examples/data/cranfield)
# LLMKIT_EXAMPLE_QUICK=1: Cranfield's first 200 documents and 20 queries (the test suite's run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cran=${1:-$root/examples/data/cranfield}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/notes" "$work/code"
printf '# Memory\nThe kernel tracks physical memory in pages; the buddy allocator hands out contiguous blocks.\n\n# Slab\nSmall objects come from kmalloc() and the slab caches.\n' > "$work/notes/mem.md"
printf 'The completely fair scheduler keeps runnable tasks in a red-black tree ordered by virtual runtime.\n' > "$work/notes/sched.txt"
printf '國立臺灣大學位於臺北市，是臺灣歷史最悠久的大學之一。\n' > "$work/notes/tw.txt"
printf '{"id": "c1", "text": "def parse_config(path): read the YAML configuration file into a dict", "lang": "python"}\n' > "$work/code/snippets.jsonl"

llmkit rag index "$work/idx" "$work/notes" --collection notes --size 300 --overlap 60
llmkit rag index "$work/idx" "$work/code" --collection code
llmkit rag info "$work/idx"
llmkit rag query "$work/idx" "how are runnable tasks ordered" -k 2
llmkit rag query "$work/idx" "臺灣大學在哪裡" -k 1 --mode bm25
llmkit rag query "$work/idx" "read a configuration file" --route --explain -k 1
# batch: one query per line in, one JSON hit per line out -> pick fields with python
printf 'buddy allocator\nslab caches\n' | llmkit rag query "$work/idx" - -k 1 --jsonl \
  | python3 -c 'import json,sys; [print(h["query_id"], h["doc"], round(h["score"], 4)) for h in map(json.loads, sys.stdin)]'
# incremental: change one file, re-run: only it is re-chunked and re-embedded
echo 'Deadline tasks run by earliest deadline first.' >> "$work/notes/sched.txt"
llmkit rag index "$work/idx" "$work/notes" --collection notes --size 300 --overlap 60 --json \
  | python3 -c 'import json,sys; r=json.load(sys.stdin); print("changed", r["docs_added"], "unchanged", r["docs_unchanged"], "embedded", r["embedded"])'
llmkit rag answer "$work/idx" "How does the kernel hand out memory?" -k 2 -n 48 --mode bm25
python3 "$root/scripts/cranfield.py" "$cran" -o "$work/cran"
docs=$work/cran/docs.jsonl limit=50
if [ -n "${LLMKIT_EXAMPLE_QUICK:-}" ]; then
  head -n 200 "$docs" > "$work/docs-200.jsonl" && docs=$work/docs-200.jsonl limit=20
fi
llmkit rag index "$work/cran-idx" "$docs"
llmkit rag eval "$work/cran-idx" --queries "$work/cran/queries.jsonl" --qrels "$work/cran/qrels.txt" --config bm25 --config dense --config hybrid --limit "$limit"
