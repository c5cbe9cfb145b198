"""Export a sentence-transformers model for the ONNX runtime (`onnx_runtime.py`), once per model content.

A BERT-family model with safetensors weights is built without torch (`onnx_build.py`: the fused graph
written directly). Any other model is exported with torch and sentence-transformers, when an index
is built (or on the first query whose export is missing); afterwards queries import neither. Steps:

1. load the model with sentence-transformers and read what it does around the transformer (max
   sequence length, lower-casing, pooling modes, Dense layers, Normalize, prompts) from the live
   modules, so the spec is exactly what its `encode` uses;
2. export the transformer with eager attention (`torch.onnx.export`), then fuse it with onnxruntime's
   transformer optimizer (attention, skip-LayerNorm, GELU), which runs faster than the plain graph;
3. int8: dynamic quantization of the fused graph's MatMuls with per-channel weights (per-tensor
   weights lose far more accuracy; attention stays fp32, see below);
4. check the fp32 export against sentence-transformers on a few texts before publishing it.

The directory is built beside the cache entry and renamed into place under a lock, so concurrent
first queries export once and a killed export leaves no half-written entry.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from llmkit.errors import BadFileFormat, MissingDependency
from llmkit.rag.embed.models import check_precision
from llmkit.rag.embed.onnx_build import save_external
from llmkit.rag.embed.onnx_runtime import Spec, export_path
from llmkit.rag.embed.sbert import load_sentence_transformer
from llmkit.errors import OptionError

SUPPORTED = {"Transformer", "Pooling", "Dense", "Normalize"}
CHECK_TEXTS = ["The kernel manages physical memory in pages.", "How do I mount a filesystem?",
               "Boundary layer transition on a flat plate at supersonic speeds " * 8, "x"]


@contextmanager
def _lock(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def usable(directory: Path, precision: str) -> bool:
    """Is this export directory complete for `precision` (spec readable, files present)?"""
    try:
        Spec.load(directory / "spec.json")
    except BadFileFormat:
        return False
    return all((directory / f).is_file() for f in ("tokenizer.json", f"model-{precision}.onnx",
                                                    f"model-{precision}.onnx.data"))


def ensure_export(model_path: str, key: str, precision: str = "fp32", rebuild: bool = False,
                  progress=None) -> Path:
    """The export directory of this model content with `precision` built (exported now if missing
    or if `rebuild`: a damaged entry is replaced, never half-used)."""
    check_precision(precision)
    final = export_path(key)
    if not rebuild and usable(final, precision):
        return final
    with _lock(final.parent / f".{key}.lock"):
        if not rebuild and usable(final, precision):
            return final  # another process exported it while we waited
        if not rebuild and usable(final, "fp32") and precision == "int8":
            _quantize_int8(final / "model-fp32.onnx", final)
            return final
        tmp = final.parent / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            _export(model_path, key, tmp, precision, progress)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def read_spec(st) -> tuple[Spec, object, list]:
    """The Spec of a loaded SentenceTransformer, its Transformer module and its Dense modules."""
    names = [type(m).__name__ for m in st]
    odd = [n for n in names if n not in SUPPORTED]
    if odd or not names or names[0] != "Transformer":
        raise OptionError("the model's sentence-transformers modules ({names}) include {odd}, which the ONNX "
                          "runtime does not reproduce. Index with {runtime} torch.", names=", ".join(names),
                          odd=", ".join(odd) or "no Transformer first")
    tm = st[0]
    tok = tm.tokenizer
    if not getattr(tok, "is_fast", False):
        raise OptionError("the model's tokenizer has no fast (Rust) version, which the ONNX runtime needs. "
                          "Index with {runtime} torch.")
    pooling, normalize, dense, include_prompt = [], False, [], True
    for m in st:
        kind = type(m).__name__
        if kind == "Pooling":
            cfg = m.get_config_dict()
            if "pooling_mode" in cfg:  # sentence-transformers >= 6: a mode or a tuple of modes, in order
                mode = cfg["pooling_mode"]
                pooling = [mode] if isinstance(mode, str) else list(mode)
            else:  # older: one flag per mode, concatenated in this order
                flags = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
                         "mean": "pooling_mode_mean_tokens", "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                         "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}
                pooling = [mode for mode, flag in flags.items() if cfg.get(flag)]
            include_prompt = bool(cfg.get("include_prompt", True))
        elif kind == "Dense":
            dense.append(m)
        elif kind == "Normalize":
            normalize = True
    if not pooling:
        raise OptionError("the model has no Pooling module (token embeddings only); the ONNX runtime needs "
                          "sentence vectors. Index with {runtime} torch.")
    dim = st.get_embedding_dimension() if hasattr(st, "get_embedding_dimension") else st.get_sentence_embedding_dimension()
    spec = Spec(dim=int(dim), max_seq_length=int(st.max_seq_length or tok.model_max_length), pooling=pooling,
                normalize=normalize, do_lower_case=bool(getattr(tm, "do_lower_case", False)),
                include_prompt=include_prompt, prompts=dict(getattr(st, "prompts", {}) or {}),
                pad_id=int(tok.pad_token_id if tok.pad_token_id is not None else 0),
                pad_token=str(tok.pad_token or ""), pad_type_id=int(getattr(tok, "pad_token_type_id", 0) or 0),
                padding_side=str(getattr(tok, "padding_side", "right")),
                unk_id=tok.unk_token_id if tok.unk_token_id is not None else None)
    return spec, tm, dense


def _activation(module) -> str:
    name = type(getattr(module, "activation_function", None)).__name__.lower()
    name = {"identity": "identity", "tanh": "tanh", "relu": "relu", "sigmoid": "sigmoid", "gelu": "gelu"}.get(name)
    if name is None:
        raise OptionError("a Dense module uses the activation {act}, which the ONNX runtime does not reproduce. "
                          "Index with {runtime} torch.", act=type(module.activation_function).__name__)
    return name


def _export(model_path: str, key: str, out: Path, precision: str, progress) -> None:
    from llmkit.rag.embed.onnx_build import build, buildable

    t0 = time.perf_counter()
    if buildable(model_path) is None:  # BERT-family safetensors: the fused graph is written directly
        if progress:
            progress("building the ONNX graph of the embedding model", 0, 0)
        build(model_path, key, out)
        if precision == "int8":
            _quantize_int8(out / "model-fp32.onnx", out)
        (out / "export.json").write_text(json.dumps({"source": os.path.abspath(model_path), "seconds": round(
            time.perf_counter() - t0, 1), "builder": "safetensors"}), encoding="utf-8")
        return
    torch_export(model_path, key, out, precision, progress)


def torch_export(model_path: str, key: str, out: Path, precision: str, progress=None) -> None:
    """Export with torch.onnx and fuse with onnxruntime's optimizer (module doc), checked against
    sentence-transformers."""
    import torch

    t0 = time.perf_counter()
    st = load_sentence_transformer(model_path)
    spec, tm, dense = read_spec(st)
    spec.model_key = key
    _save_dense(dense, out, spec)
    tm.tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    hf = tm.auto_model
    hf.eval()
    _eager_attention(hf)
    plain = out / "plain.onnx"
    spec.input_names = _export_plain(hf, tm.tokenizer, plain, progress)
    fp32 = out / "model-fp32.onnx"
    spec.fused = _fuse(plain, fp32, hf.config)
    plain.unlink()
    (out / "spec.json").write_text(json.dumps(spec.to_dict(), indent=1), encoding="utf-8")
    _check(st, out, spec)
    if precision == "int8":
        _quantize_int8(fp32, out)
    (out / "export.json").write_text(json.dumps({"source": os.path.abspath(model_path), "seconds": round(
        time.perf_counter() - t0, 1), "torch": torch.__version__}), encoding="utf-8")


def _save_dense(dense: list, out: Path, spec: Spec) -> None:
    """Write each Dense module's weights to out/dense-N.npz and list it with its activation in `spec`."""
    for i, m in enumerate(dense):
        file = f"dense-{i}.npz"
        arrays = {"weight": m.linear.weight.detach().float().numpy()}
        if m.linear.bias is not None:
            arrays["bias"] = m.linear.bias.detach().float().numpy()
        np.savez(out / file, **arrays)
        spec.dense.append({"file": file, "activation": _activation(m)})


