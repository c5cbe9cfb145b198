"""Graph retrieval light enough for a laptop (the LazyGraphRAG / FastGraphRAG idea: noun phrases and
co-occurrence instead of LLM extraction).

Entities per chunk, without a language model: noun-phrase candidates (runs of words between stop
words and punctuation, as RAKE cuts them: their 2- and 3-word pieces), capitalised names,
identifiers (snake_case, camelCase, dotted.names) and CJK terms (character bigrams and trigrams).
Queries go through the same extraction. An entity must occur in at least 2 chunks (else it links
nothing) and in at most max(50, 5 %) of them (else it links everything). Optionally a local GGUF adds
the entities it lists per chunk (`rag index --graph-llm MODEL`).

Per generation the index keeps the chunk x entity matrix M and the co-occurrence matrix C = M^T M
(`gen-N/graph/`). A query's graph list scores every chunk as

    sum over query entities e in the chunk of idf(e)                       (one hop)
  + 1/2 sum over neighbours e' in the chunk of sum_e idf(e) P(e'|e) idf(e')  (two hops, through
                                                                           chunks sharing e)

so a chunk that never mentions the query's entity, but shares a rare entity with a chunk that does,
is reached. `communities()` groups the entity graph (Louvain, networkx) for global questions.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter

import numpy as np
import regex

STOP = frozenset("""a about above across after again against all almost also although am among an and another any
are around as at be because been before being below between both but by can cannot could did do does doing done
down during each either else etc even ever every few for from further had has have having he her here hers herself
him himself his how however i if in into is it its itself just least less like made make many may me might more
most much must my myself near neither no nor not now of off often on once one only onto or other others otherwise
our ours ourselves out over own per perhaps rather same several shall she should since so some such than that the
their theirs them themselves then there therefore these they this those though through thus to too toward towards
under unless until up upon us use used uses using very via was we well were what whatever when where whereas whether
which while who whom whose why will with within without would yet you your yours yourself yourselves two three four
five first second third new given obtained shown show shows based found results result paper presented present
due different various order respect terms part type kind way cases case""".split())
VERBS = frozenset("""determine determines include includes describe describes indicate indicates predict predicts
calculate calculates compare compares increase increases decrease decreases possible consider considers require
requires provide provides appear appears obtain obtains assume assumes measure measures discuss discusses
investigate investigates develop develops suggest suggests""".split())
_TOKEN = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]+"
                       r"|[\p{L}_][\p{L}\p{N}_]*(?:[.\-'][\p{L}\p{N}_]+)*"
                       r"|\p{N}+(?:[.,]\p{N}+)*|[^\s\p{L}\p{N}]")
_CJK = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]")
_IDENT = regex.compile(r".*(_|\p{Ll}\p{Lu}|\.\p{L}).*")
MAX_NEIGHBOURS = 64


def entities(text: str) -> Counter:
    """Entity candidates of a text with their counts.

    >>> sorted(entities("The boundary layer on a flat plate. Ludwig Prandtl used parse_config."))
    ['boundary layer', 'flat plate', 'ludwig prandtl', 'parse_config']
    """
    out: Counter = Counter()
    run: list[str] = []
    sentence_start = True

    def flush():
        if not run:
            return
        words = [w.lower() for w in run]
        caps = [w for w in run if w[:1].isupper()]
        if len(caps) == len(run) and (len(run) > 1 or not first_in_sentence):
            out[" ".join(words)] += 1  # a capitalised name (not just a sentence's first word)
        elif len(run) == 1:
            # a lone long word is a term ('slipstream'); short ones are too common, and -ed/-ing/-ly
            # words are verbs and adverbs far more often than names of things
            if len(words[0]) >= 6 and not words[0].endswith(("ed", "ing", "ly")) and words[0] not in VERBS:
                out[words[0]] += 1
        elif len(run) <= 3:
            out[" ".join(words)] += 1
        else:
            for n in (2, 3):
                for i in range(len(words) - n + 1):
                    out[" ".join(words[i:i + n])] += 1
        run.clear()

    first_in_sentence = True
    for m in _TOKEN.finditer(text):
        w = m.group()
        if _CJK.match(w):
            flush()
            for n in (2, 3):
                for i in range(len(w) - n + 1):
                    out[w[i:i + n]] += 1
            sentence_start = False
            continue
        if not w[0].isalpha() and w[0] != "_":
            flush()
            if w in ".!?。！？":
                sentence_start = True
            continue
        if _IDENT.fullmatch(w) and len(w) > 3:
            flush()
            out[w.lower()] += 1
            sentence_start = False
            continue
        if w.lower() in STOP or len(w) < 2:
            flush()
            sentence_start = False
            continue
        if not run:
            first_in_sentence = sentence_start
        run.append(w)
        sentence_start = False
    flush()
    return out


def entity_llm(path: str | None):
    """The local model at `path` that lists entities for the graph, loaded once per process, or None
    (no path)."""
    if not path:
        return None
    if path not in _ENTITY_LLMS:
        from llmkit.rag.llm import LocalLLM

        _ENTITY_LLMS[path] = LocalLLM(path)
    return _ENTITY_LLMS[path]


_ENTITY_LLMS: dict = {}


def llm_entities(llm, text: str) -> Counter:
    """Entities a local model lists for a text (one per line), normalised like the extractor's."""
    reply = llm.complete("List the named entities and key technical terms in this passage, one per line, "
                         f"without explanations.\n\nPassage: {text[:1500]}", 96)
    out: Counter = Counter()
    for line in reply.split("\n"):
        name = " ".join(regex.sub(r"^[\s\-*\d.)]+", "", line).split()).lower().strip(" .,:;")
        if 2 <= len(name) <= 60 and name not in STOP:
            out[name] += 1
    return out


