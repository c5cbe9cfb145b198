"""Answers from retrieved hits.

    cite.py           `rag answer`: the numbered-sources prompt, citations, where a hit comes from
    global_answer.py  questions about the whole corpus, from entity-graph community summaries
    compress.py       fitting retrieved passages into a token budget

May import: retrieve/, index/, llmkit.rag.llm, llmkit.errors.
"""
