"""A memory bound on training: the distinct words a trainer may hold, and pruning rare words when
the count table outgrows it (lossy counting, as SentencePiece and HF bound their inputs).

Training memory follows the distinct words, not the bytes read: each trainer's structures cost
about `per_word` bytes per distinct word plus `per_byte` per byte of them, and Unigram `per_position`
per substring of at most MAX_PIECE characters of each word (its seed counts them all and its lattice
has an edge for each one kept), which grows faster than the bytes for long words such as code's
identifiers (`COST`, from peak RSS on prose and code, docs/design/tokenizers.md). While counting, when
the estimate for the words held passes the bound, every word whose count is at most t is dropped, with
the smallest t that brings the estimate under `REFILL` of the bound; a dropped word seen again starts
from zero.

The error is stated, not guessed: with E the sum of the thresholds used, every kept count is exact
or at most E too low, and a word that is missing occurred at most E times. A corpus that fits is
counted exactly, so training on it is unchanged (BPE's merges stay HF's).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict, dataclass

from llmkit.errors import OptionError

# bytes per distinct word, per byte of the distinct words and per substring position, by what trains on them
COST = {"bpe": (100, 20, 0), "wordpiece": (120, 30, 0), "unigram": (700, 0, 40)}
MAX_PIECE = 16  # Unigram's longest piece: a word's substrings of up to this many characters are its positions
BASE_BYTES = 100 << 20  # the interpreter, the libraries, the kernels and the blocks being read
REFILL = 0.6  # a prune leaves the words at most this share of the bound
AUTO_SHARE = 0.75  # without --max-memory: this share of the machine's memory


@dataclass
class Pruning:
    """What a bounded count dropped (nothing when `prunes` is 0)."""

    max_memory: int  # the whole run's bound in bytes
    limit: int  # the part of it the distinct words may take (estimated)
    prunes: int = 0
    error_bound: int = 0  # E: each count is exact or at most this low; a missing word occurred at most this often
    words_dropped: int = 0  # distinct words dropped (a word dropped twice counts twice)
    occurrences_dropped: int = 0
    occurrences: int = 0  # word occurrences read in all
    words_kept: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """One line for a person."""
        if not self.prunes:
            return f"counted exactly: {self.words_kept} distinct words within --max-memory {_mb(self.max_memory)}"
        share = self.occurrences_dropped / max(1, self.occurrences)
        return (f"pruned rare words {self.prunes} time(s) to stay within --max-memory {_mb(self.max_memory)}: "
                f"{self.words_dropped} distinct words dropped ({self.occurrences_dropped} of {self.occurrences} "
                f"occurrences, {share:.2%}), {self.words_kept} kept; every count is exact or at most "
                f"{self.error_bound} low, and a dropped word occurred at most {self.error_bound} times")


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def machine_memory() -> int:
    """The machine's physical memory in bytes (0 when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class Bound:
    """The estimate of one trainer's memory for a set of distinct words, and when to prune."""

    def __init__(self, algorithm: str, max_memory: int | None = None):
        auto = max_memory is None
        if auto:
            total = machine_memory()
            max_memory = int(total * AUTO_SHARE) if total else 1 << 62
        self.per_word, self.per_byte, self.per_position = COST[algorithm]
        limit = max_memory - BASE_BYTES
        if limit < (8 << 20):
            if auto:
                limit = 8 << 20
            else:
                raise OptionError("--max-memory {size} leaves no room for the words: training needs about "
                                  "{need} MiB before it counts any. Pass {option} {need2}M or more.",
                                  size=_mb(max_memory), need=BASE_BYTES >> 20, option="--max-memory",
                                  need2=(BASE_BYTES >> 20) + 32)
        self.report = Pruning(max_memory=max_memory, limit=limit)

    def cost(self, words: int, nbytes: int) -> int:
        """The estimate from totals, for the trainers whose cost is linear in a word's length."""
        return self.per_word * words + self.per_byte * nbytes

    def over(self, words: int, nbytes: int) -> bool:
        return self.cost(words, nbytes) > self.report.limit

    def word_costs(self, lengths):
        """Each word's estimated bytes from its length (a numpy array: characters for Unigram, whose
        positions are characters, else bytes)."""
        import numpy as np

        c = self.per_word + self.per_byte * lengths
        if self.per_position:
            m = np.minimum(lengths, MAX_PIECE)
            c = c + self.per_position * (m * (lengths + 1) - m * (m + 1) / 2)
        return c

    def threshold(self, counts, costs) -> int:
        """The smallest t such that the words seen more than t times fit in REFILL of the limit
        (numpy arrays of the words' counts and estimated costs, `word_costs`)."""
        import numpy as np

        top = 1 << 16
        c = np.minimum(counts, top)
        c_at = np.bincount(c, weights=costs, minlength=top + 1)
        kept = costs.sum() - np.cumsum(c_at)  # the cost of the words with count > t, for each t
        fits = np.flatnonzero(kept <= REFILL * self.report.limit)
        fits = fits[fits >= 1]
        return int(fits[0]) if len(fits) else top

    def note(self, t: int, dropped: int, occurrences: int) -> None:
        r = self.report
        r.prunes += 1
        r.error_bound += t
        r.words_dropped += dropped
        r.occurrences_dropped += occurrences

    def finish(self, kept: int, occurrences_kept: int) -> Pruning:
        r = self.report
        r.words_kept = kept
        r.occurrences = occurrences_kept + r.occurrences_dropped
        return r


class BoundedCounter:
    """A Counter of words (the Python counting path) pruned under a Bound, checked every few lines."""

    CHECK_EVERY = 1 << 14  # lines between checks

    def __init__(self, bound: Bound | None):
        self.counts: Counter = Counter()
        self.bound = bound
        self._lines = 0
        self._avg = None  # average estimated bytes per word, recomputed at each exact check

    def update(self, words) -> None:
        self.counts.update(words)

    def line_done(self) -> None:
        self._lines += 1
        if self.bound is None or self._lines % self.CHECK_EVERY:
            return
        n = len(self.counts)
        if n * (self._avg or float(self.bound.word_costs(8.0))) <= self.bound.report.limit:
            return
        costs = self._costs(list(self.counts))
        self._avg = float(costs.sum()) / max(1, n)
        if costs.sum() > self.bound.report.limit:
            self.prune(costs)

    def _costs(self, words):
        import numpy as np

        if self.bound.per_position:  # Unigram's positions are characters
            lengths = np.fromiter((len(w) for w in words), dtype=np.float64, count=len(words))
        else:
            lengths = np.fromiter((len(w.encode("utf-8", "surrogatepass")) for w in words), dtype=np.float64,
                                  count=len(words))
        return self.bound.word_costs(lengths)

    def prune(self, costs=None) -> None:
        """Drop the words seen at most t times; `costs` are the words' estimates in the Counter's order
        when the caller has them."""
        import numpy as np

        words = list(self.counts)
        counts = np.fromiter(self.counts.values(), dtype=np.int64, count=len(words))
        t = self.bound.threshold(counts, self._costs(words) if costs is None else costs)
        drop = counts <= t
        self.bound.note(t, int(drop.sum()), int(counts[drop].sum()))
        self.counts = Counter({w: int(c) for w, c, d in zip(words, counts.tolist(), drop.tolist()) if not d})

    def result(self) -> Counter:
        if self.bound is not None:
            costs = self._costs(list(self.counts)) if self.counts else None
            if costs is not None and costs.sum() > self.bound.report.limit:
                self.prune(costs)
            self.bound.finish(len(self.counts), sum(self.counts.values()))
        return self.counts
