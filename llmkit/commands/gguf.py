"""`llmkit gguf`: look inside GGUF files with llmkit's hardened reader; convert model directories to GGUF."""

from __future__ import annotations

import click

from llmkit.commands._common import Output


@click.group("gguf")
def group():
    """Inspect GGUF model files (metadata and tensor table; every field bounds-checked) and convert models to GGUF."""


def _summary(v, limit: int = 80):
    import numpy as np

    if isinstance(v, np.ndarray):
        head = ", ".join(str(x) for x in v[:5].tolist())
        return f"[{len(v)} x {v.dtype}] {head}{', ...' if len(v) > 5 else ''}"
    if isinstance(v, list):
        head = ", ".join(repr(x) for x in v[:5])
        return f"[{len(v)} x str] {head}{', ...' if len(v) > 5 else ''}"
    s = repr(v) if isinstance(v, str) else str(v)
    return s if len(s) <= limit else s[:limit] + "..."


def _jsonable(v, full: bool):
    import numpy as np

    if isinstance(v, np.ndarray):
        return v.tolist() if full else {"array": str(v.dtype), "length": len(v), "head": v[:8].tolist()}
    if isinstance(v, list):
        return v if full else {"array": "str", "length": len(v), "head": v[:8]}
    return v


@group.command("inspect")
@click.argument("path", metavar="FILE")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: version, metadata, tensors.")
@click.option("--full", is_flag=True, help="With --json: include whole arrays (vocabularies can be large).")
def inspect_cmd(path, as_json, full):
    """Print a GGUF file's metadata and tensor table.

    \b
    llmkit gguf inspect model.gguf
    llmkit gguf inspect model.gguf --json | jq '.metadata["general.architecture"]'
    """
    from llmkit.gguf.reader import read_gguf

    g = read_gguf(path)
    out = Output()
    total = sum(t.nbytes for t in g.tensors)
    if as_json:
        out.json({"path": path, "version": g.version, "file_size": g.file_size, "data_offset": g.data_offset,
                  "tensor_bytes": total, "metadata": {k: _jsonable(v, full) for k, v in g.metadata.items()},
                  "tensors": [{"name": t.name, "shape": list(t.shape), "type": t.type_name, "bytes": t.nbytes,
                               "offset": t.offset} for t in g.tensors]})
        return
    from rich.table import Table

    meta = Table(title=f"{path}: GGUF v{g.version}, {len(g.metadata)} metadata keys, {len(g.tensors)} tensors, "
                       f"{total / 2**20:.1f} MiB of tensor data")
    meta.add_column("key")
    meta.add_column("value")
    for k, v in g.metadata.items():
        meta.add_row(k, _summary(v))
    out.table(meta)
    tens = Table()
    for col in ("tensor", "shape", "type", "bytes", "offset"):
        tens.add_column(col, justify="left" if col in ("tensor", "type") else "right")
    for t in g.tensors:
        tens.add_row(t.name, " x ".join(map(str, t.shape)), t.type_name, str(t.nbytes), str(t.offset))
    out.table(tens)


@group.command("convert")
@click.argument("src", metavar="SRC_DIR")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="The GGUF file to write.")
@click.option("--outtype", type=click.Choice(["f16", "f32", "q8_0"]), default="f16", show_default=True,
              help="Type of the weight matrices (vectors, norms and position tables stay F32).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON object.")
def convert_cmd(src, output, outtype, as_json):
    """Convert a BERT-family model directory to a GGUF file for llama.cpp (no torch needed).

    SRC_DIR is a sentence-transformers embedder (BERT, RoBERTa, XLM-RoBERTa: all-MiniLM, bge, e5, ...)
    or a cross-encoder (BertForSequenceClassification, XLMRobertaForSequenceClassification) saved with
    safetensors weights and a tokenizer.json. The file uses llama.cpp's own tensor names and
    vocabulary layout; an embedder becomes `rag index --model FILE.gguf`, a cross-encoder
    `rag query --rerank FILE.gguf`.

    \b
    llmkit gguf convert ./all-MiniLM-L6-v2 -o minilm.gguf
    llmkit gguf convert ./ms-marco-MiniLM-L-6-v2 -o reranker.gguf --outtype f32
    """
    from llmkit.gguf.convert import convert

    out = Output()
    rep = convert(src, output, outtype)
    if as_json:
        out.json(rep.to_dict())
        return
    out.info(f"{rep.path}: {rep.kind} ({rep.architecture}, pooling {rep.pooling}), {rep.tensors} tensors, "
             f"{rep.vocab} tokens, {rep.bytes / 2**20:.1f} MiB")

