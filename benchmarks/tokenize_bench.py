"""Tokenizer benchmark: llmkit vs HF `tokenizers` (single thread) on the same corpus, one run.

    python benchmarks/tokenize_bench.py [CORPUS] [--mb 10] [--jobs bpe8k,bpe32k,wp8k,uni8k,encode]

Each job runs in its own subprocess so peak RSS (ru_maxrss) is measured per job. Times are CPU
seconds of that process. Corpus default: data/kernel-docs.txt (scripts/fetch_corpus.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

JOBS = {
    "bpe8k": ("bpe", 8000), "bpe32k": ("bpe", 32000), "wp8k": ("wordpiece", 8000), "uni8k": ("unigram", 8000),
}


def run_job(impl: str, job: str, corpus: str, out: str) -> dict:
    t0 = time.process_time()
    w0 = time.perf_counter()
    if job == "encode":
        text = open(corpus, encoding="utf-8").read()
        if impl == "hf":
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(out)
            lines = text.splitlines(keepends=True)
            t0, w0 = time.process_time(), time.perf_counter()
            n = sum(len(e.ids) for e in tok.encode_batch(lines))
        else:
            from llmkit.tokenize import load

            tok = load(out)
            lines = text.splitlines(keepends=True)
            t0, w0 = time.process_time(), time.perf_counter()
            n = sum(len(tok.encode(x)) for x in lines)
        extra = {"tokens": n, "mb": len(text.encode()) / 1e6}
    else:
        algo, vocab = JOBS[job]
        if impl == "hf":
            from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

            if algo == "bpe":
                tok = Tokenizer(models.BPE())
                tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
                tok.decoder = decoders.ByteLevel()
                tr = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
            elif algo == "wordpiece":
                tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
                tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
                tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
                tr = trainers.WordPieceTrainer(vocab_size=vocab, show_progress=False, special_tokens=["[UNK]"])
            else:
                tok = Tokenizer(models.Unigram())
                tok.pre_tokenizer = pre_tokenizers.Metaspace()
                tr = trainers.UnigramTrainer(vocab_size=vocab, show_progress=False, special_tokens=["<unk>"], unk_token="<unk>")
            tok.train([corpus], tr)
            tok.save(out)
        else:
            from llmkit.io import iter_lines
            from llmkit.tokenize.train import train

            tok = train(iter_lines([corpus]), algo, vocab)
            tok.save(out)
        extra = {}
    return {"impl": impl, "job": job, "cpu_s": time.process_time() - t0, "wall_s": time.perf_counter() - w0,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus", nargs="?", default="data/kernel-docs.txt")
    ap.add_argument("--mb", type=float, default=10.0, help="use the first N MB of the corpus")
    ap.add_argument("--jobs", default="bpe8k,bpe32k,wp8k,uni8k,encode")
    ap.add_argument("--child", nargs=3, metavar=("IMPL", "JOB", "OUT"))
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_job(a.child[0], a.child[1], a.corpus, a.child[2])))
        return
    if not os.path.exists(a.corpus):
        sys.exit(f"corpus {a.corpus} not found: run scripts/fetch_corpus.sh first")
    import tempfile

    tmp = tempfile.mkdtemp()
    corpus = os.path.join(tmp, "corpus.txt")
    data = open(a.corpus, "rb").read(int(a.mb * 1e6))
    open(corpus, "wb").write(data[: data.rindex(b"\n") + 1])
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "RAYON_RS_NUM_CPUS": "1", "TOKENIZERS_PARALLELISM": "false"}
    results = []
    for job in a.jobs.split(","):
        row = {}
        for impl in ("hf", "llmkit"):
            out = os.path.join(tmp, f"{impl}-{'bpe8k' if job == 'encode' else job}.json")
            if job == "encode" and not os.path.exists(out):
                subprocess.run([sys.executable, __file__, corpus, "--child", impl, "bpe8k", out], env=env, check=True,
                               capture_output=True)
            p = subprocess.run([sys.executable, __file__, corpus, "--child", impl, job, out], env=env,
                               capture_output=True, text=True)
            if p.returncode:
                print(p.stderr, file=sys.stderr)
                continue
            row[impl] = json.loads(p.stdout.strip().splitlines()[-1])
        results.append((job, row))
        hf, lk = row.get("hf"), row.get("llmkit")
        if hf and lk:
            if job == "encode":
                print(f"{job:8s} HF {hf['mb'] / hf['cpu_s']:.2f} MB/CPU-s  llmkit {lk['mb'] / lk['cpu_s']:.2f} MB/CPU-s  "
                      f"speed ratio llmkit/HF {hf['cpu_s'] / lk['cpu_s']:.2f}x  tokens equal: {hf['tokens'] == lk['tokens']}")
            else:
                print(f"{job:8s} HF {hf['cpu_s']:.2f} CPU-s ({hf['peak_rss_mb']:.0f} MB)  llmkit {lk['cpu_s']:.2f} CPU-s "
                      f"({lk['peak_rss_mb']:.0f} MB)  time ratio llmkit/HF {lk['cpu_s'] / hf['cpu_s']:.2f}x  "
                      f"RSS ratio {lk['peak_rss_mb'] / hf['peak_rss_mb']:.2f}x", flush=True)
    print(json.dumps({"corpus_mb": len(data) / 1e6, "results": results}))


if __name__ == "__main__":
    main()
