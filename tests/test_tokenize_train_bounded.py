"""Training in bounded memory: the compiled BPE loop against the Python one, the word count's pruning
and its stated error bound, and `tokenize train --max-memory` measured in a child process."""

import json
import random
import subprocess
import sys
from collections import Counter

import pytest
from conftest import llmkit_env, run_cli

from llmkit.io import iter_lines
from llmkit.tokenize.bpe import bpe_train_native
from llmkit.tokenize.bpe.bpe import train_bpe
from llmkit.tokenize.training.train import count_words, train
from llmkit.tokenize.training.wordbound import Bound


def _python_loop(monkeypatch):
    monkeypatch.setattr(bpe_train_native, "train", lambda *a, **k: None)


def _random_words(n: int, seed: int, alphabet: str = "abcdefghijklmnopqrstuvwxyz", lo: int = 4, hi: int = 12) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def test_compiled_bpe_loop_equals_python_loop_with_pools_growing(kernels, kernel_small, monkeypatch):
    """Real text, and a three-letter corpus of many short words (ties everywhere); the compiled
    loop's pools start nearly empty, so every one grows and merges resume half-way."""
    lines = kernel_small.read_text(encoding="utf-8").splitlines(keepends=True)
    counts = count_words(lines, "bpe")
    tiny = Counter(_random_words(3000, 3, "abc", 2, 9))
    for words, size in ((counts, 1200), (tiny, 300)):
        with monkeypatch.context() as m:
            m.setattr(bpe_train_native, "FIRST_PAIRS", 1)
            m.setattr(bpe_train_native, "FIRST_PAIR_SHARE", 1 << 30)
            m.setattr(bpe_train_native, "EXTRA", 0)
            m.setattr(bpe_train_native, "TEXT_PER_TOKEN", 0)
            fast = train_bpe(words, size)
        with monkeypatch.context() as m:
            _python_loop(m)
            slow = train_bpe(words, size)
        assert fast.merges == slow.merges and fast.vocab == slow.vocab


def test_min_frequency_stops_both_loops_at_the_same_merge(kernels, kernel_small, monkeypatch):
    counts = count_words(kernel_small.read_text(encoding="utf-8").splitlines(keepends=True), "bpe")
    fast = train_bpe(counts, 5000, min_frequency=40)
    _python_loop(monkeypatch)
    assert fast.merges == train_bpe(counts, 5000, min_frequency=40).merges
    assert len(fast.vocab) < 5000


