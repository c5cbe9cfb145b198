#!/usr/bin/env bash
# Train three tokenizers on the same text, compare them, and round-trip a line through a pipeline.
# Usage: examples/tokenize_pipeline.sh [CORPUS...]   (default: the kernel-docs test fixture's first MB;
# LLMKIT_EXAMPLE_QUICK=1, the test suite's run: its first 200 kB)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ $# -eq 0 ]; then
  zcat tests/fixtures/kernel-docs.txt.gz > "$work/full.txt"
  head -c "$([ -n "${LLMKIT_EXAMPLE_QUICK:-}" ] && echo 200000 || echo 1000000)" "$work/full.txt" > "$work/corpus.txt"
  set -- "$work/corpus.txt"
fi
for algo in bpe wordpiece unigram; do
  llmkit tokenize train --algo "$algo" --vocab-size 2000 -o "$work/$algo.json" "$@"
done
llmkit tokenize stats -m "$work/bpe.json" -m "$work/wordpiece.json" -m "$work/unigram.json" "$@"
# text -> ids -> text, one record per line, through a pipe
printf 'The kernel schedules tasks.\n你好，世界 🙂\n' \
  | llmkit tokenize encode -m "$work/bpe.json" \
  | llmkit tokenize decode -m "$work/bpe.json"
# the first BPE merges, as the course prints them
head -c 20000 "$1" | llmkit tokenize train --algo bpe --vocab-size 262 --trace -o "$work/tiny.json" -
