#!/usr/bin/env bash
# The README's install command timed on a fresh clone with empty caches (not a test; ~6 min here).
#
#   bash benchmarks/install_time.sh            # clones this checkout's HEAD into a temp directory
#
# pip gets an empty cache (PIP_CACHE_DIR) so llama-cpp-python is compiled from source, and llmkit an
# empty cache (LLMKIT_CACHE) so scripts/build_llama_server.sh has to find or build llama.cpp's tools.
# Packages still come from the configured index (here a local mirror of PyPI). The command is read from
# the README itself (the line under "## Install" that starts with `python3 -m venv`), so the figure is
# for exactly what a newcomer copies. Prints one line: seconds, exit status, and whether the tools
# were linked from the binding's build (llama.cpp compiled once) or built a second time.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$root" "$work/clone"
cd "$work/clone"
line=$(sed -n '/^## Install/,/^```$/p' README.md | grep '^python3 -m venv')
start=$(date +%s.%N)
set +e
PIP_CACHE_DIR="$work/pip-cache" LLMKIT_CACHE="$work/llmkit-cache" bash -c "$line" >"$work/install.log" 2>&1
rc=$?
set -e
end=$(date +%s.%N)
tools=$(ls -l "$work"/llmkit-cache/llama-server-*/ 2>/dev/null | grep -c -- '->' || true)
secs=$(python3 -c "print(f'{$end - $start:.0f}')")
echo "install: ${secs} s, exit ${rc}; llama.cpp tools linked from the binding's build: ${tools} of 4"
[ "$rc" = 0 ] || { tail -20 "$work/install.log" >&2; exit 1; }
