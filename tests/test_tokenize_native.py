"""The compiled BPE encoder (tokenize.native / bpe_native) against HF tokenizers on real and adversarial
text, its start-up without numba, and `tokenize encode/stats --threads` through the CLI."""

import json
import random
import subprocess
import sys
import time
import unicodedata

import pytest
from conftest import run_cli

from llmkit import tokenize
from llmkit.tokenize.formats.hf import from_hf_json

hf = pytest.importorskip("tokenizers")

LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _category_samples() -> str:
    """Up to 12 characters of every Unicode general category (surrogates excepted), spread over the range."""
    seen: dict[str, list[str]] = {}
    for cp in range(0, 0x110000, 7):
        c = chr(cp)
        cat = unicodedata.category(c)
        if cat != "Cs" and len(seen.setdefault(cat, [])) < 12:
            seen[cat].append(c)
    return "".join("".join(v) for v in seen.values())


def adversarial_lines() -> list[str]:
    rng = random.Random(5)
    cats = _category_samples()
    letters = "abcdefghijklmnopqrstuvwxyzéüß"
    return [
        "a" * 200_000,  # one pre-token of 200k bytes: tiktoken's quadratic case
        " " * 50_000 + "x",
        "\n" * 3 + " \r\n \t\u3000 x",
        "".join(rng.choice(letters) for _ in range(100_000)),  # a long line without spaces
        "1234567890" * 5_000,
        "🙂" * 20_000,
        cats,
        " ".join(cats),
        "".join(rng.choice(cats + " '") for _ in range(20_000)),
        "don't DON'T it'S we'LL I'M 'ſ 'll 'Ll x'd 're've''s !!'s  's",
        "tab\tx \t y\u00a0z\u2028w\u0085v  \r\r\n \n",
        "(hello) [world]! ¿qué? 12,345.67 a1b22c333d4444",
        "",
        " ",
        "x",
    ]


def _hf_bpe(path, pattern: str | None, ignore_merges: bool = False):
    """An HF tokenizer with the model of tokenizer.json `path` and the given Split pattern + ByteLevel."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    d = json.loads(path.read_text(encoding="utf-8"))
    d["model"]["ignore_merges"] = ignore_merges
    tok = Tokenizer.from_str(json.dumps(d))
    if pattern is not None:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


@pytest.fixture(scope="module")
def bpe_file(kernel_docs, tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    ref = Tokenizer(models.BPE())
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    ref.decoder = decoders.ByteLevel()
    ref.train([str(kernel_docs)], trainers.BpeTrainer(vocab_size=4000, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    p = tmp_path_factory.mktemp("native") / "bpe.json"
    ref.save(str(p))
    return p


@pytest.mark.parametrize("pattern,ignore_merges", [(None, False), (LLAMA3, True), (QWEN2, False)],
                         ids=["gpt2", "llama3", "qwen2"])
def test_native_ids_equal_hf_on_every_line(kernels, bpe_file, kernel_docs, pattern, ignore_merges):
    ref = _hf_bpe(bpe_file, pattern, ignore_merges)
    ours = from_hf_json(json.loads(ref.to_str()))
    assert ours.model.native(1) is not None  # the compiled path serves this model
    lines = kernel_docs.read_text(encoding="utf-8").split("\n")[:20_000] + adversarial_lines()
    got = ours.encode_batch(lines)
    want = [e.ids for e in ref.encode_batch(lines, add_special_tokens=False)]
    bad = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    assert not bad, f"{len(bad)} lines differ, first: {lines[bad[0]][:80]!r}"
    assert len(got) == len(want)


def test_native_equals_python_path_for_gguf_patterns(kernels, bpe_file, tmp_path):
    """llama.cpp's spellings of the Llama-3 and Qwen2 patterns (ASCII-only case folding)."""
    from ggufmake import write_vocab_gguf

    base = tokenize.load(str(bpe_file)).model
    tokens = [base.id_to_token[i] for i in range(len(base.id_to_token))]
    lines = adversarial_lines()
    for pre in ("llama3", "qwen2", "gpt-2"):
        path = write_vocab_gguf(tmp_path / f"{pre}.gguf", "gpt2", tokens, merges=base.merges, pre=pre)
        fast, slow = tokenize.load(str(path)), tokenize.load(str(path))
        slow.model._native = False
        assert fast.model.native(1) is not None
        assert fast.encode_batch(lines) == [slow.encode(x) for x in lines], pre


def test_run_of_one_character_is_linear(kernels, bpe_file, kernel_docs):
    tok = tokenize.load(str(bpe_file))
    nb = tok.model.native(1)
    prose = kernel_docs.read_bytes()[:1_000_000].replace(b"\n", b" ")
    run = b"a" * 1_000_000

    def best(data):
        ts = []
        for _ in range(3):
            nb._local.__dict__.clear()  # a fresh word cache, so the prose is not all cache hits
            t = time.perf_counter()
            nb.encode_parts([data])
            ts.append(time.perf_counter() - t)
        return min(ts)

    assert best(run) <= 4 * best(prose) + 0.05


