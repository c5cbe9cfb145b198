"""One document -> its parents and chunks.

Small-to-big: a section is first cut into parents (recursive, `parent_size` characters, no overlap;
0: the whole section); chunks are cut inside each parent at every chunk size, so a chunk belongs to
exactly one parent. Sections a reader already cut (code definitions, table rows) are indexed
verbatim, the section being the parent: no whitespace folding, no boilerplate stripping.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmkit.errors import BadInput
from llmkit.rag.chunk import spans
from llmkit.rag.errors import OptionError
from llmkit.rag.read.types import Document


@dataclass
class ChunkOptions:
    """How documents become chunks (and which chunks are dropped as duplicates or boilerplate)."""

    chunker: str = "recursive"  # recursive | window
    sizes: tuple[int, ...] = (800,)  # characters (window: words/CJK characters); several = several chunk sizes
    overlap: int = 100
    parent_size: int = 3000  # small-to-big parents (0: the whole section)
    dedupe: bool = True  # drop exact and near-duplicate chunks
    near_threshold: float = 0.9  # MinHash Jaccard threshold for near-duplicates
    boilerplate: bool = True  # drop lines repeated across many documents (headers, footers)

    def validate(self) -> None:
        """Refuse an unknown chunker, sizes and overlaps it cannot cut, parents smaller than chunks."""
        if self.chunker not in ("recursive", "window"):
            raise BadInput(f"unknown chunker {self.chunker!r}; use 'recursive' or 'window'.")
        if not self.sizes:
            raise BadInput("give at least one chunk size.")
        for size in self.sizes:
            if self.chunker == "window":
                spans.window_spans("x", size, self.overlap)  # validates size/overlap
            else:
                spans.check_size(size, self.overlap)
        if self.parent_size and self.parent_size < max(self.sizes):
            raise OptionError("{parent_size} {value} is smaller than the chunk size {size}; make it larger or 0 "
                              "(parents = whole sections).", value=self.parent_size, size=max(self.sizes))


def chunk_document(doc: Document, opts: ChunkOptions, meta: dict, drop_lines: set[str]):
    """(parent text, [(chunk text, meta)]) pairs for one document; `meta` is added to every chunk."""
    out = []
    base = {"source": doc.source, **{k: v for k, v in doc.meta.items()}, **meta}
    for sec in doc.sections:
        if sec.chunks is not None:  # already cut (code, table rows): verbatim, the section is the parent
            chunks = [(t, dict(base, section=sec.heading, chunk_size=len(t), **m)) for t, m in sec.chunks if t.strip()]
            if chunks:
                out.append((sec.text, chunks))
            continue
        text = spans.normalize_whitespace(spans.strip_lines(sec.text, drop_lines))
        if not text:
            continue
        parents = (spans.recursive_spans(text, opts.parent_size, 0) if opts.parent_size
                   else [spans.Span(0, len(text), text)])
        for par in parents:
            chunks = []
            for size in opts.sizes:
                if opts.chunker == "window":
                    cut = spans.window_spans(par.text, size, opts.overlap)
                else:
                    cut = spans.recursive_spans(par.text, size, opts.overlap)
                for sp in cut:
                    m = dict(base, section=sec.heading, chunk_size=size,
                             char_start=par.start + sp.start, char_end=par.start + sp.end)
                    if sec.page is not None:
                        m["page"] = sec.page
                    chunks.append((sp.text, m))
            out.append((par.text, chunks))
    return out
