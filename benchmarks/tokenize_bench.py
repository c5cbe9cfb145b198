"""Tokenizer rows for run.py (not a test): llmkit vs HF `tokenizers` (and tiktoken for encoding).

    python benchmarks/run.py --area tokenize [--quick] [--part train|encode|count|scale]

- Training: `llmkit tokenize train` and an HF `tokenizers` script, whole processes on the same
  corpus file, the same settings (byte-level BPE with the full byte alphabet; WordPiece with
  BertNormalizer + BertPreTokenizer; Unigram with Metaspace), HF single-threaded. Check: BPE merges
  and vocabulary equal; WordPiece/Unigram vocabulary overlap.
- Encoding: ONE tokenizer.json (trained by HF, untimed setup) encoded by HF, by llmkit and by
  tiktoken, line by line over the same corpus; every id of every line compared. tiktoken cannot
  download its own files here, so its Encoding is built from the same BPE: mergeable ranks = the
  HF ids of each token's bytes, pattern = GPT-2's pre-tokenizer regex (what ByteLevel uses).
  Whole-process rows (ids written to a file) and an in-process row (only the encode loop timed).
- Counting a source tree: `llmkit tokenize count` over a tree (data/source-tree if present, e.g. a
  Linux checkout, else this Python's standard library) against `llmkit tokenize encode` on the same
  bytes (the counted files concatenated), both whole processes, -t 1 and -t 2. Check: every file's
  count equals the ids HF `tokenizers` gives for its whole text (add_special_tokens=False).
- Training at scale (`tok-train-*-prose-*`, `-code-*`): 10 MB, 300 MB and 1 GB of prose (the Debian
  text) and of code (this Python's site-packages .py files), shorter sources continued with varied
  repetitions (a quarter of the words rotated, so rare words keep appearing); time and peak RSS
  against HF, BPE merges compared. WordPiece trains with limit_alphabet=1000 on both sides (BERT's
  setting; `--limit-alphabet 1000`): code has more distinct characters than 8k tokens leave room for,
  where llmkit refuses and HF's default returns every character and its ## form with one merge.
- GGUF vocabulary read: `llmkit gguf inspect --json --full` vs the `gguf` package's GGUFReader on
  a 151,936-token vocabulary (Qwen2.5's size; models/qwen2.5-coder-1.5b... if present, else a tiny
  random-weight model with that many tokens built here).

Children (called by the rows): python benchmarks/tokenize_bench.py CHILD ARGS...
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Cmd, Row, cmds_of, compare, cpu, ratio, rss, speed, walls  # noqa: E402

ME = os.path.abspath(__file__)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
JOBS = {"bpe8k": ("bpe", 8000), "bpe32k": ("bpe", 32000), "wp8k": ("wordpiece", 8000), "wp32k": ("wordpiece", 32000),
        "uni8k": ("unigram", 8000)}
QWEN = os.path.join(ROOT, "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")


# -- children ---------------------------------------------------------------------------------------
def hf_train(algo: str, vocab: int, corpus: str, out: str, limit_alphabet: int | None = None) -> None:
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
        tr = trainers.WordPieceTrainer(vocab_size=vocab, show_progress=False, special_tokens=["[UNK]"],
                                       limit_alphabet=limit_alphabet)
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
    """A function list[str] -> list[list[int]] for this implementation (its fastest API; a trailing
    2 in `impl` means two threads: HF's Rayon pool, tiktoken's batch threads, llmkit's block threads)."""
    threads = 2 if impl.endswith("2") else 1
    impl = impl.rstrip("2")
    if impl == "hf":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        return lambda lines: [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
    if impl == "tiktoken":
        enc = tiktoken_from_hf(path)
        if threads > 1:
            return lambda lines: enc.encode_ordinary_batch(lines, num_threads=threads)
        return lambda lines: [enc.encode_ordinary(x) for x in lines]
    from llmkit.tokenize import load

    tok = load(path)
    tok.encode_batch(["loading: the compiled tables are built on first use"])
    if threads == 1:
        return tok.encode_batch
    from llmkit.tokenize.corpus.stream import in_order

    def run(lines):
        blocks = [lines[i:i + 20000] for i in range(0, len(lines), 20000)]
        out = []
        for ids in in_order([(lambda b=b: tok.encode_batch(b)) for b in blocks], threads):
            out.extend(ids)
        return out

    return run


def read_lines(data: bytes) -> list[str]:
    """Lines as `llmkit tokenize encode` reads stdin (split on \\n, no trailing empty record)."""
    lines = data.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def child(argv: list[str]) -> None:
    what = argv[0]
    if what == "train-hf":
        hf_train(argv[1], int(argv[2]), argv[3], argv[4], int(argv[5]) if len(argv) > 5 else None)
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
    elif what == "span-adversarial":  # in-process: 1 MB of prose, a 1 MB run of one character, 1 MB without spaces
        enc = encoder(argv[1], argv[2])
        prose = open(argv[3], "rb").read()[:1_000_000].decode("utf-8", "ignore").replace("\n", " ")
        report = {}
        for name, text in (("prose", prose), ("run", "a" * len(prose)), ("nospace", "".join(prose.split()))):
            enc(["warm up"])
            t = time.perf_counter()
            enc([text])
            report[f"{name}_s"] = time.perf_counter() - t
        print(json.dumps(report))
    elif what == "count-hf":  # HF's ids per file (whole text, no special tokens) against a count --json report
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(argv[1])
        rep = json.load(open(argv[2], encoding="utf-8"))
        name = rep["tokenizers"][0]
        texts = [open(f["path"], "rb").read().decode("utf-8") for f in rep["files"]]
        ours = [f["tokens"][name] for f in rep["files"]]
        theirs = [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]
        print(json.dumps({"files": len(ours), "differ": sum(a != b for a, b in zip(ours, theirs)),
                          "total_equal": rep["total"]["tokens"][name] == sum(theirs)}))
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


def debian_text(cfg) -> tuple[bytes, str]:
    """Distinct English text from Debian packages: the kernel's Documentation/*.rst (linux-doc-6.1, as
    scripts/fetch_corpus.sh builds data/kernel-docs.txt) and GCIDE, the 1913 Webster (dict-gcide)."""
    import subprocess

    d = cfg.tmp("tokenize-debian")
    parts, names = [], []
    src = os.path.join(ROOT, "data/kernel-docs.txt")
    pkgs = ["dict-gcide"] + ([] if os.path.exists(src) else ["linux-doc-6.1"])
    try:
        subprocess.run(["apt-get", "download", *pkgs], cwd=d, check=True, capture_output=True, timeout=600)
        for f in sorted(os.listdir(d)):
            if f.endswith(".deb"):
                subprocess.run(["dpkg", "-x", os.path.join(d, f), os.path.join(d, "x")], check=True)
    except (OSError, subprocess.SubprocessError):
        return b"", "Debian packages unavailable"
    if os.path.exists(src):
        parts.append(open(src, "rb").read())
        names.append("data/kernel-docs.txt")
    else:
        doc = os.path.join(d, "x/usr/share/doc/linux-doc-6.1/Documentation")
        for root, _, files in sorted(os.walk(doc)):
            for f in sorted(files):
                if f.endswith(".rst.gz"):
                    parts.append(gzip.open(os.path.join(root, f)).read())
        names.append("linux-doc-6.1 Documentation/*.rst")
    gcide = os.path.join(d, "x/usr/share/dictd/gcide.dict.dz")
    if os.path.exists(gcide):
        parts.append(gzip.open(gcide).read())
        names.append("dict-gcide gcide.dict")
    text = b"".join(parts).decode("utf-8", "replace").encode("utf-8").replace(b"\r", b"")
    return text, " + ".join(names)


def big_corpus(cfg, mb: float) -> tuple[str, str]:
    """~`mb` MB of real text for the large rows: the Debian text, repeated when shorter (else the
    test fixture, repeated)."""
    text, name = debian_text(cfg) if mb > 2 else (b"", "")
    if not text:
        with gzip.open(os.path.join(ROOT, "tests/fixtures/kernel-docs.txt.gz")) as f:
            text, name = f.read(), "tests/fixtures/kernel-docs.txt.gz"
    distinct = len(text)
    want = int(mb * 1e6)
    data = (text * (want // max(distinct, 1) + 1))[:want]
    data = data[: data.rindex(b"\n") + 1]
    path = os.path.join(cfg.tmp("tokenize"), "big.txt")
    open(path, "wb").write(data)
    rep = f", the {distinct / 1e6:.1f} MB repeated" if distinct < len(data) else ""
    return path, f"{len(data) / 1e6:.1f} MB of {name}{rep}"


def head_of(path: str, mb: float, d: str) -> str:
    """The first `mb` MB of a text file, cut at a line end."""
    data = open(path, "rb").read(int(mb * 1e6))
    data = data[: data.rindex(b"\n") + 1]
    out = os.path.join(d, f"head-{mb:g}mb.txt")
    open(out, "wb").write(data)
    return out


def model_json(path: str) -> dict:
    m = json.load(open(path, encoding="utf-8"))["model"]
    merges = [tuple(x.split(" ")) if isinstance(x, str) else tuple(x) for x in m.get("merges", [])]
    vocab = m["vocab"]
    toks = set(vocab) if isinstance(vocab, dict) else {v[0] for v in vocab}
    return {"merges": merges, "vocab": vocab if isinstance(vocab, dict) else None, "tokens": toks}


def train_rows(cfg, corpus: str, jobs: list[str], tag: str = "", limit_alphabet: int | None = None,
               rounds: int = 3) -> list[Row]:
    """Training rows for `jobs` on `corpus`; `limit_alphabet` goes to both sides' WordPiece."""
    rows = []
    d = cfg.tmp("tokenize")
    for job in jobs:
        algo, vocab = JOBS[job]
        hf_out, lk_out = os.path.join(d, f"hf-{job}{tag}.json"), os.path.join(d, f"llmkit-{job}{tag}.json")
        limit = limit_alphabet if algo == "wordpiece" else None
        hf = Cmd("HF tokenizers", [PY, ME, "train-hf", algo, vocab, corpus, hf_out] + ([limit] if limit else []))
        lk = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "tokenize", "train", "--algo", algo, "--vocab-size", vocab,
                            *(["--limit-alphabet", limit] if limit else []), "-o", lk_out, corpus])
        runs = compare([hf, lk], cfg, warmup=False, min_runs=rounds)
        a, b = model_json(hf_out), model_json(lk_out)
        if algo == "bpe":
            check = "merges and vocabulary identical" if (a["merges"], a["vocab"]) == (b["merges"], b["vocab"]) else \
                f"DIFFERENT: {sum(x != y for x, y in zip(a['merges'], b['merges']))} merges differ"
        else:
            check = f"vocabulary overlap {len(a['tokens'] & b['tokens']) / max(len(a['tokens']), 1):.1%}"
        wa, wb = walls(runs[hf.label]), walls(runs[lk.label])
        ca, cb = cpu(runs[hf.label]), cpu(runs[lk.label])
        mb = os.path.getsize(corpus) / 1e6
        setting = f" (limit_alphabet {limit})" if limit else ""
        rows.append(Row(f"tok-train-{job}{tag}", f"{algo} train {vocab // 1000}k{setting} on {mb:.1f} MB, whole "
                        "process: wall time; CPU seconds; peak RSS",
                        f"{wa.fmt()}; {ca.fmt('CPU-s')}; {rss(runs[hf.label]):.0f} MB",
                        f"{wb.fmt()}; {cb.fmt('CPU-s')}; {rss(runs[lk.label]):.0f} MB",
                        f"time {ratio(wb.median, wa.median)}, CPU {ratio(cb.median, ca.median)}, "
                        f"RSS {ratio(rss(runs[lk.label]), rss(runs[hf.label]))}", check, cmds_of(hf, lk)))
    return rows


def same_lines(ref: str, got: str) -> tuple[int, int, int]:
    """(lines, lines that differ, ids) of two id files, read line by line."""
    n = bad = ids = 0
    with open(ref) as a, open(got) as b:
        for x, y in itertools.zip_longest(a, b):
            n += 1
            bad += x != y
            ids += len(x.split()) if x else 0
    return n, bad, ids


def encode_tokenizer(cfg, corpus: str) -> tuple[str, Cmd]:
    """The one tokenizer every side encodes with: trained once by HF on `corpus`, not timed."""
    from harness import run_once

    tok = os.path.join(cfg.tmp("tokenize"), "encode-bpe8k.json")
    setup = Cmd("setup: HF-trained BPE 8k", [PY, ME, "train-hf", "bpe", 8000, corpus, tok])
    if not os.path.exists(tok):
        run_once(setup)
        # llmkit compiles its kernels on the first input large enough to repay it; compile them here,
        # untimed, so that every row measures the installed state
        run_once(Cmd("setup: compile llmkit's kernels", [PY, "-m", "llmkit", "-q", "tokenize", "encode", "-m", tok],
                     env={"LLMKIT_JIT": "1"}, stdin=corpus, stdout=os.devnull))
    return tok, setup


def encode_rows(cfg, corpus: str, tok: str, setup: Cmd, tag: str = "", threads: bool = False) -> list[Row]:
    """Whole-process and in-process encode rows on `corpus` (ids compared line by line with HF's);
    with `threads` also llmkit -t 2 and the anchors' own two-thread modes."""
    d = cfg.tmp("tokenize")
    sides = [("HF tokenizers", "hf"), ("tiktoken", "tiktoken"), ("llmkit", "llmkit")]
    cmds = [Cmd(lbl, [PY, ME, "encode", impl, tok], stdin=corpus, stdout=os.path.join(d, f"ids{tag}-{impl}.txt"))
            for lbl, impl in sides[:2]]
    cmds.append(Cmd("llmkit", [PY, "-m", "llmkit", "-q", "tokenize", "encode", "-m", tok, "-t", "1"], stdin=corpus,
                    stdout=os.path.join(d, f"ids{tag}-llmkit.txt")))
    if threads:
        cmds.append(Cmd("llmkit -t 2", [PY, "-m", "llmkit", "-q", "tokenize", "encode", "-m", tok, "-t", "2"],
                        stdin=corpus, stdout=os.path.join(d, f"ids{tag}-llmkit2.txt")))
    runs = compare(cmds, cfg)
    checks = []
    for c in cmds[1:]:
        n, bad, n_ids = same_lines(cmds[0].stdout, c.stdout)
        checks.append(f"{c.label}: every id equal to HF's on all {n} lines" if not bad else f"{c.label}: {bad} lines differ")
    w = {c.label: walls(runs[c.label]) for c in cmds}
    mb = os.path.getsize(corpus) / 1e6
    ours = w["llmkit"].fmt() + (f"; -t 2 {w['llmkit -t 2'].fmt()}" if threads else "")
    vs = (f"{speed(w['HF tokenizers'].median, w['llmkit'].median, 'HF')}, "
          f"{speed(w['tiktoken'].median, w['llmkit'].median, 'tiktoken')}")
    if threads:
        vs += f"; -t 2 {ratio(w['llmkit'].median, w['llmkit -t 2'].median)} of -t 1"
    rows = [Row(f"tok-encode-bpe8k{tag}-process", f"BPE 8k encode {mb:.1f} MB ({n_ids} ids), whole process",
                f"HF {w['HF tokenizers'].fmt()}; tiktoken {w['tiktoken'].fmt()}", ours, vs, "; ".join(checks),
                cmds_of(setup, *cmds))]
    from harness import field_stat

    for n in (1, 2) if threads else (1,):
        suffix = "" if n == 1 else "2"
        spans = [Cmd(lbl, [PY, ME, "span", impl + suffix, tok, corpus], env={"RAYON_NUM_THREADS": n})
                 for lbl, impl in sides]
        runs = compare(spans, cfg)
        s = {c.label: field_stat(runs[c.label], "mb_per_s") for c in spans}
        toks = {c.label: runs[c.label][0].report["tokens"] for c in spans}
        rows.append(Row(f"tok-encode-bpe8k{tag}-span" + ("" if n == 1 else "-t2"),
                        f"BPE 8k encode {mb:.1f} MB, in-process, {n} thread{'s' if n > 1 else ''}: only the encode "
                        "call over all lines (MB/s)",
                        f"HF {s['HF tokenizers'].fmt('MB/s')}; tiktoken {s['tiktoken'].fmt('MB/s')}",
                        s["llmkit"].fmt("MB/s"),
                        f"speed {ratio(s['llmkit'].median, s['HF tokenizers'].median)} HF, "
                        f"{ratio(s['llmkit'].median, s['tiktoken'].median)} tiktoken",
                        "token totals " + ("equal" if len(set(toks.values())) == 1 else f"differ {toks}") +
                        " (ids compared in the process row)", cmds_of(*spans)))
    return rows


def adversarial_row(cfg, corpus: str, tok: str) -> Row:
    """1 MB of prose, a 1 MB run of one character and 1 MB without spaces, each one text, in-process."""
    from harness import field_stat

    cmds = [Cmd(lbl, [PY, ME, "span-adversarial", impl, tok, corpus]) for lbl, impl in
            (("HF tokenizers", "hf"), ("tiktoken", "tiktoken"), ("llmkit", "llmkit"))]
    runs = compare(cmds, cfg, min_runs=3, fast_runs=3)

    def cell(label):
        st = {k: field_stat(runs[label], f"{k}_s") for k in ("prose", "run", "nospace")}
        return (f"prose {st['prose'].fmt(digits=3)}; run {st['run'].fmt(digits=3)}; no spaces "
                f"{st['nospace'].fmt(digits=3)}"), st

    cells = {c.label: cell(c.label) for c in cmds}
    lk = cells["llmkit"][1]
    return Row("tok-encode-adversarial", "BPE 8k encode one 1 MB text: prose (newlines as spaces), a run of 'a', "
               "the prose without spaces; in-process seconds",
               f"HF {cells['HF tokenizers'][0]}; tiktoken {cells['tiktoken'][0]}", cells["llmkit"][0],
               f"llmkit run/prose {ratio(lk['run'].median, lk['prose'].median)}, "
               f"no-spaces/prose {ratio(lk['nospace'].median, lk['prose'].median)}",
               "goal: a run of one character within 2x the prose time", cmds_of(*cmds))


def source_tree(cfg) -> tuple[str, str]:
    """data/source-tree when present (any checkout put there), else this Python's standard library;
    llmkit's own package for the smoke run."""
    import sysconfig

    mine = os.path.join(ROOT, "data/source-tree")
    if cfg.smoke:
        return os.path.join(ROOT, "llmkit"), "llmkit/ (this checkout)"
    if os.path.isdir(mine):
        return mine, "data/source-tree"
    std = sysconfig.get_paths()["stdlib"]
    return std, f"Python {sys.version_info[0]}.{sys.version_info[1]}'s standard library ({std})"


def count_rows(cfg, tok: str, setup: Cmd) -> list[Row]:
    """`tokenize count` over a source tree against `tokenize encode` on the same bytes, -t 1 and -t 2."""
    from harness import run_once

    tree, desc = source_tree(cfg)
    d = cfg.tmp("tokenize-count")
    listing = os.path.join(d, "listing.json")
    list_cmd = Cmd("setup: the counted files", [PY, "-m", "llmkit", "-q", "tokenize", "count", "-m", tok, "--json", tree],
                   stdout=listing)
    run_once(list_cmd)
    rep = json.load(open(listing, encoding="utf-8"))
    concat = os.path.join(d, "concatenated.txt")
    with open(concat, "wb") as out:
        for f in rep["files"]:
            out.write(open(f["path"], "rb").read())
    rows = []
    for n in (1, 2):
        enc = Cmd("llmkit encode", [PY, "-m", "llmkit", "-q", "tokenize", "encode", "-m", tok, "-t", n], stdin=concat,
                  stdout=os.devnull)
        cnt = Cmd("llmkit count", [PY, "-m", "llmkit", "-q", "tokenize", "count", "-m", tok, "-t", n, "--json", tree],
                  stdout=os.path.join(d, f"count-t{n}.json"))
        runs = compare([enc, cnt], cfg)
        check_cmd = Cmd("check: HF ids per file", [PY, ME, "count-hf", tok, cnt.stdout])
        chk = run_once(check_cmd).report
        a, b = walls(runs[enc.label]), walls(runs[cnt.label])
        rows.append(Row(f"tok-count-tree-t{n}", f"BPE 8k: count {len(rep['files'])} files "
                        f"({rep['total']['bytes'] / 1e6:.1f} MB; {rep['total']['skipped']} skipped) of {desc}, "
                        f"whole process, -t {n}; the anchor encodes the same files concatenated",
                        f"encode {a.fmt()}", f"count {b.fmt()}", f"count/encode time {ratio(b.median, a.median)}",
                        f"{chk['files'] - chk['differ']} of {chk['files']} files' counts equal to HF's ids, total "
                        f"{'equal to' if chk['total_equal'] else 'DIFFERENT from'} the sum; goal: <= 1.2x encode",
                        cmds_of(setup, list_cmd, enc, cnt, check_cmd)))
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


_WORD = None


def varied(text: str, k: int) -> str:
    """The k-th repetition of a text with about a quarter of its words of 4+ letters rotated by k
    letters (which words depends on k): a repeated corpus keeps gaining rare distinct words, as a
    larger real corpus does, instead of only raising the counts of the same ones."""
    import re
    import zlib

    global _WORD
    if k == 0:
        return text
    _WORD = _WORD or re.compile(r"[A-Za-z]{4,}")

    def turn(m):
        w = m.group(0)
        if zlib.crc32(f"{w}{k}".encode()) % 4:
            return w
        r = k % len(w)
        return w[r:] + w[:r]

    return _WORD.sub(turn, text)


def code_text(limit: int) -> tuple[bytes, str]:
    """Python source as found in this Python's site-packages (.py files in path order, UTF-8 ones),
    up to `limit` bytes."""
    import sysconfig

    root = sysconfig.get_paths()["purelib"]
    parts, n = [], 0
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            try:
                b = open(os.path.join(d, f), "rb").read()
                b.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            parts.append(b.replace(b"\r", b"") + (b"" if b.endswith(b"\n") else b"\n"))
            n += len(parts[-1])
            if n >= limit:
                return b"".join(parts), f"the .py files of {root}"
    return b"".join(parts), f"the .py files of {root}"


def scale_corpus(cfg, kind: str, mb: float) -> tuple[str, str]:
    """~`mb` MB of prose (the Debian text, else the kernel docs fixture) or code (site-packages .py),
    the distinct text followed by `varied` repetitions when it is shorter."""
    want = int(mb * 1e6)
    path = os.path.join(cfg.tmp("tokenize-scale"), f"{kind}-{mb:g}mb.txt")
    if kind == "code":
        base, name = code_text(want)
    else:
        base, name = debian_text(cfg) if mb > 2 else (b"", "")
        if not base:
            with gzip.open(os.path.join(ROOT, "tests/fixtures/kernel-docs.txt.gz")) as f:
                base, name = f.read(), "tests/fixtures/kernel-docs.txt.gz"
    text = base.decode("utf-8", "replace")
    n, k = 0, 0
    with open(path, "w", encoding="utf-8") as out:
        while n < want:
            whole = varied(text, k)
            k += 1
            part = whole[: want - n]
            if len(part) < len(whole):
                part = part[: part.rfind("\n") + 1] or part
            out.write(part)
            n += len(part.encode("utf-8"))
            if len(part) < len(whole):
                break
    rep = f", then {k - 1} varied repetitions" if k > 1 else ""
    return path, f"{n / 1e6:.1f} MB of {name} ({len(base) / 1e6:.1f} MB distinct{rep})"


def scale_rows(cfg) -> tuple[list[Row], list[str]]:
    """Training time and peak RSS against HF at 10 MB, 300 MB and 1 GB of prose and of code: BPE and
    WordPiece (limit_alphabet 1000 on both sides) at every size, Unigram up to 50 MB (its EM over every
    seed piece takes minutes per 20 MB)."""
    rows, notes = [], []
    for mb in cfg.pick([10, 300, 1000], [10, 300], [0.3]):
        for kind in ("prose", "code"):
            corpus, desc = scale_corpus(cfg, kind, mb)
            notes.append(f"-{kind}-{mb:g}mb rows: {desc}" + cfg.pick("", "; one run per side", ""))
            jobs = ["bpe8k", "wp8k"] + (["uni8k"] if mb <= 50 else [])
            # one run per side per size in quick mode: a 300 MB run or a 10 MB Unigram takes minutes
            rows += train_rows(cfg, corpus, jobs, tag=f"-{kind}-{mb:g}mb", limit_alphabet=1000,
                               rounds=cfg.pick(3, 1, 1))
            os.remove(corpus)
    return rows, notes


def rows(cfg):
    corpus, desc = corpus_file(cfg, cfg.pick(10, 2, 0.1))
    jobs = cfg.pick(list(JOBS), list(JOBS), ["bpe8k", "wp8k", "uni8k"])
    tok, setup = encode_tokenizer(cfg, corpus)
    out = train_rows(cfg, corpus, jobs) if cfg.wants("train") else []
    out += encode_rows(cfg, corpus, tok, setup) if cfg.wants("encode") else []
    big, big_desc = big_corpus(cfg, cfg.pick(100, 100, 1))
    if cfg.wants("encode"):
        out += encode_rows(cfg, big, tok, setup, tag="-big", threads=True)
        out += [adversarial_row(cfg, corpus, tok), vocab_row(cfg)]
    out += count_rows(cfg, tok, setup) if cfg.wants("count") else []
    # Unigram's EM over a lattice of every seed piece takes minutes per 20 MB on both sides: its large
    # row uses the first 20 MB of the same text
    mid = head_of(big, cfg.pick(20, 20, 0.5), cfg.tmp("tokenize"))
    if cfg.wants("train"):
        out += train_rows(cfg, big, ["bpe8k", "wp8k"], tag="-big")
        out += train_rows(cfg, mid, ["uni8k"], tag="-20mb")
    scaled, scale_notes = scale_rows(cfg) if cfg.wants("scale") else ([], [])
    out += scaled
    setup_lines = [f"corpus: {desc}", f"large corpus (-big rows): {big_desc}; the -20mb row: its first "
                   f"{os.path.getsize(mid) / 1e6:.1f} MB",
                   "HF tokenizers single-threaded (RAYON_NUM_THREADS=1) except in the -t2 rows; tiktoken's Encoding "
                   "built from the HF BPE's vocabulary (ranks = HF ids) and GPT-2's pattern, since tiktoken cannot "
                   "download its files here; every encode row uses the HF BPE 8k trained on the first corpus",
                   "training rows: one run per side per round, no warm-up round (the runs are long)", *scale_notes]
    return "llmkit vs HF tokenizers / tiktoken / gguf", setup_lines, out


if __name__ == "__main__":
    child(sys.argv[1:])