def test_library_loads_without_numba(kernels, bpe_file):
    """Once linked, a new process encodes through the library and never imports numba or numpy."""
    if kernels.source != "library":
        pytest.skip("no C linker here: the kernels run through numba (covered by the tests above)")
    code = ("import sys; from llmkit import tokenize; t = tokenize.load(sys.argv[1]); "
            "ids = t.encode_batch(['hello world'] * 3); assert t.model._native.k.source == 'library'; "
            "print([m for m in ('numba', 'numpy') if m in sys.modules], ids[0])")
    r = subprocess.run([sys.executable, "-c", code, str(bpe_file)], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("[] [")


def test_cli_threads_keep_input_order_and_hf_ids(kernels, bpe_file, kernel_docs, tmp_path, monkeypatch):
    monkeypatch.setattr("llmkit.tokenize.corpus.stream.CHUNK_BYTES", 1 << 16)  # many blocks in flight
    text = kernel_docs.read_text(encoding="utf-8")[:400_000] + "\n" + "\n".join(adversarial_lines()[1:6]) + "\n"
    outs = {}
    for n in ("1", "2"):
        r = run_cli(["tokenize", "encode", "-m", str(bpe_file), "-t", n], input=text.encode())
        assert r.exit_code == 0, r.stderr
        outs[n] = r.stdout
    assert outs["1"] == outs["2"]
    ref = hf.Tokenizer.from_file(str(bpe_file))
    lines = [x.removesuffix("\r") for x in text.split("\n")[:-1]]  # how stdin lines are read
    want = "".join(" ".join(map(str, e.ids)) + "\n" for e in ref.encode_batch(lines, add_special_tokens=False))
    assert outs["2"] == want


def test_cli_threads_zero_is_a_usage_error_and_too_many_are_clamped(bpe_file, kernel_small):
    r = run_cli(["tokenize", "encode", "-m", str(bpe_file), "--threads", "0"], input="x\n")
    assert r.exit_code == 2 and "--threads" in r.stderr
    r = run_cli(["tokenize", "stats", "--json", "-m", str(bpe_file), "-t", "4096", str(kernel_small)])
    assert r.exit_code == 0 and "more than the" in r.stderr


def test_stats_threads_equal_one_thread(bpe_file, kernel_small, tmp_path, monkeypatch):
    monkeypatch.setattr("llmkit.tokenize.corpus.stats.BATCH_CHARS", 20_000)
    rows = {n: json.loads(run_cli(["tokenize", "stats", "--json", "-m", str(bpe_file), "-t", n, str(kernel_small)]).stdout)
            for n in ("1", "2")}
    assert rows["1"] == rows["2"]
    text = kernel_small.read_text(encoding="utf-8")
    assert rows["1"][0]["lines"] == text.count("\n") + (not text.endswith("\n"))


def test_invalid_utf8_byte_level_encoded_others_refused(kernels, bpe_file, kernel_small, tmp_path):
    data = b"caf\xc3\xa9 ok\nbad \xff\xfe byte\n"
    r = run_cli(["tokenize", "encode", "-m", str(bpe_file)], input=data)
    assert r.exit_code == 0, r.stderr
    ids = [int(x) for x in r.stdout.splitlines()[1].split()]
    tok = tokenize.load(str(bpe_file))
    raw = b"".join(__import__("llmkit.tokenize.pretok", fromlist=["x"]).from_byte_symbols(tok.id_to_token(i)) for i in ids)
    assert raw == b"bad \xff\xfe byte"  # every byte kept, as byte-level tokens can
    wp = tmp_path / "wp.json"
    assert run_cli(["tokenize", "train", "--algo", "wordpiece", "--vocab-size", "300", "-o", str(wp), str(kernel_small)]).exit_code == 0
    r = run_cli(["tokenize", "encode", "-m", str(wp)], input=data)
    assert r.exit_code == 1 and "not valid UTF-8 (byte 13)" in r.stderr


def test_line_over_the_limit_is_refused_naming_it(bpe_file, monkeypatch):
    monkeypatch.setenv("LLMKIT_MAX_LINE_BYTES", "4K")
    monkeypatch.setattr("llmkit.tokenize.corpus.stream.CHUNK_BYTES", 1024)
    r = run_cli(["tokenize", "encode", "-m", str(bpe_file)], input=b"ok\n" + b"x" * 10_000)
    assert r.exit_code == 1 and "longer than 4096 bytes (LLMKIT_MAX_LINE_BYTES)" in r.stderr
