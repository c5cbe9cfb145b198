"""Fixtures the rag test files share (import the ones a module uses by name)."""

import json

import pytest


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A random-weight llama GGUF small enough for every LLM step (answers are noise, the plumbing is real)."""
    from ggufmake import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf", seed=3, n_ctx=2048)


def kernel_paragraphs(kernel_docs, lo: int = 200, hi: int = 1500) -> list[str]:
    """The kernel documentation's paragraphs of `lo`..`hi` characters, in order."""
    return [p.strip() for p in kernel_docs.read_text(encoding="utf-8").split("\n\n") if lo < len(p.strip()) < hi]


def write_jsonl(path, texts, prefix: str = "d") -> None:
    """One JSONL record per text: id PREFIX<n>, text."""
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
