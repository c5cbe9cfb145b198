"""Tokenizer rows for run.py (not a test): llmkit vs HF `tokenizers` (and tiktoken for encoding).

    python benchmarks/run.py --area tokenize [--quick]

- Training: `llmkit tokenize train` and an HF `tokenizers` script, whole processes on the same
  corpus file, the same settings (byte-level BPE with the full byte alphabet; WordPiece with
  BertNormalizer + BertPreTokenizer; Unigram with Metaspace), HF single-threaded. Check: BPE merges
  and vocabulary equal; WordPiece/Unigram vocabulary overlap.
- Encoding: ONE tokenizer.json (trained by HF, untimed setup) encoded by HF, by llmkit and by
  tiktoken, line by line over the same corpus; every id of every line compared. tiktoken cannot
  download its own files here, so its Encoding is built from the same BPE: mergeable ranks = the
  HF ids of each token's bytes, pattern = GPT-2's pre-tokenizer regex (what ByteLevel uses).
  Whole-process rows (ids written to a file) and an in-process row (only the encode loop timed).
- GGUF vocabulary read: `llmkit gguf inspect --json --full` vs the `gguf` package's GGUFReader on
  a 151,936-token vocabulary (Qwen2.5's size; models/qwen2.5-coder-1.5b... if present, else a tiny
  random-weight model with that many tokens built here).

Children (called by the rows): python benchmarks/tokenize_bench.py CHILD ARGS...
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Cmd, Row, cmds_of, compare, cpu, ratio, rss, speed, walls  # noqa: E402

ME = os.path.abspath(__file__)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
JOBS = {"bpe8k": ("bpe", 8000), "bpe32k": ("bpe", 32000), "wp8k": ("wordpiece", 8000), "uni8k": ("unigram", 8000)}
QWEN = os.path.join(ROOT, "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")


# -- children ---------------------------------------------------------------------------------------
def hf_train(algo: str, vocab: int, corpus: str, out: str) -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if algo == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=vocab, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
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


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable character table, reversed (character -> byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tiktoken_from_hf(path: str):
    """A tiktoken Encoding with the same vocabulary, ranks (= HF ids) and pre-tokenizer pattern."""
    import tiktoken

    vocab = json.load(open(path, encoding="utf-8"))["model"]["vocab"]
    dec = byte_decoder()
    ranks = {bytes(dec[c] for c in tok): i for tok, i in vocab.items()}
    return tiktoken.Encoding("hf-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})


def encoder(impl: str, path: str):
    """A function list[str] -> list[list[int]] for this implementation (its fastest single-thread API)."""
    if impl == "hf":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        return lambda lines: [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
    if impl == "tiktoken":
        enc = tiktoken_from_hf(path)
        return lambda lines: [enc.encode_ordinary(x) for x in lines]
    from llmkit.tokenize import load

    tok = load(path)
    return lambda lines: [tok.encode(x) for x in lines]


def read_lines(data: bytes) -> list[str]:
    """Lines as `llmkit tokenize encode` reads stdin (split on \\n, no trailing empty record)."""
    lines = data.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def child(argv: list[str]) -> None:
    what = argv[0]
    if what == "train-hf":
        hf_train(argv[1], int(argv[2]), argv[3], argv[4])
    elif what == "encode":  # whole process: stdin lines -> ids lines on stdout, like `llmkit tokenize encode`
        enc = encoder(argv[1], argv[2])
        ids = enc(read_lines(sys.stdin.buffer.read()))
        sys.stdout.write("".join(" ".join(map(str, x)) + "\n" for x in ids))
    elif what == "span":  # in-process: only the encode call over all lines is timed
        enc = encoder(argv[1], argv[2])
        data = open(argv[3], "rb").read()
        lines = read_lines(data)
        t = time.perf_counter()
        ids = enc(lines)
        dt = time.perf_counter() - t
        print(json.dumps({"s": dt, "mb_per_s": len(data) / 1e6 / dt, "tokens": sum(map(len, ids))}))
    elif what == "vocab-gguf":  # the gguf package's reader: metadata + the token strings
        from gguf import GGUFReader

        r = GGUFReader(argv[1])
        f = r.fields["tokenizer.ggml.tokens"]
        toks = [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
        print(json.dumps({"tokens": len(toks)}))
    elif what == "make-vocab":
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from ggufmake import write_tiny_llama

        n = int(argv[2])
        write_tiny_llama(argv[1], n_embd=32, n_ff=64, n_layer=1, n_head=2, n_head_kv=1,
                         extra_tokens=tuple(f"tok{i}" for i in range(n - 258)))
    else:
        raise SystemExit(f"unknown child {what}")


# -- rows -------------------------------------------------------------------------------------------
def corpus_file(cfg, mb: float) -> tuple[str, str]:
    """The first `mb` MB (whole lines) of data/kernel-docs.txt, else of the test fixture."""
    src = os.path.join(ROOT, "data/kernel-docs.txt")
    if os.path.exists(src):
        data, name = open(src, "rb").read(int(mb * 1e6)), "data/kernel-docs.txt"
    else:
        with gzip.open(os.path.join(ROOT, "tests/fixtures/kernel-docs.txt.gz")) as f:
            data, name = f.read(int(mb * 1e6)), "tests/fixtures/kernel-docs.txt.gz (data/kernel-docs.txt missing)"
    data = data[: data.rindex(b"\n") + 1].replace(b"\r", b"")
    path = os.path.join(cfg.tmp("tokenize"), "corpus.txt")
    open(path, "wb").write(data)
    return path, f"first {len(data) / 1e6:.2f} MB of {name}"


def model_json(path: str) -> dict:
    m = json.load(open(path, encoding="utf-8"))["model"]
    merges = [tuple(x.split(" ")) if isinstance(x, str) else tuple(x) for x in m.get("merges", [])]
    vocab = m["vocab"]
    toks = set(vocab) if isinstance(vocab, dict) else {v[0] for v in vocab}
    return {"merges": merges, "vocab": vocab if isinstance(vocab, dict) else None, "tokens": toks}


def train_rows(cfg, corpus: str, jobs: list[str]) -> list[Row]:
    rows = []
    d = cfg.tmp("tokenize")
    for job in jobs:
        algo, vocab = JOBS[job]
        hf_out, lk_out = os.path.join(d, f"hf-{job}.json"), os.path.join(d, f"llmkit-{job}.json")
        hf = Cmd("HF tokenizers", [PY, ME, "train-hf", algo, vocab, corpus, hf_out])
        lk = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "tokenize", "train", "--algo", algo, "--vocab-size", vocab, "-o",
                            lk_out, corpus])
        runs = compare([hf, lk], cfg, warmup=False)
        a, b = model_json(hf_out), model_json(lk_out)
        if algo == "bpe":
            check = "merges and vocabulary identical" if (a["merges"], a["vocab"]) == (b["merges"], b["vocab"]) else \
                f"DIFFERENT: {sum(x != y for x, y in zip(a['merges'], b['merges']))} merges differ"
        else:
            check = f"vocabulary overlap {len(a['tokens'] & b['tokens']) / max(len(a['tokens']), 1):.1%}"
        wa, wb = walls(runs[hf.label]), walls(runs[lk.label])
        ca, cb = cpu(runs[hf.label]), cpu(runs[lk.label])
        rows.append(Row(f"tok-train-{job}", f"{algo} train {vocab // 1000}k, whole process: wall time; CPU seconds; "
                        "peak RSS", f"{wa.fmt()}; {ca.fmt('CPU-s')}; {rss(runs[hf.label]):.0f} MB",
                        f"{wb.fmt()}; {cb.fmt('CPU-s')}; {rss(runs[lk.label]):.0f} MB",
                        f"time {ratio(wb.median, wa.median)}, CPU {ratio(cb.median, ca.median)}, "
                        f"RSS {ratio(rss(runs[lk.label]), rss(runs[hf.label]))}", check, cmds_of(hf, lk)))
    return rows


def encode_rows(cfg, corpus: str) -> list[Row]:
    d = cfg.tmp("tokenize")
    tok = os.path.join(d, "encode-bpe8k.json")
    from harness import run_once

    # the one tokenizer every side encodes with: trained once by HF, not timed
    setup = Cmd("setup: HF-trained BPE 8k", [PY, ME, "train-hf", "bpe", 8000, corpus, tok])
    run_once(setup)
    outs = {k: os.path.join(d, f"ids-{k}.txt") for k in ("hf", "tiktoken", "llmkit")}
    cmds = [Cmd("HF tokenizers", [PY, ME, "encode", "hf", tok], stdin=corpus, stdout=outs["hf"]),
            Cmd("tiktoken", [PY, ME, "encode", "tiktoken", tok], stdin=corpus, stdout=outs["tiktoken"]),
            Cmd("llmkit", [PY, "-m", "llmkit", "-q", "tokenize", "encode", "-m", tok], stdin=corpus, stdout=outs["llmkit"])]
    runs = compare(cmds, cfg)
    ref = open(outs["hf"]).read().split("\n")
    checks = {}
    for k in ("tiktoken", "llmkit"):
        got = open(outs[k]).read().split("\n")
        bad = sum(x != y for x, y in zip(ref, got)) + abs(len(ref) - len(got))
        checks[k] = f"{k}: every id equal to HF's on all {len(ref) - 1} lines" if not bad else f"{k}: {bad} lines differ from HF"
    n_ids = sum(len(x.split()) for x in ref)
    w = {c.label: walls(runs[c.label]) for c in cmds}
    mb = os.path.getsize(corpus) / 1e6
    rows = [Row("tok-encode-bpe8k-process", f"BPE 8k encode {mb:.1f} MB ({n_ids} ids), whole process",
                f"HF {w['HF tokenizers'].fmt()}; tiktoken {w['tiktoken'].fmt()}", w["llmkit"].fmt(),
                f"{speed(w['HF tokenizers'].median, w['llmkit'].median, 'HF')}, "
                f"{speed(w['tiktoken'].median, w['llmkit'].median, 'tiktoken')}", "; ".join(checks.values()),
                cmds_of(setup, *cmds))]
    spans = [Cmd(lbl, [PY, ME, "span", impl, tok, corpus]) for lbl, impl in
             (("HF tokenizers", "hf"), ("tiktoken", "tiktoken"), ("llmkit", "llmkit"))]
    runs = compare(spans, cfg)
    from harness import field_stat

    s = {c.label: field_stat(runs[c.label], "mb_per_s") for c in spans}
    toks = {c.label: runs[c.label][0].report["tokens"] for c in spans}
    rows.append(Row("tok-encode-bpe8k-span", "BPE 8k encode, in-process: only the encode call over all lines (MB/s)",
                    f"HF {s['HF tokenizers'].fmt('MB/s')}; tiktoken {s['tiktoken'].fmt('MB/s')}", s["llmkit"].fmt("MB/s"),
                    f"speed {ratio(s['llmkit'].median, s['HF tokenizers'].median)} HF, "
                    f"{ratio(s['llmkit'].median, s['tiktoken'].median)} tiktoken",
                    "token totals " + ("equal" if len(set(toks.values())) == 1 else f"differ {toks}") +
                    " (ids compared in the row above)", cmds_of(*spans)))
    return rows


def vocab_row(cfg) -> Row:
    from harness import run_once

    path, cmds = QWEN, []
    if not os.path.exists(path):
        path = os.path.join(cfg.tmp("tokenize"), "vocab-151936.gguf")
        mk = Cmd("setup: tiny model with 151,936 tokens", [PY, ME, "make-vocab", path, 151936])
        run_once(mk)
        cmds.append(mk)
    gg = Cmd("gguf GGUFReader", [PY, ME, "vocab-gguf", path])
    lk = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "gguf", "inspect", path, "--json", "--full"], stdout=os.devnull)
    runs = compare([gg, lk], cfg)
    a, b = walls(runs[gg.label]), walls(runs[lk.label])
    return Row("gguf-vocab-152k", f"read a 151,936-token GGUF vocabulary ({os.path.basename(path)}), whole process",
               a.fmt(), b.fmt(), speed(a.median, b.median, "gguf"),
               f"llmkit under a second: {'yes' if b.hi < 1 else 'no'} (max {b.hi:.2f} s)", cmds_of(*cmds, gg, lk))


def rows(cfg):
    corpus, desc = corpus_file(cfg, cfg.pick(10, 2, 0.1))
    jobs = cfg.pick(list(JOBS), list(JOBS), ["bpe8k", "wp8k", "uni8k"])
    out = train_rows(cfg, corpus, jobs) + encode_rows(cfg, corpus) + [vocab_row(cfg)]
    setup = [f"corpus: {desc}", "HF tokenizers single-threaded (RAYON_NUM_THREADS=1); tiktoken's Encoding built from "
             "the HF BPE's vocabulary (ranks = HF ids) and GPT-2's pattern, since tiktoken cannot download its files here",
             "training rows: one run per side per round, no warm-up round (the runs are long)"]
    return "llmkit vs HF tokenizers / tiktoken / gguf", setup, out


if __name__ == "__main__":
    child(sys.argv[1:])