def _zipf_lines(word_seed: int, seed: int) -> list[str]:
    """6,000 lines of 12 words drawn Zipf-like from 20,000 random words."""
    vocab = _random_words(20000, word_seed)
    rng = random.Random(seed)
    return [" ".join(vocab[min(int(rng.paretovariate(0.7)) - 1, len(vocab) - 1)] for _ in range(12)) + "\n"
            for _ in range(6000)]


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_pruned_counts_keep_the_stated_error_bound(path, kernels, monkeypatch):
    """A Zipf-like corpus counted under a bound far too small: every kept count is exact or at most E
    low, every dropped word occurred at most E times, and the report adds up."""
    if path == "python":
        monkeypatch.setenv("LLMKIT_NO_JIT", "1")
        monkeypatch.setattr("llmkit.tokenize.training.wordbound.BoundedCounter.CHECK_EVERY", 64)
    monkeypatch.setattr("llmkit.tokenize.training.counting.BLOCK_CHARS", 4096)
    lines = _zipf_lines(5, 6)
    truth = count_words(lines, "wordpiece")
    bound = Bound("wordpiece", 1 << 40)
    bound.report.limit = bound.cost(len(truth) // 8, sum(map(len, truth)) // 8)
    got = count_words(lines, "wordpiece", bound=bound)
    r = bound.report
    assert r.prunes >= 1 and r.error_bound >= 1 and len(got) < len(truth)
    assert all(truth[w] - r.error_bound <= c <= truth[w] for w, c in got.items())
    assert all(c <= r.error_bound for w, c in truth.items() if w not in got)
    assert r.occurrences == sum(truth.values()) and r.words_kept == len(got)
    assert r.occurrences_dropped == sum(truth.values()) - sum(got.values())
    assert bound.cost(len(got), sum(len(w.encode()) for w in got)) <= r.limit


def test_unigram_bound_counts_each_words_substrings(monkeypatch):
    """Unigram's seed and lattice hold an entry per substring of up to 16 characters, so its estimate
    grows with a word's length squared up to 16, then linearly: one 16-letter word costs more than
    four 4-letter ones. A corpus pruned under it keeps the stated error and ends within the bound."""
    import numpy as np

    b = Bound("unigram", 1 << 40)
    pieces = lambda L: b.word_costs(np.array([float(L)]))[0] - b.per_word
    assert pieces(16) > 4 * pieces(4) and pieces(16) == 136 * b.per_position
    assert pieces(32) - pieces(31) == 16 * b.per_position  # past 16 characters, 16 more per character
    monkeypatch.setattr("llmkit.tokenize.training.wordbound.BoundedCounter.CHECK_EVERY", 64)
    lines = _zipf_lines(8, 9)
    truth = count_words(lines, "unigram")
    cost = lambda words: b.word_costs(np.array([float(len(w)) for w in words])).sum()
    b.report.limit = int(cost(truth) / 8)
    got = count_words(lines, "unigram", bound=b)
    r = b.report
    assert r.prunes >= 1 and len(got) < len(truth) and cost(got) <= r.limit
    assert all(truth[w] - r.error_bound <= c <= truth[w] for w, c in got.items())


def test_unpruned_run_is_unchanged_and_reports_nothing(kernels, kernel_small, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    r1 = run_cli(["tokenize", "train", "--vocab-size", "600", "-o", str(a), str(kernel_small)])
    r2 = run_cli(["tokenize", "train", "--vocab-size", "600", "--max-memory", "8G", "-o", str(b), str(kernel_small)])
    assert r1.exit_code == 0 and r2.exit_code == 0
    assert json.loads(a.read_text())["model"] == json.loads(b.read_text())["model"]
    assert "pruned rare words" not in r2.stderr


MEASURE = """
import resource, subprocess, sys
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
print(p.stderr)
"""


@pytest.mark.parametrize("algo", ["bpe", "wordpiece"])
def test_corpus_larger_than_the_bound_trains_within_it_and_says_what_it_pruned(algo, kernels, tmp_path):
    words = _random_words(120_000, 7)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(" ".join(words[i:i + 12]) + "\n" for i in range(0, len(words), 12)) * 2)
    out = tmp_path / "tok.json"
    cmd = [sys.executable, "-m", "llmkit", "-q", "tokenize", "train", "--algo", algo, "--vocab-size", "500",
           "--max-memory", "128M", "-o", str(out), str(corpus)]
    rc_rss, stderr = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True,
                                    check=True, env=llmkit_env()).stdout.split("\n", 1)
    rc, rss_mb = map(int, rc_rss.split())
    assert rc == 0, stderr
    print(algo, "peak RSS", rss_mb, "MB")
    assert rss_mb <= 128
    assert "pruned rare words" in stderr and "within --max-memory 128 MiB" in stderr
    assert "every count is exact or at most" in stderr and "a dropped word occurred at most" in stderr
    assert len(json.loads(out.read_text())["model"]["vocab"]) == 500


def test_bound_too_small_and_bad_sizes_are_refused(kernel_small):
    r = run_cli(["tokenize", "train", "--vocab-size", "300", "--max-memory", "20M", str(kernel_small)])
    assert r.exit_code == 1 and "Error: --max-memory 20 MiB leaves no room for the words" in r.stderr
    r = run_cli(["tokenize", "train", "--vocab-size", "300", "--max-memory", "lots", str(kernel_small)])
    assert r.exit_code == 2 and "'lots' is not a positive number" in r.stderr


def test_every_size_option_reads_one_grammar():
    import click

    from llmkit.commands.quant.options import parse_size as target_size
    from llmkit.config import parse_size

    for text, value in [("1000", 1000), ("512M", 512 << 20), ("1.5G", 3 << 29), ("2GiB", 2 << 30), ("1T", 1 << 40)]:
        assert parse_size(text) == target_size(text) == value
    for text in ("0", "-1", "lots", "1.5X", "0.0001"):
        with pytest.raises(ValueError):
            parse_size(text)
        with pytest.raises(click.BadParameter):
            target_size(text)


@pytest.mark.parametrize("content", [b"", b"\n \n\t\n", bytes(range(256)) * 40])
def test_empty_or_binary_input_is_one_line(content, tmp_path):
    p = tmp_path / "in.txt"
    p.write_bytes(content)
    r = run_cli(["tokenize", "train", "--vocab-size", "300", str(p)])
    assert r.exit_code == 1
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    assert ("empty" in lines[0]) or ("binary" in lines[0])


def test_stream_of_files_counts_like_one_text(kernels, kernel_small, tmp_path):
    """The bounded path reads files as streams: two halves train like the whole."""
    text = kernel_small.read_text(encoding="utf-8")
    cut = text.index("\n", len(text) // 2) + 1
    (tmp_path / "a.txt").write_text(text[:cut], encoding="utf-8")
    (tmp_path / "b.txt").write_text(text[cut:], encoding="utf-8")
    whole = train(iter_lines([str(kernel_small)]), "bpe", 700, max_memory=1 << 30)
    parts = train(iter_lines([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]), "bpe", 700, max_memory=1 << 30)
    assert whole.model.merges == parts.model.merges
