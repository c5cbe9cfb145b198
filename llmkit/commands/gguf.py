"""`llmkit gguf`: look inside GGUF files with llmkit's hardened reader."""

from __future__ import annotations

import click

from llmkit.commands._common import Output


@click.group("gguf")
def group():
    """Inspect GGUF model files (metadata and tensor table; every field bounds-checked)."""


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