def build(chunk_entities, n_rows: int, gdir: str) -> dict:
    """Write gen-N/graph/ from (row, entity, tf) triples: the kept entities, M (rows x entities) and
    C = M^T M as sparse matrices. Returns counts for the report."""
    import scipy.sparse as sp

    from llmkit.io import atomic_write_text

    df: Counter = Counter()
    triples = []
    for row, ent, tf in chunk_entities:
        triples.append((row, ent, tf))
        df[ent] += 1
    max_df = max(50, int(0.05 * n_rows))
    vocab = sorted(e for e, d in df.items() if 2 <= d <= max_df)
    at = {e: i for i, e in enumerate(vocab)}
    r = [row for row, e, _ in triples if e in at]
    c = [at[e] for _, e, _ in triples if e in at]
    m = sp.csr_matrix((np.ones(len(r), np.float32), (r, c)), shape=(n_rows, len(vocab)))
    m.sum_duplicates()
    m.data[:] = 1.0
    cooc = (m.T @ m).tocsr()
    os.makedirs(gdir, exist_ok=True)
    sp.save_npz(os.path.join(gdir, "m.npz"), m)
    sp.save_npz(os.path.join(gdir, "cooc.npz"), cooc)
    atomic_write_text(os.path.join(gdir, "entities.json"), json.dumps(vocab, ensure_ascii=False))
    return {"entities": len(vocab), "links": int(cooc.nnz - len(vocab))}


class Graph:
    """The entity graph of one generation, loaded for queries."""

    def __init__(self, gdir: str):
        import scipy.sparse as sp

        with open(os.path.join(gdir, "entities.json"), encoding="utf-8") as f:
            self.vocab = {e: i for i, e in enumerate(json.load(f))}
        self.m = sp.load_npz(os.path.join(gdir, "m.npz")).tocsc()
        self.cooc = sp.load_npz(os.path.join(gdir, "cooc.npz")).tocsr()
        self.df = np.asarray(self.cooc.diagonal(), np.float64)
        n = self.m.shape[0]
        self.idf = np.log((n + 1) / (self.df + 0.5))

    def seeds(self, text: str) -> list[int]:
        """The known entities of a query (its extracted phrases, and any of its word 1-3-grams)."""
        found = {e for e in entities(text) if e in self.vocab}
        words = [w.lower() for w in _TOKEN.findall(text) if w[0].isalnum() or w[0] == "_"]
        for n in (1, 2, 3):
            for i in range(len(words) - n + 1):
                g = " ".join(words[i:i + n])
                if g in self.vocab and g not in STOP:
                    found.add(g)
        return sorted(self.vocab[e] for e in found)

    def expand(self, text: str) -> tuple[list[int], np.ndarray, np.ndarray]:
        """(the query's entities, its strongest neighbour entities, their weights)."""
        seeds = self.seeds(text)
        if not seeds:
            return seeds, np.zeros(0, np.int64), np.zeros(0)
        nb = np.zeros(len(self.vocab))
        for e in seeds:
            lo, hi = self.cooc.indptr[e], self.cooc.indptr[e + 1]
            cols, counts = self.cooc.indices[lo:hi], self.cooc.data[lo:hi]
            nb[cols] += self.idf[e] * (counts / self.df[e]) * self.idf[cols]
        nb[seeds] = 0.0
        top = np.argsort(-nb)[:MAX_NEIGHBOURS]
        top = top[nb[top] > 0]
        return seeds, top, nb[top]

    def scores(self, text: str) -> np.ndarray:
        """One- plus two-hop score of every chunk for the query (module doc)."""
        n = self.m.shape[0]
        seeds, top, w = self.expand(text)
        if not seeds:
            return np.zeros(n)
        s = self.m[:, seeds] @ self.idf[seeds]
        if len(top):
            s = s + 0.5 * (self.m[:, top] @ w)
        return np.asarray(s, np.float64).ravel()

    def text_score(self, text: str, doc_text: str) -> float:
        """The score a chunk with `doc_text` would get (the tuner's leave-one-sentence-out runs)."""
        seeds, top, w = self.expand(text)
        have = {self.vocab[e] for e in entities(doc_text) if e in self.vocab}
        s = sum(self.idf[e] for e in seeds if e in have)
        return float(s + 0.5 * sum(x for e, x in zip(top.tolist(), w.tolist()) if e in have))

    def top(self, text: str, depth: int, allowed=None, override: tuple[int, float] | None = None):
        """(rows, scores) of the best `depth` chunks with a positive score; `override` replaces one
        row's score."""
        s = self.scores(text)
        if override is not None:
            s[override[0]] = override[1]
        mask = s > 0
        if allowed is not None:
            mask &= allowed
        cand = np.flatnonzero(mask)
        cand = cand[np.lexsort((cand, -s[cand]))][:depth]
        return cand.tolist(), s[cand].tolist()

    def communities(self, max_entities: int = 3000, seed: int = 0) -> list[list[int]]:
        """Louvain communities of the entity co-occurrence graph (the most frequent entities), largest
        first; each a list of entity ids."""
        import networkx as nx

        keep = np.argsort(-self.df)[:max_entities]
        keep_set = set(keep.tolist())
        g = nx.Graph()
        g.add_nodes_from(keep.tolist())
        coo = self.cooc.tocoo()
        for a, b, w in zip(coo.row.tolist(), coo.col.tolist(), coo.data.tolist()):
            if a < b and a in keep_set and b in keep_set:
                g.add_edge(a, b, weight=w / math.sqrt(self.df[a] * self.df[b]))
        comms = nx.community.louvain_communities(g, weight="weight", seed=seed)
        return sorted((sorted(c) for c in comms if len(c) >= 3), key=lambda c: (-len(c), c[0]))
