#!/usr/bin/env bash
# The README's install command (scripts/install.sh) timed on a fresh clone with empty caches (not a test).
#
#   bash benchmarks/install_time.sh            # clones this checkout's HEAD into a temp directory
#   bash benchmarks/install_time.sh DIR        # ... into DIR, kept afterwards (run.py's area setup tests it)
#
# pip gets an empty cache (PIP_CACHE_DIR), so llama-cpp-python and its four tools are compiled from
# source, and llmkit an empty cache (LLMKIT_CACHE). Packages still come from the configured index.
# Prints one line: seconds, exit status, and whether the tools came with the binding's build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
clone=${1:-$work/clone}
git clone -q "$root" "$clone"
cd "$clone"
start=$(date +%s.%N)
set +e
PIP_CACHE_DIR="$work/pip-cache" LLMKIT_CACHE="$work/llmkit-cache" bash scripts/install.sh >"$work/install.log" 2>&1
rc=$?
set -e
end=$(date +%s.%N)
bundled=$(ls .venv/lib/python*/site-packages/llama_cpp/bin 2>/dev/null | grep -c '^llama-' || true)
secs=$(python3 -c "print(f'{$end - $start:.0f}')")
echo "install: ${secs} s, exit ${rc}; llama.cpp tools built with the binding: ${bundled} of 4"
[ "$rc" = 0 ] || { tail -20 "$work/install.log" >&2; exit 1; }
