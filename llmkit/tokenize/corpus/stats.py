"""Corpus statistics for one tokenizer: fertility, compression and unknown rate."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field

BATCH_CHARS = 1 << 20


def _ratio(a: int, b: int) -> float:
    return a / b if b else 0.0


@dataclass
class TokenStats:
    tokenizer: str
    algorithm: str
    vocab_size: int
    tokens: int
    words: int
    chars: int
    bytes: int
    unknown: int
    lines: int = field(default=0)

    tokens_per_word = property(lambda s: _ratio(s.tokens, s.words))
    tokens_per_char = property(lambda s: _ratio(s.tokens, s.chars))
    bytes_per_token = property(lambda s: _ratio(s.bytes, s.tokens))
    unknown_rate = property(lambda s: _ratio(s.unknown, s.tokens))

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_word=self.tokens_per_word, tokens_per_char=self.tokens_per_char,
                 bytes_per_token=self.bytes_per_token, unknown_rate=self.unknown_rate)
        return d


def unknown_ids(tok) -> set[int]:
    """Ids that mean 'unknown' for this tokenizer (empty for byte-level BPE)."""
    ids = set()
    m = getattr(tok.model, "inner", tok.model)
    t = getattr(m, "unk_token", None)
    if t is not None and t in m.vocab:
        ids.add(m.vocab[t])
    uid = getattr(m, "unk_id", None)
    if uid is not None:
        ids.add(uid)
    return ids


def batches(paths: Iterable[str], chars: int = BATCH_CHARS) -> Iterator[list[str]]:
    """The corpus lines (endings kept) in batches of about `chars` characters, file by file."""
    from llmkit.io import read_text, split_lines

    for path in paths:
        lines = split_lines(read_text(path))
        start = size = 0
        for i, line in enumerate(lines):
            size += len(line)
            if size >= chars:
                yield lines[start:i + 1]
                start, size = i + 1, 0
        if start < len(lines):
            yield lines[start:]


def _batch_stats(tok, unk: set[int], lines: list[str]) -> tuple[int, int, int, int, int, int]:
    from llmkit.tokenize.corpus.stream import count_tokens

    tokens, ids = count_tokens(tok, lines)
    unknown = sum(1 for x in ids for i in x if i in unk) if (unk and ids is not None) else 0
    return (tokens, sum(len(x.split()) for x in lines), sum(map(len, lines)),
            sum(len(x.encode("utf-8", "surrogatepass")) for x in lines), unknown, len(lines))


def corpus_stats(name: str, tok, paths: Iterable[str], threads: int = 1) -> TokenStats:
    """Encode every line of the files and count tokens, words (whitespace-separated), characters,
    bytes and unknown tokens; batches of lines run on `threads` threads, one pass per file."""
    from llmkit.tokenize.corpus.stream import in_order

    unk = unknown_ids(tok)
    s = TokenStats(name, tok.algorithm, tok.vocab_size, 0, 0, 0, 0, 0)
    jobs = (lambda b=b: _batch_stats(tok, unk, b) for b in batches(paths))
    for tokens, words, chars, nbytes, unknown, n in in_order(jobs, threads):
        s.tokens += tokens
        s.words += words
        s.chars += chars
        s.bytes += nbytes
        s.unknown += unknown
        s.lines += n
    return s


def describe(tok, sample: int = 10) -> dict:
    """A summary of a tokenizer: algorithm, sizes, special tokens and a sample of merges/pieces."""
    m = getattr(tok.model, "inner", tok.model)
    d = {"algorithm": tok.algorithm, "source": tok.source, "vocab_size": tok.vocab_size,
         "special_tokens": tok.special_tokens}
    if hasattr(m, "merges"):
        d["merges"] = len(m.merges)
        d["first_merges"] = [list(x) for x in m.merges[:sample]]
        d["last_merges"] = [list(x) for x in m.merges[-sample:]] if m.merges else []
        d["byte_level"] = getattr(m, "byte_level", False)
    if hasattr(m, "pieces"):
        d["top_pieces"] = [[p, s] for p, s in m.pieces[:sample]]
    if tok.algorithm == "wordpiece":
        d["continuing_subword_prefix"] = m.prefix
        d["longest_tokens"] = sorted(m.vocab, key=len, reverse=True)[:sample]
    if tok.algorithm == "spm":
        d["top_pieces"] = sorted(([t, s] for t, s in zip(m.tokens, m.scores)), key=lambda x: -x[1])[:sample]
    return d


def stats_chart(rows: list[TokenStats]):
    """The chart of `tokenize stats --plot`: tokens per word of each tokenizer on the corpus."""
    from llmkit.plot import Panel, Series

    return [Panel(f"tokens per word ({rows[0].words:,} words)", "tokenizer", "tokens per word",
                  [Series("tokens per word", [r.tokenizer for r in rows], [r.tokens_per_word for r in rows],
                          style="bar", notes=[f"{r.tokens_per_word:.3f}" for r in rows])])]
