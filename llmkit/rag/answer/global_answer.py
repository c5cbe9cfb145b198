"""Global questions about the whole corpus (`rag ask-global`), the GraphRAG / LazyGraphRAG idea:
the entity graph is split into communities (Louvain), the communities that the question's
retrieval hits point to are summarised by the local model (lazily: only those, cached in
IDX/summaries/ by content), and the answer is written from those summaries.

A community is chosen by votes: the question's hybrid hits (top 40), each voting 1/(10 + rank) for
every community whose entities it contains. Its summary is written from its most central chunks
(those holding most of its entities), at most ~1500 tokens of them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

import numpy as np

from llmkit.errors import BadInput

SUMMARY_PROMPT = ("Summarise what the following passages say about {topic}, in at most 4 sentences. "
                  "Use only the passages.\n\n{passages}")
ANSWER_SYSTEM = ("You answer a question about a whole document collection from summaries of its main topics. "
                 "Cite the summaries you use like [1]. If they do not answer it, say so.")


@dataclass
class Community:
    id: int
    entities: list[str]
    rows: list[int]  # its most central chunks
    summary: str = ""
    votes: float = 0.0


@dataclass
class GlobalAnswer:
    question: str
    answer: str
    communities: list[Community] = field(default_factory=list)
    cached: int = 0

    def to_dict(self) -> dict:
        return {"question": self.question, "answer": self.answer, "communities": [
            {"n": i, "entities": c.entities[:10], "summary": c.summary} for i, c in enumerate(self.communities, 1)]}


def communities(index, max_entities: int = 3000) -> list[list[int]]:
    """Louvain communities of the index's entity graph, computed once per generation (cached in
    gen-N/graph/communities.json)."""
    from llmkit.io import atomic_write_text

    path = os.path.join(index.gdir, "graph", "communities.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    graph = _graph(index)
    comms = graph.communities(max_entities)
    try:
        atomic_write_text(path, json.dumps(comms))
    except OSError:
        pass  # a read-only index: computed again next time
    return comms


def _graph(index):
    return index.graph


def choose(index, hits, comms: list[list[int]], k: int = 4) -> list[Community]:
    """The k communities the question's hits vote for."""
    g = _graph(index)
    m = g.m.tocsr()
    member = {}
    for ci, ents in enumerate(comms):
        for e in ents:
            member[e] = ci
    votes = np.zeros(len(comms))
    for rank, h in enumerate(hits, 1):
        cs = {member[e] for e in m[h.row].indices.tolist() if e in member}
        for c in cs:
            votes[c] += 1.0 / (10 + rank)
    inv = {i: e for e, i in g.vocab.items()}
    out = []
    for ci in np.argsort(-votes)[:k].tolist():
        if votes[ci] <= 0:
            break
        ents = comms[ci]
        counts = np.asarray(m[:, ents].sum(axis=1)).ravel()
        central = [int(r) for r in np.argsort(-counts)[:6] if counts[r] > 0]
        names = sorted(ents, key=lambda e: (" " not in inv[e], -g.df[e]))  # phrases name a topic best
        out.append(Community(ci, [inv[e] for e in names], central, votes=float(votes[ci])))
    return out


def summarise(index, llm, comm: Community, max_tokens: int = 1500) -> tuple[str, bool]:
    """(summary, from cache) of one community, cached in IDX/summaries/<key>.txt by the model and the
    texts it was written from."""
    from llmkit.io import atomic_write_text

    texts = index.texts(comm.rows)
    picked, used = [], 0
    for t in texts:
        n = llm.count_tokens(t)
        if used + n > max_tokens and picked:
            break
        picked.append(t)
        used += n
    topic = ", ".join(comm.entities[:6])
    prompt = SUMMARY_PROMPT.format(topic=topic, passages="\n\n".join(f"- {t}" for t in picked))
    key = hashlib.sha256((os.path.abspath(llm.path) + "\0" + prompt).encode()).hexdigest()[:32]
    path = os.path.join(index.dir, "summaries", key + ".txt")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(), True
    except OSError:
        pass
    summary = llm.complete(prompt, 160)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_text(path, summary)
    except OSError:
        pass
    return summary, False


def global_answer(index, pipeline, llm, question: str, k: int = 4, n_predict: int = 256, on_text=None) -> GlobalAnswer:
    """Answer a question about the whole corpus from the summaries of the communities it touches."""
    if not index.has_graph:
        raise BadInput(f"index '{index.dir}' has no entity graph, which global questions need. Build it with: "
                       f"llmkit rag index {index.dir} FILES... --graph")
    comms = communities(index)
    if not comms:
        raise BadInput("the entity graph has no communities (too few linked entities); index more text.")
    hits = pipeline.run(question).hits
    chosen = choose(index, hits, comms, k)
    if not chosen:
        raise BadInput("no community of the entity graph matches the question; rephrase it or index more text.")
    cached = 0
    for c in chosen:
        c.summary, hit = summarise(index, llm, c)
        cached += hit
    context = "\n\n".join(f"[{i}] (topic: {', '.join(c.entities[:5])})\n{c.summary}" for i, c in enumerate(chosen, 1))
    answer = llm.complete(f"Summaries:\n\n{context}\n\nQuestion: {question}\nAnswer with citations:", n_predict,
                          system=ANSWER_SYSTEM, on_text=on_text)
    return GlobalAnswer(question, answer, chosen, cached)
