"""Fusion settings: the caller's explicit values, else the index's tuned choice (`rag tune`, stored
in its manifest under "fusion"), else the built-in default (RRF 1:1, k 60)."""

from __future__ import annotations

from llmkit.errors import OptionError

MODES = ("bm25", "dense", "hybrid")
RETRIEVERS = ("bm25", "dense", "graph")
# the built-in fusion; `rag tune` stores another choice in the manifest under "fusion"
DEFAULT_FUSION = {"method": "rrf", "k": 60, "weights": {"bm25": 1.0, "dense": 1.0}, "norm": "minmax",
                  "expand": 0, "parents": False}


def fusion_settings(manifest: dict, **given) -> tuple[dict, str]:
    """(settings, where they came from): explicit values (not None) over the index's tuned choice
    over the built-in default."""
    tuned = manifest.get("fusion") or {}
    out = {**DEFAULT_FUSION, **{k: v for k, v in tuned.items() if k in DEFAULT_FUSION}}
    source = "tuned" if tuned else "default"
    overrides = {k: v for k, v in given.items() if v is not None}
    if overrides:
        out.update(overrides)
        source = "flags" if source == "default" else "tuned + flags"
    return out, source


def parse_weights(text: str) -> dict:
    """'bm25=0.3,dense=0.7' -> {'bm25': 0.3, 'dense': 0.7}."""
    out = {"bm25": 1.0, "dense": 1.0}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, val = part.partition("=")
        try:
            out[name.strip()] = float(val)
        except ValueError:
            raise OptionError("cannot read the weight {part!r}; write {weights} bm25=0.3,dense=0.7.", part=part) from None
        if not sep:
            raise OptionError("cannot read the weight {part!r}; write {weights} bm25=0.3,dense=0.7.", part=part)
    return out
