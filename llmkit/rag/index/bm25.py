"""BM25 (Okapi) over an inverted index in numpy arrays, scoring exactly like rank-bm25's BM25Okapi.

rank-bm25 scans every document for every query term; here each term's postings (doc ids and term
frequencies) are stored contiguously (CSR), so a query touches only the documents that contain
its terms. Scores follow BM25Okapi: idf(t) = log((N - df + 0.5) / (df + 0.5)), negative idfs
replaced by epsilon x the mean idf, and tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl)).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass

import numpy as np
import regex

from llmkit.errors import BadFileFormat, BadInput

FORMAT = {"format": "llmkit-bm25", "version": 1}
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


@dataclass
class BM25Index:
    vocab: dict[str, int]
    indptr: np.ndarray  # term t's postings are [indptr[t], indptr[t+1])
    docs: np.ndarray  # int32 document ids
    tfs: np.ndarray  # float64 term frequencies
    doc_len: np.ndarray  # float64
    idf: np.ndarray  # float64 per term
    k1: float = 1.5
    b: float = 0.75
    epsilon: float = 0.25
    _norm: np.ndarray | None = None  # per-document length normalisation, computed once

    @property
    def n_docs(self) -> int:
        return len(self.doc_len)

    @classmethod
    def build(cls, corpus: list[list[str]], k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25) -> "BM25Index":
        """Index tokenized documents."""
        if not corpus:
            raise BadInput("cannot build a BM25 index of zero documents.")
        vocab: dict[str, int] = {}
        rows, cols, vals = [], [], []
        for d, toks in enumerate(corpus):
            for term, tf in Counter(toks).items():
                t = vocab.setdefault(term, len(vocab))
                rows.append(t)
                cols.append(d)
                vals.append(tf)
        rows_a = np.asarray(rows, dtype=np.int64)
        order = np.argsort(rows_a, kind="stable")  # by term, documents ascending within a term
        counts = np.bincount(rows_a, minlength=len(vocab))
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        docs = np.asarray(cols, dtype=np.int32)[order]
        tfs = np.asarray(vals, dtype=np.float64)[order]
        doc_len = np.array([len(toks) for toks in corpus], dtype=np.float64)
        n = len(corpus)
        # rank-bm25: idf = log(N - df + 0.5) - log(df + 0.5); negatives -> epsilon * mean idf
        df = counts.astype(np.float64)
        idf = np.log(n - df + 0.5) - np.log(df + 0.5)
        eps = epsilon * (idf.sum() / len(idf)) if len(idf) else 0.0
        idf = np.where(idf < 0, eps, idf)
        return cls(vocab, indptr, docs, tfs, doc_len, idf, k1, b, epsilon)

    def length_norm(self, doc_len):
        """k1 (1 - b + b |d| / avgdl) for a document length (or an array of them)."""
        return self.k1 * (1 - self.b + self.b * doc_len / self.doc_len.mean())

    def term_score(self, w, tf, norm):
        """One term's contribution: w tf (k1 + 1) / (tf + norm), w its (weighted) idf."""
        return w * (tf * (self.k1 + 1) / (tf + norm))

    def scores(self, query: list[str], weights: list[float] | None = None) -> np.ndarray:
        """BM25 score of every document for the query tokens (repeated tokens count again);
        `weights` scale each token's contribution (query expansion adds terms at lower weight)."""
        out = np.zeros(self.n_docs)
        if self._norm is None:
            self._norm = self.length_norm(self.doc_len)
        norm = self._norm
        for i, term in enumerate(query):
            t = self.vocab.get(term)
            if t is None:
                continue
            lo, hi = self.indptr[t], self.indptr[t + 1]
            d = self.docs[lo:hi]
            tf = self.tfs[lo:hi]
            w = self.idf[t] if weights is None else self.idf[t] * weights[i]
            out[d] += self.term_score(w, tf, norm[d])
        return out

    def score_text(self, doc_tokens: list[str], query: list[str], weights=None) -> tuple[float, bool]:
        """(BM25 score, matches a term) of a document outside the index, with the index's statistics:
        what `scores` would give it in place of one of its documents (the tuner scores a chunk without
        its query sentence this way)."""
        tf = Counter(doc_tokens)
        norm = self.length_norm(len(doc_tokens))
        s, hit = 0.0, False
        for i, term in enumerate(query):
            t = self.vocab.get(term)
            f = tf.get(term, 0)
            if t is None or f == 0:
                continue
            w = self.idf[t] if weights is None else self.idf[t] * weights[i]
            if weights is None or weights[i] != 0:
                hit = True
            s += self.term_score(w, f, norm)
        return float(s), hit

    def top_k(self, query: list[str], k: int = 10, allowed: np.ndarray | None = None,
              weights: list[float] | None = None) -> list[tuple[int, float]]:
        """The k best (doc, score) pairs among documents containing a query term, ties broken by
        lower document id; `allowed` masks documents (a metadata filter applied inside retrieval,
        before truncation). In a tiny corpus every idf can be negative (rank-bm25's formula), so
        matching documents are ranked by score whatever its sign rather than dropped."""
        s = self.scores(query, weights)
        matched = np.zeros(self.n_docs, bool)
        for term in set(query):
            matched[self.postings(term)] = True
        if weights is not None:  # a term with weight 0 does not make a match
            for term, w in zip(query, weights):
                if w == 0:
                    matched[self.postings(term)] = False
        if allowed is not None:
            matched &= allowed
        s = np.where(matched, s, -np.inf)
        k = min(k, int(matched.sum()))
        if k <= 0:
            return []
        if k < len(s):
            kth = s[np.argpartition(-s, k - 1)[:k]].min()
            # every document tied with the k-th score competes, so ties resolve by id, not by chance
            cand = np.flatnonzero(s >= kth)
        else:
            cand = np.flatnonzero(matched)
        cand = cand[np.lexsort((cand, -s[cand]))][:k]
        return [(int(d), float(s[d])) for d in cand]

    def postings(self, term: str) -> np.ndarray:
        """Ids of the documents containing `term`."""
        t = self.vocab.get(term)
        return np.zeros(0, np.int32) if t is None else np.asarray(self.docs[self.indptr[t]:self.indptr[t + 1]])

    def save(self, directory: str) -> None:
        """Arrays as .npy (memory-mappable), the vocabulary and parameters as JSON."""
        os.makedirs(directory, exist_ok=True)
        for name in ("indptr", "docs", "tfs", "doc_len", "idf"):
            np.save(os.path.join(directory, f"{name}.npy"), getattr(self, name))
        from llmkit.io import atomic_write_text

        atomic_write_text(os.path.join(directory, "vocab.json"), json.dumps(self.vocab, ensure_ascii=False))
        atomic_write_text(os.path.join(directory, "params.json"),
                          json.dumps({**FORMAT, "k1": self.k1, "b": self.b, "epsilon": self.epsilon}))

    @classmethod
    def load(cls, directory: str, mmap: bool = True) -> "BM25Index":
        try:
            params = json.loads(open(os.path.join(directory, "params.json"), encoding="utf-8").read())
            if params.get("format") != FORMAT["format"]:
                raise BadFileFormat(f"'{directory}' is not an llmkit BM25 index.")
            if params.get("version", 0) > FORMAT["version"]:
                raise BadFileFormat(f"'{directory}' has BM25 index format {params['version']}; upgrade llmkit.")
            vocab = json.loads(open(os.path.join(directory, "vocab.json"), encoding="utf-8").read())
            arrays = {n: np.load(os.path.join(directory, f"{n}.npy"), mmap_mode="r" if mmap else None)
                      for n in ("indptr", "docs", "tfs", "doc_len", "idf")}
        except (OSError, ValueError) as e:
            raise BadFileFormat(f"'{directory}' is not a readable BM25 index ({e}).") from None
        return cls(vocab, **arrays, k1=params["k1"], b=params["b"], epsilon=params["epsilon"])
