"""Training entry point: corpus lines -> word counts -> one of the three trainers -> Tokenizer."""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import regex

from llmkit.errors import BadInput, OptionError
from llmkit.tokenize import pretok
from llmkit.tokenize.bpe import BPE, train_bpe
from llmkit.tokenize.pieces import Progress, Trace
from llmkit.tokenize.tokenizer import AddedToken, Tokenizer
from llmkit.tokenize.unigram import Unigram
from llmkit.tokenize.unigram_train import train_unigram
from llmkit.tokenize.wordpiece import WordPiece, train_wordpiece

ALGORITHMS = ("bpe", "wordpiece", "unigram")
DEFAULT_SPECIALS = {"bpe": [], "wordpiece": ["[UNK]"], "unigram": ["<unk>"]}


def count_words(lines: Iterable[str], algorithm: str, special_tokens: Iterable[str] = (), lowercase: bool = False,
                work_bytes: int = 0) -> Counter:
    """Pre-tokenize every line the way the algorithm's tokenizer will, and count the words (in the
    order they first appear); the compiled kernels do it when they serve the algorithm (see
    `counting`; `work_bytes` decides whether compiling them pays).

    >>> dict(count_words(["the cat the"], "bpe"))
    {'the': 1, 'Ġcat': 1, 'Ġthe': 1}
    """
    from llmkit.tokenize.counting import count_compiled

    specials = [s for s in special_tokens if s]
    splitter = regex.compile("|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True))) if specials else None
    if algorithm not in ALGORITHMS:
        raise BadInput(f"unknown algorithm '{algorithm}'. Choose one of: {', '.join(ALGORITHMS)}.")
    if not any("\n" in s for s in specials):
        counted = count_compiled(lines, algorithm, splitter, lowercase, work_bytes)
        if counted is not None:
            return counted
    return count_words_python(lines, algorithm, splitter, lowercase)


def count_words_python(lines: Iterable[str], algorithm: str, splitter, lowercase: bool) -> Counter:
    """count_words without the kernels, line by line."""
    raw: Counter = Counter()
    if algorithm == "bpe":
        findall = pretok.compile_pattern(pretok.GPT2_PATTERN).findall
        for line in lines:
            if splitter is not None:
                for part in splitter.split(line):
                    raw.update(findall(part))
            else:
                raw.update(findall(line))
        out: Counter = Counter()
        for w, c in raw.items():
            out[pretok.to_byte_symbols(w)] += c
        return out
    for line in lines:
        # WordPiece treats line ends as whitespace; Unigram keeps them as characters (as HF does when
        # training from files), so '\n' is in the vocabulary and a newline never becomes <unk>.
        parts = splitter.split(line) if splitter is not None else [line]
        for part in parts:
            if algorithm == "wordpiece":
                raw.update(pretok.split_bert(pretok.bert_normalize(part, lowercase)))
            elif algorithm == "unigram":
                if part:
                    raw.update(pretok.split_metaspace(part.lower() if lowercase else part))
            else:
                raise BadInput(f"unknown algorithm '{algorithm}'. Choose one of: {', '.join(ALGORITHMS)}.")
    return raw


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
) -> Tokenizer:
    """Train a tokenizer of `algorithm` on text lines (`work_bytes`: their size, when known)."""
    if algorithm not in ALGORITHMS:
        raise BadInput(f"unknown algorithm '{algorithm}'. Choose one of: {', '.join(ALGORITHMS)}.")
    if vocab_size < 1:
        raise OptionError("vocab size must be positive, got {value}. Pass {vocab_size} N with N > 0.", value=vocab_size)
    specials = list(DEFAULT_SPECIALS[algorithm] if special_tokens is None else special_tokens)
    seen_text = False

    def watched(src):
        nonlocal seen_text
        for line in src:
            if not seen_text and line.strip():
                seen_text = True
            yield line

    counts = count_words(watched(lines), algorithm, specials, lowercase, work_bytes)
    if not counts or not seen_text:
        raise BadInput("the corpus is empty (no words after pre-tokenization). Pass a non-empty text corpus.")
    if algorithm == "bpe":
        # all 256 byte symbols are in the vocabulary, so any text encodes (HF: ByteLevel.alphabet())
        r = train_bpe(counts, vocab_size, min_frequency=min_frequency, special_tokens=specials,
                      initial_alphabet=pretok.bytes_to_unicode().values(), progress=progress, trace=trace)
        vocab = {t: i for i, t in enumerate(r.vocab)}
        model = BPE(vocab, r.merges, byte_level=True)
        added = [AddedToken(s, vocab[s]) for s in r.special_tokens]
    elif algorithm == "wordpiece":
        unk = "[UNK]" if "[UNK]" in specials else (specials[0] if specials else "[UNK]")
        if unk not in specials:
            specials = [unk] + specials
        r = train_wordpiece(counts, vocab_size, min_frequency=min_frequency, special_tokens=specials,
                            progress=progress, trace=trace, work_bytes=work_bytes)
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
