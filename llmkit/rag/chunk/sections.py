"""One document -> its parents and chunks.

Units that fit the embedding model (the default, `sizes` empty): chunks are sized in the model's own
word pieces, at most its window (256 - 2 for all-MiniLM-L6-v2), so the embedder never cuts a chunk
off; a section that fits is one chunk, a longer one is cut at the strongest boundaries with an
eighth of the window as overlap (docs/design/rag-defaults.md compares unit sizes). With `sizes`,
sizes are characters.

Small-to-big: a section is first cut into parents (recursive, `parent_size` characters, no overlap;
0: the whole section); chunks are cut inside each parent at every chunk size, so a chunk belongs to
exactly one parent. Sections a reader already cut (code definitions, table rows) are indexed
verbatim, the section being the parent: no whitespace folding, no boilerplate stripping.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmkit.errors import BadInput
from llmkit.rag.chunk import spans
from llmkit.errors import OptionError
from llmkit.rag.read.types import Document


@dataclass
class ChunkOptions:
    """How documents become chunks (and which chunks are dropped as duplicates or boilerplate)."""

    chunker: str = "recursive"  # recursive | window
    sizes: tuple[int, ...] = ()  # characters (window: words/CJK characters); several = several chunk sizes;
    # () = `tokens` model tokens (an existing collection keeps its recorded chunking)
    overlap: int | None = None  # None: 100 characters, or an eighth of the token size
    tokens: int = 0  # chunk size in the embedding model's tokens when `sizes` is (): 0 = its window
    parent_size: int = 3000  # small-to-big parents (0: the whole section)
    dedupe: bool = True  # drop exact and near-duplicate chunks
    near_threshold: float = 0.9  # MinHash Jaccard threshold for near-duplicates
    boilerplate: bool = True  # drop lines repeated across many documents (headers, footers)

    def validate(self) -> None:
        """Refuse an unknown chunker, sizes and overlaps it cannot cut, parents smaller than chunks."""
        if self.chunker not in ("recursive", "window"):
            raise BadInput(f"unknown chunker {self.chunker!r}; use 'recursive' or 'window'.")
        if self.tokens < 0:
            raise OptionError("{tokens} must be positive (got {value}).", value=self.tokens)
        if not 0 < self.near_threshold <= 1:
            raise OptionError("{dedupe} takes a similarity in (0, 1] or off, not {value}.", value=self.near_threshold)
        for size in self.sizes:
            if self.chunker == "window":
                spans.window_spans("x", size, 100 if self.overlap is None else self.overlap)  # validates
            else:
                spans.check_size(size, 100 if self.overlap is None else self.overlap)
        if self.sizes and self.parent_size and self.parent_size < max(self.sizes):
            raise OptionError("{parent_size} {value} is smaller than the chunk size {size}; make it larger or 0 "
                              "(parents = whole sections).", value=self.parent_size, size=max(self.sizes))


def chunk_document(doc: Document, opts: ChunkOptions, meta: dict, drop_lines: set[str], token_starts=None):
    """(parent text, [(chunk text, meta)]) pairs for one document; `meta` is added to every chunk.
    Without `opts.sizes` chunks hold at most `opts.tokens` model tokens (`token_starts(text)`: the
    start offsets of a text's word pieces)."""
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
            for size in opts.sizes or (opts.tokens,):
                if not opts.sizes:
                    cut = spans.recursive_spans(par.text, size, opts.overlap, token_starts(par.text))
                elif opts.chunker == "window":
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


def chunking_of(manifest: dict, collection: str, opts: ChunkOptions, window, changes: list[str]) -> ChunkOptions:
    """The chunking to use: the collection's recorded one when no size is given (a collection cut in
    characters keeps its characters), else the given one; token sizes resolved against the model
    (`window()`: its window in tokens). What differs from the recorded chunking is appended to
    `changes`."""
    from dataclasses import replace

    rec = manifest["collections"].get(collection)
    recorded = bool(rec and not opts.sizes and not opts.tokens)
    if recorded:  # no size given: keep what the collection has (its token size was checked when set)
        keep = {"overlap": rec.get("overlap") if opts.overlap is None else opts.overlap}
        if rec["unit"] == "chars":
            keep.update(sizes=tuple(rec["sizes"]), chunker=rec["chunker"])
        else:
            keep.update(tokens=rec["tokens"])
        opts = replace(opts, **keep)
    if not opts.sizes:
        tokens = opts.tokens if recorded and opts.tokens else min(opts.tokens or window(), window())
        opts = replace(opts, tokens=tokens, chunker="recursive",
                       overlap=tokens // 8 if opts.overlap is None else opts.overlap)
    elif opts.overlap is None:
        opts = replace(opts, overlap=100)
    if rec:
        for k, v in chunking_record(opts).items():
            old = rec.get(k)
            if old != v:
                changes.append(f"{k} {old} -> {v}")
    return opts


def chunking_record(opts: ChunkOptions) -> dict:
    """How a collection was chunked, as the manifest records it."""
    if opts.sizes:
        return {"unit": "chars", "chunker": opts.chunker, "sizes": list(opts.sizes), "overlap": opts.overlap,
                "parent_size": opts.parent_size}
    return {"unit": "tokens", "chunker": "recursive", "tokens": opts.tokens, "overlap": opts.overlap,
            "parent_size": opts.parent_size}
