"""BM25 text analysis: how chunk text and queries become index terms.

- `plain`: lower-cased words, CJK runs as overlapping character bigrams.
- `porter`: plain, every ASCII word Porter-stemmed.
- `english` (the default): per chunk, a cheap language test (the share of English stop words among
  its words); an English chunk loses the stop words and its words are stemmed (Snowball English
  through PyStemmer, the way Lucene's EnglishAnalyzer and bm25s analyse English); any other chunk
  keeps the plain analysis, CJK its bigrams. A query cannot be told apart reliably (two words), so
  each query word gives its stem *and* its plain form: an English chunk only holds stems, another
  language's chunk only plain forms, and either matches.

The index records its analysis in the manifest (`analysis`, and `bm25_idents`: identifiers split
into their words too); queries are always analysed the same way.
"""

from __future__ import annotations

from functools import lru_cache

from llmkit.rag.index.bm25 import tokenize

ANALYSES = ("english", "plain", "porter")
# Lucene's EnglishAnalyzer stop set (ENGLISH_STOP_WORDS_SET), the usual standard list
STOP = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their then "
                 "there these they this to was will with".split())
# the commonest function words of the other large Latin-script languages (de, fr, es, it, pt, nl): a
# chunk is English unless these outnumber the English ones (code and terse entries have few of either)
OTHER = frozenset("der die das und ist nicht mit den von zu ein eine sich auf dem des im auch "
                  "le la les des et est une du dans que pour pas sur qui au aux sont "
                  "el los las del y por una con para es se lo al "
                  "il di che della per non sono gli nel "
                  "os não uma com em do da "
                  "het een van en niet zijn op te dat voor ook".split()) - STOP

@lru_cache(maxsize=1)
def _stemmer():
    try:
        import Stemmer
    except ImportError:
        from llmkit.errors import MissingDependency

        raise MissingDependency("PyStemmer", "rag") from None
    return Stemmer.Stemmer("english")


@lru_cache(maxsize=1 << 18)
def stem(word: str) -> str:
    """Snowball English stem of a lower-case ASCII word (other words are kept).

    >>> [stem(w) for w in ("flows", "flowing", "generalizations", "über")]
    ['flow', 'flow', 'general', 'über']
    """
    if not word.isascii() or not word.isalpha():
        return word
    return _stemmer().stemWord(word)


def is_english(words: list[str]) -> bool:
    """Is a chunk English? Unless at least two of its (lower-cased) words are function words of
    another Latin-script language and they outnumber its English stop words.

    >>> is_english("the flow of air over the wing".split()), is_english("die katze ist auf dem tisch".split())
    (True, False)
    >>> is_english("def parse_config path return open path read".split())
    True
    """
    other = sum(1 for w in words if w in OTHER)
    return other < 2 or other <= sum(1 for w in words if w in STOP)


def doc_terms(text: str, analysis: str = "english", idents: bool = False) -> list[str]:
    """Index terms of a chunk.

    >>> doc_terms("The flows of air over wings.")
    ['flow', 'air', 'over', 'wing']
    >>> doc_terms("Die Katze ist auf dem Tisch.")
    ['die', 'katze', 'ist', 'auf', 'dem', 'tisch']
    """
    if analysis == "porter":
        return tokenize(text, True, idents)
    words = tokenize(text, False, idents)
    if analysis == "plain" or not is_english(words):
        return words
    return [stem(w) for w in words if w not in STOP]


def query_terms(text: str, analysis: str = "english", idents: bool = False) -> list[str]:
    """Terms of a query: under `english`, each non-stop word's stem, then its plain form when it
    differs (stop words are dropped unless the query has nothing else).

    >>> query_terms("the flows of katze")
    ['flow', 'flows', 'katz', 'katze']
    """
    if analysis != "english":
        return doc_terms(text, analysis, idents)
    words = tokenize(text, False, idents)
    kept = [w for w in words if w not in STOP] or words
    out = []
    for w in kept:
        s = stem(w)
        out.append(s)
        if s != w:
            out.append(w)
    return out


def query_groups(text: str, analysis: str = "english", idents: bool = False) -> list[tuple[str, ...]]:
    """The query's words as groups of alternative terms (a word is present when any of them is).

    >>> query_groups("flows katze")
    [('flow', 'flows'), ('katz', 'katze')]
    """
    if analysis != "english":
        return [(t,) for t in doc_terms(text, analysis, idents)]
    words = tokenize(text, False, idents)
    kept = [w for w in words if w not in STOP] or words
    return [tuple(dict.fromkeys((stem(w), w))) for w in kept]

