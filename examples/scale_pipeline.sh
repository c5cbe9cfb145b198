#!/usr/bin/env bash
# Past one machine, run on this one: vectors in the embedded Milvus engine, embeddings on a local Ray
# runtime, and a JSONL batch of prompts across two llama-servers (started here with the packaged
# SmolLM2-135M; point --server at your own servers instead).
# Usage: examples/scale_pipeline.sh   (LLMKIT_EXAMPLE_QUICK=1, the test suite's run: a quarter of the text)
set -euo pipefail
export HF_HUB_OFFLINE=1
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
chars=$([ -n "${LLMKIT_EXAMPLE_QUICK:-}" ] && echo 30000 || echo 120000)
python3 -c 'import gzip; t=gzip.open("'"$root"'/tests/fixtures/kernel-docs.txt.gz","rt").read()[:'"$chars"']
import json
for i, p in enumerate(x for x in t.split("\n\n") if len(x) > 200):
    print(json.dumps({"id": i, "text": p, "part": "a" if i % 2 else "b"}))' > "$work/docs.jsonl"

# 1. Milvus (embedded engine) instead of faiss; queries and filters unchanged
llmkit rag index "$work/idx" "$work/docs.jsonl" --store milvus+local:vectors.db
llmkit rag query "$work/idx" "how does the scheduler pick the next task" --filter part=a -k 3 --jsonl \
  | python3 -c 'import json,sys; [print(h["score"], h["text"][:70].replace("\n"," ")) for h in map(json.loads, sys.stdin)]'

# 2. the same documents embedded on a (local) Ray cluster: the same vectors as a local run
llmkit rag index "$work/idx-ray" "$work/docs.jsonl" --ray local,workers=2

# 3. a batch across two llama-servers, resumable
server=$(PYTHON=python3 bash "$root/scripts/build_llama_server.sh" | tail -1)
model=$(python3 -c 'from llmkit.llama.runtime import default_model_path as d; print(d())')
urls=()
# two ports nothing listens on now (the OS picks them)
ports=$(python3 -c 'import socket; s=[socket.socket() for _ in range(2)]; [x.bind(("127.0.0.1", 0)) for x in s]; print(*[x.getsockname()[1] for x in s])')
for port in $ports; do
  "$server" -m "$model" --port "$port" -np 2 -c 1024 -t 1 >/dev/null 2>&1 &
  pids+=($!)
  urls+=("http://127.0.0.1:$port")
done
for u in "${urls[@]}"; do
  for _ in $(seq 120); do curl -sf "$u/health" >/dev/null 2>&1 && break; sleep 0.5; done
done
for i in $(seq 1 8); do echo "{\"id\": $i, \"prompt\": \"Question $i: what is a kernel module? Answer:\"}"; done > "$work/prompts.jsonl"
echo '{"id": "chat", "messages": [{"role": "user", "content": "Name a Linux filesystem."}], "n_predict": 12}' >> "$work/prompts.jsonl"
llmkit server batch --server "$(IFS=,; echo "${urls[*]}")" "$work/prompts.jsonl" -n 24 --temp 0 -o "$work/out.jsonl"
llmkit server batch --server "$(IFS=,; echo "${urls[*]}")" "$work/prompts.jsonl" -n 24 --temp 0 -o "$work/out.jsonl"  # resumes: nothing left
python3 -c 'import json,sys; [print(r["id"], r["server"], repr(r["text"][:50])) for r in map(json.loads, open(sys.argv[1]))]' "$work/out.jsonl"
