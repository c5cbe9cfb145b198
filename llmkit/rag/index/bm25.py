"""BM25 (Okapi) over an inverted index in numpy arrays, scoring exactly like rank-bm25's BM25Okapi.

rank-bm25 scans every document for every query term; here each term's postings (doc ids and term
frequencies) are stored contiguously (CSR), so a query touches only the documents that contain
its terms. Scores follow BM25Okapi: idf(t) = log((N - df + 0.5) / (df + 0.5)), negative idfs
replaced by epsilon x the mean idf, and tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl)).

On disk (format 2) an index is a directory of .npy arrays that a query memory-maps and never
parses whole: the vocabulary is a sorted term table (`terms.npy`: the terms' UTF-8 bytes end to
end, `term_offsets.npy`: where each starts) searched by bisection, term ids are positions in that
order, and `indptr`, `docs`, `tfs`, `idf`, `doc_len` are indexed by them; `params.json` holds the
format, k1, b, epsilon and the mean document length. Opening costs the same at any size, and a
query reads its terms' table entries and postings. Format 1 (a `vocab.json` mapping) is still read.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass

import numpy as np
import regex

from llmkit.errors import BadFileFormat, BadInput

FORMAT = {"format": "llmkit-bm25", "version": 2}
_WORD = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]+|[\p{L}\p{N}_]+(?:['’][\p{L}]+)?")
_CJK = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]")


_WORD_ID = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]+"
                         r"|[\p{L}_][\p{L}\p{N}_]*(?:\.[\p{L}_][\p{L}\p{N}_]*)+"  # dotted.names
                         r"|[\p{L}\p{N}_]+(?:['’][\p{L}]+)?")
_ID_SEP = regex.compile(r"[._]+")
_ID_PART = regex.compile(r"\p{Lu}+(?=\p{Lu}\p{Ll})|\p{Lu}?\p{Ll}+\p{N}*|\p{Lu}+\p{N}*|\p{N}+\p{L}*")


def identifier_parts(word: str) -> list[str]:
    """The parts of a snake_case, camelCase or dotted.name identifier (one part for a plain word).

    >>> identifier_parts("parse_config"), identifier_parts("parseHTTPConfig2"), identifier_parts("os.path")
    (['parse', 'config'], ['parse', 'HTTP', 'Config2'], ['os', 'path'])
    """
    return [p for piece in _ID_SEP.split(word) if piece for p in _ID_PART.findall(piece)]


def tokenize(text: str, stem: bool = False, idents: bool = False) -> list[str]:
    """Lower-cased words (Porter-stemmed with `stem`); CJK runs become overlapping character
    bigrams (single characters alone). With `idents`, an identifier (snake_case, camelCase,
    dotted.name) gives the whole identifier and then its parts, so `parse_config`, `parseConfig` and
    "parse config" all match it.

    >>> tokenize("Hello, World! 台灣大學 is")
    ['hello', 'world', '台灣', '灣大', '大學', 'is']
    >>> tokenize("call parseConfig() or os.path", idents=True)
    ['call', 'parseconfig', 'parse', 'config', 'or', 'os.path', 'os', 'path']
    """
    porter = None
    if stem:
        from llmkit.rag.index.stem import stem as porter
    out: list[str] = []
    for m in (_WORD_ID if idents else _WORD).finditer(text):
        w = m.group()
        if _CJK.match(w):
            if len(w) == 1:
                out.append(w)
            else:
                out.extend(w[i:i + 2] for i in range(len(w) - 1))
            continue
        parts = identifier_parts(w) if idents else []
        if len(parts) > 1 or (parts and parts[0] != w):  # also `_private`, `__init__`
            out.append(w.lower())
            out.extend(porter(p.lower()) if porter else p.lower() for p in parts)
        else:
            out.append(porter(w.lower()) if porter else w.lower())
    return out


class TermTable:
    """A vocabulary read in place: the terms sorted by their UTF-8 bytes, end to end in `data`, term
    i at data[offsets[i]:offsets[i+1]]; a lookup bisects it, reading about log2(n) terms.

    >>> t = TermTable.of(["apple", "pear", "fig"])
    >>> t.get("fig"), t.get("kiwi"), len(t), t.term(2)
    (1, None, 3, 'pear')
    """

    def __init__(self, data: np.ndarray, offsets: np.ndarray):
        self.data, self.offsets = data, offsets

    @classmethod
    def of(cls, terms) -> "TermTable":
        """The table of these terms (sorted here)."""
        raw = [t.encode("utf-8") for t in sorted(terms)]
        offsets = np.zeros(len(raw) + 1, np.int64)
        np.cumsum([len(b) for b in raw], out=offsets[1:])
        return cls(np.frombuffer(b"".join(raw), np.uint8), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _bytes(self, i: int) -> bytes:
        return self.data[int(self.offsets[i]):int(self.offsets[i + 1])].tobytes()

    def term(self, i: int) -> str:
        return self._bytes(i).decode("utf-8")

    def get(self, term: str, default=None):
        """The id of `term` (its position in byte order), or `default`."""
        key = term.encode("utf-8")
        lo, hi = 0, len(self)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._bytes(mid) < key:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < len(self) and self._bytes(lo) == key else default

    def __contains__(self, term: str) -> bool:
        return self.get(term) is not None


@dataclass
class BM25Index:
    vocab: "dict[str, int] | TermTable"  # term -> id (built: a dict; loaded: the mapped table)
    indptr: np.ndarray  # term t's postings are [indptr[t], indptr[t+1])
    docs: np.ndarray  # int32 document ids
    tfs: np.ndarray  # term frequencies (int32; float64 in format 1)
    doc_len: np.ndarray  # terms per document
    idf: np.ndarray  # float64 per term
    k1: float = 1.5
    b: float = 0.75
    epsilon: float = 0.25
    avgdl: float | None = None  # mean document length (stored, so opening reads no per-document array)

    def __post_init__(self):
        if self.avgdl is None:
            self.avgdl = float(np.asarray(self.doc_len, np.float64).mean()) if len(self.doc_len) else 0.0

    @property
    def n_docs(self) -> int:
        return len(self.doc_len)

    @classmethod
    def build(cls, corpus, k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25) -> "BM25Index":
        """Index tokenized documents (any iterable of token lists; term ids in sorted term order)."""
        from array import array

        vocab: dict[str, int] = {}
        rows, cols, vals, lens = array("q"), array("i"), array("i"), array("i")  # compact, not Python ints
        for d, toks in enumerate(corpus):
            lens.append(len(toks))
            for term, tf in Counter(toks).items():
                rows.append(vocab.setdefault(term, len(vocab)))
                cols.append(d)
                vals.append(tf)
        if not lens:
            raise BadInput("cannot build a BM25 index of zero documents.")
        terms = sorted(vocab)  # ids follow byte order, the order of the stored term table
        new_id = np.empty(len(terms), np.int64)
        new_id[[vocab[t] for t in terms]] = np.arange(len(terms))
        rows_a = new_id[np.frombuffer(rows, np.int64)] if len(rows) else np.zeros(0, np.int64)
        order = np.argsort(rows_a, kind="stable")  # by term, documents ascending within a term
        counts = np.bincount(rows_a, minlength=len(terms))
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        docs = np.frombuffer(cols, np.int32)[order]
        tfs = np.frombuffer(vals, np.int32)[order]
        doc_len = np.frombuffer(lens, np.int32).copy()
        n = len(doc_len)
        # rank-bm25: idf = log(N - df + 0.5) - log(df + 0.5); negatives -> epsilon * mean idf
        df = counts.astype(np.float64)
        idf = np.log(n - df + 0.5) - np.log(df + 0.5)
        eps = epsilon * (idf.sum() / len(idf)) if len(idf) else 0.0
        idf = np.where(idf < 0, eps, idf)
        return cls({t: i for i, t in enumerate(terms)}, indptr, docs, tfs, doc_len, idf, k1, b, epsilon)

    def length_norm(self, doc_len):
        """k1 (1 - b + b |d| / avgdl) for a document length (or an array of them)."""
        return self.k1 * (1 - self.b + self.b * doc_len / self.avgdl)

    def term_score(self, w, tf, norm):
        """One term's contribution: w tf (k1 + 1) / (tf + norm), w its (weighted) idf."""
        return w * (tf * (self.k1 + 1) / (tf + norm))

    def _term_ids(self, query: list[str]) -> list[int | None]:
        return [self.vocab.get(term) for term in query]

    def _postings(self, t: int) -> np.ndarray:
        return np.asarray(self.docs[int(self.indptr[t]):int(self.indptr[t + 1])])

    def _add_scores(self, out: np.ndarray, at, ids, weights) -> None:
        """Add each query term's contribution to `out` (its postings' slots given by `at`)."""
        for i, t in enumerate(ids):
            if t is None:
                continue
            lo, hi = int(self.indptr[t]), int(self.indptr[t + 1])
            d = np.asarray(self.docs[lo:hi])
            w = self.idf[t] if weights is None else self.idf[t] * weights[i]
            out[at(d)] += self.term_score(w, self.tfs[lo:hi], self.length_norm(self.doc_len[d]))

    def scores(self, query: list[str], weights: list[float] | None = None) -> np.ndarray:
        """BM25 score of every document for the query tokens (repeated tokens count again);
        `weights` scale each token's contribution (query expansion adds terms at lower weight)."""
        out = np.zeros(self.n_docs)
        self._add_scores(out, lambda d: d, self._term_ids(query), weights)
        return out

    def score_text(self, doc_tokens: list[str], query: list[str], weights=None) -> tuple[float, bool]:
        """(BM25 score, matches a term) of a document outside the index, with the index's statistics:
        what `scores` would give it in place of one of its documents (the tuner scores a chunk without
        its query sentence this way)."""
        tf = Counter(doc_tokens)
        norm = self.length_norm(len(doc_tokens))
        s, hit = 0.0, False
        for i, term in enumerate(query):
            f = tf.get(term, 0)
            idf = self.term_idf(term) if f else None
            if idf is None:
                continue
            w = idf if weights is None else idf * weights[i]
            if weights is None or weights[i] != 0:
                hit = True
            s += self.term_score(w, f, norm)
        return float(s), hit

    def doc_freq(self, term: str) -> int:
        """How many documents contain `term`."""
        t = self.vocab.get(term)
        return 0 if t is None else int(self.indptr[t + 1] - self.indptr[t])

    def term_idf(self, term: str) -> float | None:
        """The idf `term` scores with (None: no document has it)."""
        t = self.vocab.get(term)
        return None if t is None else float(self.idf[t])

    def top_k(self, query: list[str], k: int = 10, allowed: np.ndarray | None = None,
              weights: list[float] | None = None) -> list[tuple[int, float]]:
        """The k best (doc, score) pairs among documents containing a query term, ties broken by
        lower document id; `allowed` masks documents (a metadata filter applied inside retrieval,
        before truncation). In a tiny corpus every idf can be negative (rank-bm25's formula), so
        matching documents are ranked by score whatever its sign rather than dropped. Only the
        documents in the query terms' postings are scored (the same sums `scores` makes)."""
        ids = self._term_ids(query)
        present = sorted({t for t in ids if t is not None})
        if not present or k <= 0:
            return []
        cand = np.unique(np.concatenate([self._postings(t) for t in present]))
        s = np.zeros(len(cand))
        self._add_scores(s, lambda d: np.searchsorted(cand, d), ids, weights)
        keep = np.ones(len(cand), bool)
        if weights is not None:  # a term with weight 0 does not make a match
            for t, w in zip(ids, weights):
                if w == 0 and t is not None:
                    keep[np.searchsorted(cand, self._postings(t))] = False
        if allowed is not None:
            keep &= np.asarray(allowed)[cand]
        cand, s = cand[keep], s[keep]
        top = np.lexsort((cand, -s))[:k]
        return [(int(d), float(x)) for d, x in zip(cand[top], s[top])]

    def postings(self, term: str) -> np.ndarray:
        """Ids of the documents containing `term`."""
        t = self.vocab.get(term)
        return np.zeros(0, np.int32) if t is None else self._postings(t)

    def _table(self) -> tuple[TermTable, "BM25Index"]:
        """(the term table, this index with term ids in its order): a built or a format-2 index is
        in that order already; a format-1 one is renumbered."""
        if isinstance(self.vocab, TermTable):
            return self.vocab, self
        terms = sorted(self.vocab)
        old = np.array([self.vocab[t] for t in terms], np.int64)
        if np.array_equal(old, np.arange(len(terms))):
            return TermTable.of(terms), self
        counts = np.diff(self.indptr)[old]
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        take = np.concatenate([np.arange(self.indptr[t], self.indptr[t + 1]) for t in old] or [np.zeros(0, np.int64)])
        again = BM25Index({t: i for i, t in enumerate(terms)}, indptr, np.asarray(self.docs)[take],
                          np.asarray(self.tfs)[take], self.doc_len, np.asarray(self.idf)[old], self.k1, self.b,
                          self.epsilon, self.avgdl)
        return TermTable.of(terms), again

    def save(self, directory: str) -> None:
        """Format 2: every array as .npy (memory-mappable), the term table among them, and
        params.json (module doc)."""
        os.makedirs(directory, exist_ok=True)
        table, ix = self._table()
        arrays = {"terms": np.asarray(table.data, np.uint8), "term_offsets": np.asarray(table.offsets, np.int64),
                  "indptr": np.asarray(ix.indptr, np.int64), "docs": np.asarray(ix.docs, np.int32),
                  "tfs": np.asarray(ix.tfs).astype(np.int32), "doc_len": np.asarray(ix.doc_len).astype(np.int32),
                  "idf": np.asarray(ix.idf, np.float64)}
        for name, a in arrays.items():
            np.save(os.path.join(directory, f"{name}.npy"), a)
        from llmkit.io import atomic_write_text

        atomic_write_text(os.path.join(directory, "params.json"),
                          json.dumps({**FORMAT, "k1": self.k1, "b": self.b, "epsilon": self.epsilon,
                                      "avgdl": self.avgdl, "terms": len(table), "docs": self.n_docs}))

    @classmethod
    def load(cls, directory: str, mmap: bool = True) -> "BM25Index":
        """Open a saved index: format 2 memory-maps every array (nothing is parsed whole); format 1
        reads its vocab.json."""
        mode = "r" if mmap else None

        def arr(name):
            return np.load(os.path.join(directory, f"{name}.npy"), mmap_mode=mode)

        try:
            with open(os.path.join(directory, "params.json"), encoding="utf-8") as f:
                params = json.loads(f.read())
            if params.get("format") != FORMAT["format"]:
                raise BadFileFormat(f"'{directory}' is not an llmkit BM25 index.")
            version = params.get("version", 0)
            if version > FORMAT["version"]:
                raise BadFileFormat(f"'{directory}' has BM25 index format {version}; upgrade llmkit.")
            if version >= 2:
                vocab = TermTable(arr("terms"), arr("term_offsets"))
            else:
                with open(os.path.join(directory, "vocab.json"), encoding="utf-8") as f:
                    vocab = json.loads(f.read())
            arrays = {n: arr(n) for n in ("indptr", "docs", "tfs", "doc_len", "idf")}
        except (OSError, ValueError, KeyError) as e:
            raise BadFileFormat(f"'{directory}' is not a readable BM25 index ({e}). Rebuild it with llmkit rag index.") from None
        return cls(vocab, **arrays, k1=params["k1"], b=params["b"], epsilon=params["epsilon"],
                   avgdl=params.get("avgdl"))
