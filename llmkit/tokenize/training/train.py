"""Training entry point: corpus lines -> word counts -> one of the three trainers -> Tokenizer."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable

import regex

from llmkit.errors import BadInput, OptionError
from llmkit.tokenize import pretok
from llmkit.tokenize.bpe.bpe import BPE, train_bpe
from llmkit.tokenize.pieces import Progress, Trace, Vocab, check_vocab_size
from llmkit.tokenize.tokenizer import AddedToken, Tokenizer
from llmkit.tokenize.unigram.unigram import Unigram
from llmkit.tokenize.unigram.unigram_train import train_unigram
from llmkit.tokenize.training.wordbound import Bound, BoundedCounter, Pruning
from llmkit.tokenize.wordpiece.wordpiece import WordPiece, train_wordpiece

ALGORITHMS = ("bpe", "wordpiece", "unigram")
DEFAULT_SPECIALS = {"bpe": [], "wordpiece": ["[UNK]"], "unigram": ["<unk>"]}


def count_words(lines: Iterable[str], algorithm: str, special_tokens: Iterable[str] = (), lowercase: bool = False,
                work_bytes: int = 0, bound: Bound | None = None) -> Counter:
    """Pre-tokenize every line the way the algorithm's tokenizer will, and count the words (in the
    order they first appear); the compiled kernels do it when they serve the algorithm (see
    `counting`; `work_bytes` decides whether compiling them pays). Under a `bound` rare words are
    pruned when the table outgrows it (`wordbound`; what was dropped is in `bound.report`).

    >>> dict(count_words(["the cat the"], "bpe"))
    {'the': 1, 'Ġcat': 1, 'Ġthe': 1}
    """
    from llmkit.tokenize.training.counting import count_compiled

    if algorithm not in ALGORITHMS:
        raise BadInput(f"unknown algorithm '{algorithm}'. Choose one of: {', '.join(ALGORITHMS)}.")
    splitter = _splitter(special_tokens)
    if _compiled_counting_serves(special_tokens):
        counted = count_compiled(lines, algorithm, splitter, lowercase, work_bytes, bound)
        if counted is not None:
            return counted
    return count_words_python(lines, algorithm, splitter, lowercase, bound)


def _splitter(special_tokens: Iterable[str]):
    specials = [s for s in special_tokens if s]
    return regex.compile("|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True))) if specials else None


def _compiled_counting_serves(special_tokens: Iterable[str]) -> bool:
    return not any("\n" in s for s in special_tokens)


def count_words_python(lines: Iterable[str], algorithm: str, splitter, lowercase: bool, bound: Bound | None = None) -> Counter:
    """count_words without the kernels, line by line."""
    counter = BoundedCounter(bound)
    if algorithm == "bpe":
        findall = pretok.compile_pattern(pretok.GPT2_PATTERN).findall
        for line in lines:
            if splitter is not None:
                for part in splitter.split(line):
                    counter.update(findall(part))
            else:
                counter.update(findall(line))
            counter.line_done()
        out: Counter = Counter()
        for w, c in counter.result().items():
            out[pretok.to_byte_symbols(w)] += c
        return out
    for line in lines:
        # WordPiece treats line ends as whitespace; Unigram keeps them as characters (as HF does when
        # training from files), so '\n' is in the vocabulary and a newline never becomes <unk>.
        parts = splitter.split(line) if splitter is not None else [line]
        for part in parts:
            if algorithm == "wordpiece":
                counter.update(pretok.split_bert(pretok.bert_normalize(part, lowercase)))
            elif algorithm == "unigram":
                if part:
                    counter.update(pretok.split_metaspace(part.lower() if lowercase else part))
            else:
                raise BadInput(f"unknown algorithm '{algorithm}'. Choose one of: {', '.join(ALGORITHMS)}.")
        counter.line_done()
    return counter.result()


def train(
    lines: Iterable[str],
    algorithm: str,
    vocab_size: int,
    min_frequency: int = 0,
    special_tokens: Iterable[str] | None = None,
    lowercase: bool = False,
    progress: Progress | None = None,
    trace: Trace | None = None,
    work_bytes: int = 0,
    max_memory: int | None = None,
    pruned: Callable[[Pruning], None] | None = None,
    limit_alphabet: int | None = None,
) -> Tokenizer:
    """Train a tokenizer of `algorithm` on text lines (`work_bytes`: their size, when known), the
    distinct words held within `max_memory` bytes (None: a share of the machine's memory; see
    `wordbound`); `pruned` is told what the bound dropped, if anything, once the words are counted.
    `limit_alphabet` (WordPiece): keep only that many of the most frequent characters."""
    if algorithm not in ALGORITHMS:
        raise BadInput(f"unknown algorithm '{algorithm}'. Choose one of: {', '.join(ALGORITHMS)}.")
    if vocab_size < 1:
        raise OptionError("vocab size must be positive, got {value}. Pass {vocab_size} N with N > 0.", value=vocab_size)
    check_limit_alphabet(algorithm, limit_alphabet)
    specials = list(DEFAULT_SPECIALS[algorithm] if special_tokens is None else special_tokens)
    seen_text = False

    def watched(src):
        nonlocal seen_text
        for line in src:
            if not seen_text and line.strip():
                seen_text = True
            yield line

    bound = Bound(algorithm, max_memory)
    if algorithm != "unigram" and trace is None and not lowercase and _compiled_counting_serves(specials):
        done = _train_compiled(algorithm, watched(lines), vocab_size, min_frequency, specials, progress, work_bytes,
                               bound, lambda: seen_text, pruned, limit_alphabet)
        if done is not None:
            return done
    counts = count_words(watched(lines), algorithm, specials, lowercase, work_bytes, bound)
    if not counts or not seen_text:
        raise BadInput(EMPTY)
    if pruned is not None:
        pruned(bound.report)
    return _train_counted(counts, algorithm, vocab_size, min_frequency, specials, lowercase, progress, trace,
                          work_bytes, limit_alphabet)


def check_limit_alphabet(algorithm: str, limit_alphabet: int | None) -> None:
    """Refuse `limit_alphabet` where it means nothing: byte-level BPE keeps its 256 byte symbols and
    Unigram keeps every character (HF's UnigramTrainer has no such option)."""
    if limit_alphabet is None:
        return
    if algorithm != "wordpiece":
        raise OptionError("{limit_alphabet} applies to WordPiece only ({algo} keeps its whole alphabet). "
                          "Drop {limit_alphabet} or train WordPiece.", algo=algorithm)
    if limit_alphabet < 1:
        raise OptionError("limit alphabet must be positive, got {value}. Pass {limit_alphabet} N with N > 0.",
                          value=limit_alphabet)


def _train_counted(counts, algorithm: str, vocab_size: int, min_frequency: int, specials: list[str], lowercase: bool,
                   progress: Progress | None, trace: Trace | None, work_bytes: int,
                   limit_alphabet: int | None = None) -> Tokenizer:
    """The tokenizer `algorithm` learns from counted words (the Python trainers)."""
    if algorithm == "bpe":
        # all 256 byte symbols are in the vocabulary, so any text encodes (HF: ByteLevel.alphabet())
        r = train_bpe(counts, vocab_size, min_frequency=min_frequency, special_tokens=specials,
                      initial_alphabet=pretok.bytes_to_unicode().values(), progress=progress, trace=trace)
        vocab = {t: i for i, t in enumerate(r.vocab)}
        model = BPE(vocab, r.merges, byte_level=True)
        added = [AddedToken(s, vocab[s]) for s in r.special_tokens]
    elif algorithm == "wordpiece":
        unk, specials = _wordpiece_unk(specials)
        r = train_wordpiece(counts, vocab_size, min_frequency=min_frequency, special_tokens=specials,
                            progress=progress, trace=trace, work_bytes=work_bytes, limit_alphabet=limit_alphabet)
        vocab = {t: i for i, t in enumerate(r.vocab)}
        model = WordPiece(vocab, unk_token=unk, lowercase=lowercase)
        added = [AddedToken(s, vocab[s]) for s in r.special_tokens]
    else:
        unk = "<unk>" if "<unk>" in specials else (specials[0] if specials else "<unk>")
        r = train_unigram(counts, vocab_size, special_tokens=specials, unk_token=unk, min_frequency=min_frequency,
                          progress=progress, trace=trace)
        model = Unigram(r.pieces, r.unk_id)
        added = [AddedToken(s, i) for i, s in enumerate(r.special_tokens)]
    return Tokenizer(model, added)


EMPTY = "the corpus is empty (no words after pre-tokenization). Pass a non-empty text corpus."


def _wordpiece_unk(specials: list[str]) -> tuple[str, list[str]]:
    """The unknown token and the specials with it (first when it had to be added)."""
    unk = "[UNK]" if "[UNK]" in specials else (specials[0] if specials else "[UNK]")
    return unk, (specials if unk in specials else [unk] + specials)


def _train_compiled(algorithm, lines, vocab_size, min_frequency, specials, progress, work_bytes, bound, seen_text,
                    pruned, limit_alphabet=None) -> Tokenizer | None:
    """BPE or WordPiece from the compiled counter's table straight into the compiled merge loop (no
    Python object per distinct word), or None when the kernels are not available."""
    from llmkit.tokenize.bpe import bpe_train_native
    from llmkit.tokenize.wordpiece import wordpiece_native
    from llmkit.tokenize.training.counting import count_table

    table = count_table(lines, algorithm, _splitter(specials), work_bytes, bound)
    if table is None:
        return None
    if not table.st[0] or not seen_text():
        raise BadInput(EMPTY)
    if pruned is not None:
        pruned(bound.report)
    if algorithm == "wordpiece":
        unk, specials = _wordpiece_unk(specials)
        vocab, words = wordpiece_native.words_from_table(table, list(dict.fromkeys(specials)), "##", limit_alphabet)
        del table
        check_vocab_size(vocab_size, len(vocab), alphabet=True)
        tokens = wordpiece_native.train_words(vocab, words, vocab_size, "##", min_frequency, progress, work_bytes)
        ids = {t: i for i, t in enumerate(tokens)}
        return Tokenizer(WordPiece(ids, unk_token=unk), [AddedToken(s, ids[s]) for s in dict.fromkeys(specials)])
    vocab = Vocab(dict.fromkeys(specials))
    byte_char = pretok.bytes_to_unicode()
    for ch in sorted(byte_char.values(), key=ord):  # the whole byte alphabet, as HF's ByteLevel.alphabet()
        vocab.add(ch)
    check_vocab_size(vocab_size, len(vocab))
    words = bpe_train_native.words_from_table(table, [vocab.ids[byte_char[b]] for b in range(256)])
    del table
    tokens, merges = bpe_train_native.train(vocab, words, vocab_size, min_frequency, progress, work_bytes)
    ids = {t: i for i, t in enumerate(tokens)}
    model = BPE(ids, [(tokens[a], tokens[b]) for a, b in merges], byte_level=True)
    return Tokenizer(model, [AddedToken(s, ids[s]) for s in dict.fromkeys(specials)])


def step_text(algo: str, s: dict) -> str:
    """One line for a person from a training step's trace record (`train`'s `trace`)."""
    if algo == "bpe":
        top = ", ".join(f"({a},{b})={n}" for a, b, n in s["top_pairs"])
        return f"step {s['step']}: merge ({s['merge'][0]}, {s['merge'][1]}) count={s['count']}  top: {top}"
    if algo == "wordpiece":
        top = ", ".join(f"({a},{b})={sc:.6g}" for a, b, sc in s["top_scores"])
        return f"step {s['step']}: merge ({s['merge'][0]}, {s['merge'][1]}) score={s['score']:.6g}  top: {top}"
    return (f"round {s['step']}: loss={s['viterbi_loss']:.1f} em={s['em_loss']:.4f} vocab={s['vocab']} "
            f"removed={s['removed']} e.g. {', '.join(s['removed_sample'])}")


def input_bytes(paths: Iterable[str]) -> int:
    """Bytes in the training files (unreadable ones count 0): what decides whether compiling the
    kernels pays (`train`'s `work_bytes`)."""
    import os

    total = 0
    for p in paths:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    return total
