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
