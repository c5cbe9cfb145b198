"""`tokenize train --min-frequency/--special/--lowercase` and `tokenize decode --skip-special` through
the CLI, against HF tokenizers trained and decoding with the same settings."""

import json

import pytest

from conftest import run_cli

hf = pytest.importorskip("tokenizers")


def test_min_frequency_and_special_tokens_equal_hf_bpe_trainer(kernel_small, tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = tmp_path / "tok.json"
    r = run_cli(["tokenize", "train", "--algo", "bpe", "--vocab-size", "5000", "--min-frequency", "40",
                 "--special", "<s>", "--special", "</s>", "-o", str(out), str(kernel_small)])
    assert r.exit_code == 0, r.stderr
    ref = Tokenizer(models.BPE())
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    ref.decoder = decoders.ByteLevel()
    ref.train([str(kernel_small)], trainers.BpeTrainer(vocab_size=5000, min_frequency=40, show_progress=False,
                                                       special_tokens=["<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ours = json.loads(out.read_text())
    assert ours["model"]["merges"] == json.loads(ref.to_str())["model"]["merges"]
    assert len(ours["model"]["merges"]) < 5000 - 258  # --min-frequency stopped training before the size
    assert ours["model"]["vocab"] == ref.get_vocab()
    assert [(t["id"], t["content"], t["special"]) for t in ours["added_tokens"]] == [(0, "<s>", True), (1, "</s>", True)]

    text = "<s>The kernel maps memory.</s>"
    enc = run_cli(["tokenize", "encode", "-m", str(out)], input=text + "\n")
    assert enc.exit_code == 0, enc.stderr
    ids = ref.encode(text).ids
    assert ids[0] == 0 and ids[-1] == 1 and " ".join(map(str, ids)) in enc.stdout
    plain = run_cli(["tokenize", "decode", "-m", str(out)], input=" ".join(map(str, ids)) + "\n")
    skip = run_cli(["tokenize", "decode", "-m", str(out), "--skip-special"], input=" ".join(map(str, ids)) + "\n")
    assert plain.stdout.rstrip("\n") == ref.decode(ids, skip_special_tokens=False) == text
    assert skip.stdout.rstrip("\n") == ref.decode(ids, skip_special_tokens=True) == "The kernel maps memory."


def test_lowercase_is_written_into_the_file(kernel_small, tmp_path):
    from tokenizers import Tokenizer

    files = {}
    for name, extra in (("lower", ["--lowercase"]), ("cased", [])):
        files[name] = tmp_path / f"{name}.json"
        r = run_cli(["tokenize", "train", "--algo", "wordpiece", "--vocab-size", "800", *extra, "-o", str(files[name]),
                     str(kernel_small)])
        assert r.exit_code == 0, r.stderr
    lower, cased = (Tokenizer.from_file(str(files[n])) for n in ("lower", "cased"))
    assert lower.encode("KERNEL Memory Pages").ids == lower.encode("kernel memory pages").ids
    assert cased.encode("KERNEL Memory Pages").ids != cased.encode("kernel memory pages").ids
    assert not [t for t in lower.get_vocab() if any(c.isupper() for c in t) and not (t.startswith("[") and t.endswith("]"))]


def test_the_corpus_is_read_in_blocks(kernel_small, tmp_path, monkeypatch):
    """Training reads its input a block at a time: the same lines as reading the file whole (a
    multi-byte character cut by a block edge, a last line without its newline), and a bad byte far
    into the file named at its offset in the file, before anything is written."""
    from llmkit import io

    data = kernel_small.read_bytes() + "naïve café 中文 — x\n".encode() * 50 + b"no newline at the end"
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(data)
    whole = io.split_lines(data.decode("utf-8"))
    for block in (7, 4096, 1 << 20):
        monkeypatch.setattr(io, "READ_BLOCK", block)
        assert list(io.iter_lines([str(corpus)])) == whole
    bad = tmp_path / "bad.txt"
    bad.write_bytes(data + b"\nx\xff\n")
    monkeypatch.setattr(io, "READ_BLOCK", 4096)
    out = tmp_path / "tok.json"
    r = run_cli(["tokenize", "train", "--algo", "bpe", "--vocab-size", "300", "-o", str(out), str(bad)])
    assert r.exit_code == 1 and f"not valid UTF-8 (byte {len(data) + 2})" in r.stderr, r.stderr
    assert not out.exists()


def _rare_characters_corpus(path):
    """Common English words plus 40 rare characters, character i in i + 1 lines (so every character
    count differs), the six rarest also before a 'j' found nowhere else."""
    import random

    rng = random.Random(7)
    common = "the kernel maps memory pages into each process and frees them later".split()
    rare = [chr(c) for c in range(0x3B1, 0x3B1 + 20)] + [chr(c) for c in range(0x430, 0x430 + 20)]
    lines = [" ".join(rng.choice(common) for _ in range(8)) for _ in range(300)]
    for i, ch in enumerate(rare):
        lines += [f"{ch}ab x{ch}y" if j % 2 else f"q{ch}{ch} {ch}zz" for j in range(i + 1)]
    # 'j' only after characters --limit-alphabet 56 leaves out: then it is a continuation ('##j') only
    lines += [f"{ch}j" for ch in rare[:6] for _ in range(4)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("path", ["python", "compiled"])
def test_limit_alphabet_keeps_hf_wordpiece_trainers_alphabet(path, tmp_path, monkeypatch):
    """--limit-alphabet keeps the characters HF's WordPieceTrainer(limit_alphabet=K) keeps, with the
    same continuation pieces (a character after a left-out first character is still '##'), and the
    vocabulary has the size asked (HF's trainer ranks merges differently, so only the alphabet is
    compared)."""
    from collections import Counter

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    monkeypatch.setenv("LLMKIT_JIT" if path == "compiled" else "LLMKIT_NO_JIT", "1")
    corpus = _rare_characters_corpus(tmp_path / "corpus.txt")
    k, size = 56, 200
    counts = sorted(Counter(corpus.read_text(encoding="utf-8").replace(" ", "").replace("\n", "")).values(),
                    reverse=True)
    assert len(counts) == k + 7 and counts[k - 1] != counts[k]  # no tie at the cut: HF's cut is then certain
    out = tmp_path / "wp.json"
    r = run_cli(["tokenize", "train", "--algo", "wordpiece", "--vocab-size", str(size), "--limit-alphabet", str(k),
                 "-o", str(out), str(corpus)])
    assert r.exit_code == 0, r.stderr
    ours = json.loads(out.read_text(encoding="utf-8"))["model"]["vocab"]

    ref = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    ref.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    ref.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    ref.train([str(corpus)], trainers.WordPieceTrainer(vocab_size=size, show_progress=False, special_tokens=["[UNK]"],
                                                       limit_alphabet=k))
    theirs = ref.get_vocab()

    def single(vocab):
        return {t for t in vocab if len(t.removeprefix("##")) == 1}

    assert len(ours) == size
    assert {t.removeprefix("##") for t in single(ours)} == {t.removeprefix("##") for t in single(theirs)}
    assert len({t.removeprefix("##") for t in single(ours)}) == k
    # HF adds every kept character bare; llmkit only those that begin a word
    assert {t for t in single(ours) if t.startswith("##")} == {t for t in single(theirs) if t.startswith("##")}
    assert "##j" in ours and "j" not in ours and single(ours) <= single(theirs)


def test_limit_alphabet_is_named_when_the_alphabet_does_not_fit_and_refused_outside_wordpiece(tmp_path):
    corpus = _rare_characters_corpus(tmp_path / "corpus.txt")
    out = tmp_path / "wp.json"
    r = run_cli(["tokenize", "train", "--algo", "wordpiece", "--vocab-size", "30", "-o", str(out), str(corpus)])
    assert r.exit_code == 1 and "Use --vocab-size" in r.stderr
    assert "or --limit-alphabet N to keep the N most frequent characters." in r.stderr, r.stderr
    for algo in ("bpe", "unigram"):
        r = run_cli(["tokenize", "train", "--algo", algo, "--vocab-size", "300", "--limit-alphabet", "10", "-o",
                     str(out), str(corpus)])
        assert r.exit_code == 2 and "--limit-alphabet" in r.stderr and "WordPiece only" in r.stderr, r.stderr
    assert not out.exists()


@pytest.mark.parametrize("algo", ["bpe", "wordpiece", "unigram"])
def test_a_vocabulary_smaller_than_asked_is_said(algo, tmp_path):
    corpus = tmp_path / "small.txt"
    corpus.write_text("hello world\nthe quick brown fox\n")
    r = run_cli(["tokenize", "train", "--algo", algo, "--vocab-size", "8000", "-o", str(tmp_path / "t.json"), str(corpus)])
    assert r.exit_code == 0, r.stderr
    size = len(json.loads((tmp_path / "t.json").read_text())["model"]["vocab"])
    assert size < 8000 and "fewer than --vocab-size 8000" in r.stderr
