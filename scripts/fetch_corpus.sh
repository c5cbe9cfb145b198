#!/usr/bin/env bash
# Rebuild the text corpora used by tests/fixtures and benchmarks from Debian packages (no other download).
#   data/kernel-docs.txt   ~24 MB of English (Linux kernel Documentation/*.rst, linux-doc-6.1, GPL-2.0)
#   data/tang300.txt       Tang poems, Simplified Chinese (fortunes-zh, GPL-3.0+)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download linux-doc-6.1 fortunes-zh >/dev/null 2>&1)
for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/x"; done
mkdir -p data
doc="$work/x/usr/share/doc/linux-doc-6.1/Documentation"
find "$doc" -name '*.rst.gz' | sort | xargs zcat > data/kernel-docs.txt
sed 's/\x1b\[[0-9;]*m//g' "$work/x/usr/share/games/fortunes/tang300" > data/tang300.txt
ls -l data/
