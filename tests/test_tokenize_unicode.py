"""Byte-level pre-tokenizers cut text where HF tokenizers does, letters of a newer Unicode included.

HF's regex engine (Oniguruma) knows Unicode 16.0; the `regex` module knows a newer one, whose added
letters (Beria Erfe U+16EA0.., Latin U+A7CF, Tolong Siki digits U+11DE0..) once split words that HF
keeps whole, and BPE merges on code diverged (llmkit/tokenize/unicode_classes.py).
"""

import json
import random

import pytest
import regex
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from llmkit.io import iter_lines
from llmkit.tokenize import native, pretok, unicode_classes
from llmkit.tokenize.formats.hf import from_hf_json
from llmkit.tokenize.training.train import count_words, train

# letters and digits Unicode added after HF's tables, one it has (Garay U+10D4A), and U+FE0F
NEWER = "\U00016ecf\U00016ea0\ua7cf\U0001df57\U000323b0\U00011de0\U00011de5"
KNOWN = "\U00010d4a\ufe0f✏⛏я小"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _hf_class(pt, ch: str) -> int:
    """HF's class bits of one character, read from how ByteLevel cuts it beside 'a', '1' and a tab."""
    one = lambda s: len(pt.pre_tokenize_str(s)) == 1  # noqa: E731
    return (1 if one("a" + ch) else 0) | (2 if one("1" + ch) else 0) | (4 if one("\t" + ch) else 0)


def test_class_table_equals_hf_where_the_regex_module_differs_and_on_a_sample():
    pt = pre_tokenizers.ByteLevel(add_prefix_space=False)
    every = "".join(map(chr, range(0x110000)))
    theirs = bytearray(0x110000)
    for bit, pat in ((1, r"\p{L}"), (2, r"\p{N}"), (4, r"\s")):
        for m in regex.finditer(pat, every):
            theirs[m.start()] |= bit
    table = native.class_table()
    cps = {cp for cp in range(0x110000) if theirs[cp] != table[cp]}
    cps |= set(range(0, 0x40000, 5)) | {ord(c) for c in NEWER + KNOWN}
    cps -= set(range(0xD800, 0xE000))
    bad = [hex(cp) for cp in sorted(cps) if table[cp] != _hf_class(pt, chr(cp))]
    assert not bad, f"{len(bad)} code points classed unlike HF, first {bad[:8]}"
    assert table == unicode_classes.table()


def _code_lines(n: int = 3000) -> list[str]:
    """Python-like lines whose string literals hold the characters, as in site-packages code."""
    rng = random.Random(11)
    chars = NEWER + KNOWN
    names = ["icon", "label", "emoji", "key", "x"]
    out = []
    for _ in range(n):
        c, d = rng.choice(chars), rng.choice(chars)
        out.append(rng.choice([f'    "{c}",\n', f'    {rng.choice(names)}("{c}{d}"),\n',
                               f'{rng.choice(names)} = "{c}x{d}1"  # {c}{d}\n', f"    '{c}': {rng.randint(0, 99)},\n"]))
    return out


def _hf_trained(path, vocab_size: int):
    ref = Tokenizer(models.BPE())
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    ref.decoder = decoders.ByteLevel()
    ref.train([str(path)], trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return ref


@pytest.mark.parametrize("compiled", [True, False], ids=["kernels", "python"])
def test_training_on_newer_letters_gives_hf_counts_and_merges(compiled, kernels, tmp_path, monkeypatch):
    path = tmp_path / "code.txt"
    lines = _code_lines()
    path.write_text("".join(lines), encoding="utf-8")
    if not compiled:
        monkeypatch.setenv("LLMKIT_NO_JIT", "1")
    pt = pre_tokenizers.ByteLevel(add_prefix_space=False)
    want: dict[str, int] = {}
    for line in lines:
        for w, _ in pt.pre_tokenize_str(line):
            want[w] = want.get(w, 0) + 1
    assert dict(count_words(iter_lines([str(path)]), "bpe")) == want
    ref = _hf_trained(path, 500)
    ours = train(iter_lines([str(path)]), "bpe", 500)
    assert [list(m) for m in ours.model.merges] == json.loads(ref.to_str())["model"]["merges"]


@pytest.mark.parametrize("pattern", [None, LLAMA3], ids=["gpt2", "llama3"])
def test_encoding_newer_letters_gives_hf_ids_on_both_paths(pattern, kernels, tmp_path):
    path = tmp_path / "code.txt"
    path.write_text("".join(_code_lines(800)), encoding="utf-8")
    ref = _hf_trained(path, 400)
    if pattern is not None:
        ref.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    lines = [line.rstrip("\n") for line in _code_lines(300)] + [NEWER + " " + KNOWN, "a" + NEWER + "1" + NEWER]
    want = [e.ids for e in ref.encode_batch(lines, add_special_tokens=False)]
    fast, slow = from_hf_json(json.loads(ref.to_str())), from_hf_json(json.loads(ref.to_str()))
    slow.model._native = False
    assert fast.model.native(1) is not None
    assert fast.encode_batch(lines) == want
    assert [slow.encode(x) for x in lines] == want


def test_patterns_without_letter_classes_are_left_alone():
    assert unicode_classes.pin_pattern(r"[\p{P}\$]+|\\p{L}") == (r"[\p{P}\$]+|\\p{L}", False)
    assert pretok.split_gpt2("a\U00016ea0b x1\U00011de0") == ["a", "\U00016ea0", "b", " x", "1", "\U00011de0"]
