"""A second judged retrieval collection (not a test): WordNet definitions find Webster's 1913 entries.

    python benchmarks/dictionary_collection.py -o data/dict-coll          # fetches the two Debian packages
    python benchmarks/dictionary_collection.py -o data/dict-coll --src DIR  # DIR holds the extracted packages

Two dictionaries written 90 years apart by different lexicographers: each query is a modern WordNet
noun gloss ("a large ... used for ..."), the documents are GCIDE headword entries restricted to their
Webster's 1913 definitions (GCIDE also carries WordNet glosses; every paragraph not tagged
[1913 Webster] is dropped, so no query text is in the corpus), and the relevant documents are the
entries of the synset's words. A reverse-dictionary task: paraphrase across a century, little word
overlap — the opposite end from Cranfield's technical abstracts. Output as `rag cranfield` writes it:
docs.jsonl (id = headword, spaces as _), queries.jsonl, qrels.txt.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def fetch(dest: str) -> str:
    subprocess.run(["apt-get", "download", "dict-gcide", "wordnet-base"], cwd=dest, check=True, capture_output=True)
    for f in os.listdir(dest):
        if f.endswith(".deb"):
            subprocess.run(["dpkg", "-x", os.path.join(dest, f), os.path.join(dest, "x")], check=True)
    return os.path.join(dest, "x")


def webster_entries(src: str) -> dict[str, str]:
    """headword (lower case) -> its Webster 1913 paragraphs (other sources dropped)."""
    with gzip.open(os.path.join(src, "usr/share/dictd/gcide.dict.dz"), "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    entries: dict[str, list[str]] = {}
    # an entry starts at a line beginning with a non-space character after a blank line
    for block in re.split(r"\n\n(?=\S)", text):
        head, _, body = block.partition("\n")
        word = re.split(r"\s*\\", head, 1)[0].strip().lower()
        if not word or word.startswith("00-") or not re.fullmatch(r"[a-z][a-z '\-]*", word):
            continue
        kept, para = [], []
        for line in (head + "\n" + body).split("\n"):
            tag = re.fullmatch(r"\s*\[([^\]]+)\]\s*", line)
            if tag:
                if "1913 Webster" in tag.group(1) and "WordNet" not in tag.group(1):
                    kept.append(" ".join(" ".join(para).split()))
                para = []
            else:
                para.append(line)
        body = " ".join(p for p in kept if p)
        if len(body) > 40:
            entries.setdefault(word, []).append(body)
    return {w: " ".join(v) for w, v in entries.items()}


def wordnet_glosses(src: str):
    """(lemmas, gloss) of noun synsets."""
    with open(os.path.join(src, "usr/share/wordnet/data.noun"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("  "):
                continue
            head, _, gloss = line.partition(" | ")
            parts = head.split()
            n = int(parts[3], 16)
            lemmas = [parts[4 + 2 * i].replace("_", " ").lower() for i in range(n)]
            gloss = gloss.split('; "')[0].strip().rstrip(";").strip()
            yield [re.sub(r"\(.*\)$", "", w) for w in lemmas], gloss


def build(src: str, out: str, n_queries: int = 200, n_docs: int = 6000, seed: int = 0) -> dict:
    from llmkit.io import atomic_write_text

    docs = webster_entries(src)
    rng = np.random.default_rng(seed)
    cands = []
    for lemmas, gloss in wordnet_glosses(src):
        have = sorted({w for w in lemmas if w in docs})
        words = re.findall(r"[a-z]+", gloss.lower())
        if not have or len(words) < 5 or len(lemmas) > 3:
            continue
        if any(w in gloss.lower() for w in have):  # the gloss must not name its own headword
            continue
        cands.append((have, gloss))
    picked = [cands[i] for i in rng.choice(len(cands), size=min(n_queries, len(cands)), replace=False)]
    relevant = sorted({w for have, _ in picked for w in have})
    others = sorted(set(docs) - set(relevant))
    fill = rng.choice(len(others), size=max(0, min(n_docs - len(relevant), len(others))), replace=False)
    corpus = sorted(set(relevant) | {others[i] for i in fill})
    os.makedirs(out, exist_ok=True)
    atomic_write_text(os.path.join(out, "docs.jsonl"), "".join(
        json.dumps({"id": w.replace(" ", "_"), "title": w, "text": docs[w]}) + "\n" for w in corpus))
    atomic_write_text(os.path.join(out, "queries.jsonl"), "".join(
        json.dumps({"id": str(i), "text": g}) + "\n" for i, (_, g) in enumerate(picked, 1)))
    atomic_write_text(os.path.join(out, "qrels.txt"), "".join(
        f"{i} 0 {w.replace(' ', '_')} 1\n" for i, (have, _) in enumerate(picked, 1) for w in have))
    return {"docs": len(corpus), "queries": len(picked), "judgments": sum(len(h) for h, _ in picked)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--src", help="directory with the extracted dict-gcide and wordnet-base packages")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--docs", type=int, default=6000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = args.src or fetch(tmp)
        print(build(src, args.out, args.queries, args.docs))


if __name__ == "__main__":
    main()