def _eager_attention(hf) -> None:
    """Switch the transformer to eager attention."""
    # onnxruntime's optimizer fuses only the explicit softmax(QK^T)V pattern
    if hasattr(hf, "set_attn_implementation"):
        try:
            hf.set_attn_implementation("eager")
        except Exception:
            hf.config._attn_implementation = "eager"
    else:
        hf.config._attn_implementation = "eager"


def _export_plain(hf, tokenizer, plain: Path, progress) -> list[str]:
    """Export the transformer's last hidden state to the unfused ONNX graph `plain`; its input names."""
    import inspect
    import warnings

    import torch

    sample = tokenizer(["a short example", "a second, slightly longer example text"], padding=True,
                       return_tensors="pt")
    accepted = set(inspect.signature(hf.forward).parameters)
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in sample and n in accepted]

    class Wrapped(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return self.model(**dict(zip(names, args)), return_dict=True).last_hidden_state

    axes = {n: {0: "batch", 1: "seq"} for n in names}
    axes["last_hidden_state"] = {0: "batch", 1: "seq"}
    if progress:
        progress("exporting the embedding model to ONNX", 0, 0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer chatter; torch_export checks the export against ST
        kwargs = dict(input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17)
        try:
            torch.onnx.export(Wrapped(hf), tuple(sample[n] for n in names), str(plain), dynamo=False, **kwargs)
        except TypeError:  # an older torch without the dynamo switch
            torch.onnx.export(Wrapped(hf), tuple(sample[n] for n in names), str(plain), **kwargs)
    return names


def _fuse(src: Path, dst: Path, config) -> bool:
    """Fuse attention/LayerNorm/GELU with onnxruntime's transformer optimizer; False (and the plain
    graph) when it cannot."""
    import onnx

    heads = getattr(config, "num_attention_heads", 0) or 0
    hidden = getattr(config, "hidden_size", 0) or 0
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        opt = optimize_model(str(src), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=1)
        stats = opt.get_fused_operator_statistics()
        save_external(opt.model, dst)
        return bool(stats.get("Attention", 0) or stats.get("MultiHeadAttention", 0))
    except Exception:  # an architecture the optimizer does not know: the unfused graph is still right
        save_external(onnx.load(str(src)), dst)
        return False


def _quantize_int8(src: Path, out: Path) -> None:
    """Dynamic int8 quantization with per-channel weights into `out/model-int8.onnx` (+ .data), built
    in a scratch directory and moved in (data first), so a reader never sees half of it."""
    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError:
        raise MissingDependency("onnx", "rag") from None
    scratch = out / f".int8.{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        dst = scratch / "model-int8.onnx"
        # MatMuls only (FFN and output projections); the fused attention (QKV + softmax) stays fp32,
        # since quantizing it too lost retrieval quality for little speed (docs/design/rag-models.md).
        # Its "consider pre-processing" advice goes to the root logger, which is the application's
        # to configure (the CLI shows records of level ERROR and above only).
        quantize_dynamic(str(src), str(dst), op_types_to_quantize=["MatMul"], per_channel=True,
                         weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        save_external(onnx.load(str(dst)), dst)
        os.replace(scratch / "model-int8.onnx.data", out / "model-int8.onnx.data")
        os.replace(dst, out / "model-int8.onnx")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _check(st, out: Path, spec: Spec) -> None:
    """The fp32 export must reproduce sentence-transformers' vectors (cosine >= 0.9999)."""
    from llmkit.rag.embed.onnx_runtime import OnnxEncoder

    enc = OnnxEncoder(out, "fp32", threads=1)
    a = enc.encode(CHECK_TEXTS)
    b = st.encode(CHECK_TEXTS, convert_to_numpy=True, show_progress_bar=False).astype(np.float32)
    na = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = (a * b).sum(axis=1) / np.maximum(na, 1e-12)
    if cos.min() < 0.9999:
        raise OptionError("the ONNX export of this model does not reproduce sentence-transformers (cosine "
                          "{cos:.5f}). Index with {runtime} torch.", cos=float(cos.min()))
