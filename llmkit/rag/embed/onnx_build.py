"""Build the ONNX embedding graph of a BERT-family sentence-transformers model straight from its
safetensors weights, with the `onnx` helper API: no torch, no transformers, no sentence-transformers.

The graph is the one onnxruntime's transformer optimizer makes of a torch export (`onnx_export.py`),
written out fused from the start, so the runtime, the int8 quantization and the speed are the same:

    input_ids, token_type_ids, attention_mask (int64) -> Cast to int32
    EmbedLayerNormalization(word, position, token-type tables, LayerNorm) -> x, mask_index
    per layer:  Attention(x, [Wq|Wk|Wv], [bq|bk|bv], mask_index)           (com.microsoft)
                SkipLayerNormalization(a @ Wo, x, LayerNorm, bo)             -> h
                SkipLayerNormalization(BiasGelu(h @ Wi, bi) @ Wo2, h, LayerNorm, bo2) -> x
    last_hidden_state = x

RoBERTa-style position tables (positions start at pad_token_id + 1) have their first rows cut, so
position i of a right-padded sequence reads row i as the model does.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from llmkit.errors import BadInput
from llmkit.rag.embed.onnx_runtime import Spec

ARCHS = {"BertModel", "BertForMaskedLM", "RobertaModel", "XLMRobertaModel", "CamembertModel"}
ACTIVATIONS = {"Tanh": "tanh", "Identity": "identity", "ReLU": "relu", "Sigmoid": "sigmoid", "GELU": "gelu"}


def buildable(path: str) -> str | None:
    """Why this model directory cannot be built without torch (None: it can)."""
    from llmkit.gguf.convert.source import read_json, read_sentence_config

    cfg = read_json(os.path.join(path, "config.json")) or {}
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch not in ARCHS:
        return f"its architecture is {arch}"
    if cfg.get("position_embedding_type", "absolute") != "absolute" or cfg.get("hidden_act", "gelu") != "gelu":
        return "it uses relative positions or another activation than GELU"
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        return "it has no tokenizer.json"
    if not any(n.endswith(".safetensors") for n in os.listdir(path)):
        return "it has no safetensors weights"
    sc = read_sentence_config(path)
    if sc.others or not sc.pooling:
        return "its sentence-transformers modules are not Transformer, Pooling, Dense and Normalize"
    for d in sc.dense:
        if not os.path.isfile(os.path.join(d, "model.safetensors")):
            return "a Dense module has no safetensors weights"
    return None


def build(model_path: str, key: str, out: Path) -> Spec:
    """Write spec.json, tokenizer.json, dense-N.npz and model-fp32.onnx for `model_path` into `out`."""
    from llmkit.gguf.convert.source import read_json, open_source

    why = buildable(model_path)
    if why:
        raise BadInput(f"the model '{model_path}' cannot be built without torch: {why}.")
    src = open_source(model_path)
    cfg, sc, tok = src.config, src.sentence, src.tokenizer
    tc = src.tokenizer_config
    pad_token = str(tc.get("pad_token") or "[PAD]")
    vocab = {a["content"]: int(a["id"]) for a in tok.get("added_tokens", [])}
    model_vocab = tok["model"]["vocab"]
    if isinstance(model_vocab, dict):
        vocab = {**model_vocab, **vocab}
    unk = tc.get("unk_token")
    spec = Spec(dim=int(cfg["hidden_size"]) * len(sc.pooling), max_seq_length=int(sc.max_seq_length or cfg["max_position_embeddings"]),
                pooling=list(sc.pooling), normalize=sc.normalize, do_lower_case=sc.do_lower_case,
                include_prompt=sc.include_prompt, prompts=dict(sc.prompts),
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                pad_id=int(vocab.get(pad_token, cfg.get("pad_token_id") or 0)), pad_token=pad_token,
                pad_type_id=int(tc.get("pad_token_type_id", 0) or 0), padding_side=str(tc.get("padding_side", "right")),
                unk_id=vocab.get(unk) if isinstance(unk, str) else None, model_key=key)
    if spec.padding_side != "right":
        raise BadInput(f"the model '{model_path}' pads on the left, which the fused graph does not take.")
    for i, d in enumerate(sc.dense):
        dcfg = read_json(os.path.join(d, "config.json")) or {}
        from llmkit.gguf.convert.source import Safetensors

        w = Safetensors([os.path.join(d, "model.safetensors")])
        arrays = {"weight": w.get("linear.weight")}
        if "linear.bias" in w.names():
            arrays["bias"] = w.get("linear.bias")
        act = str(dcfg.get("activation_function", "torch.nn.modules.linear.Identity")).rsplit(".", 1)[-1]
        if act not in ACTIVATIONS:
            raise BadInput(f"a Dense module of '{model_path}' uses the activation {act}, which the ONNX runtime "
                           "does not reproduce.")
        np.savez(out / f"dense-{i}.npz", **arrays)
        spec.dense.append({"file": f"dense-{i}.npz", "activation": ACTIVATIONS[act]})
        spec.dim = int(arrays["weight"].shape[0])
    shutil.copyfile(os.path.join(model_path, "tokenizer.json"), out / "tokenizer.json")
    _graph(src, out / "model-fp32.onnx")
    (out / "spec.json").write_text(json.dumps(spec.to_dict(), indent=1), encoding="utf-8")
    return spec


def _weights(src) -> dict[str, np.ndarray]:
    """The encoder's tensors by their names without the model prefix (bert., roberta.)."""
    out = {}
    for name in src.weights.names():
        short = name
        for prefix in ("bert.", "roberta.", "model."):
            if short.startswith(prefix):
                short = short[len(prefix):]
        out[short] = name
    return out


class _Builder:
    """The graph's nodes and initializers in the order they are added, with the model's weights by short name."""

    def __init__(self, src):
        from onnx import helper, numpy_helper

        self.src, self.names = src, _weights(src)
        self.helper, self.numpy_helper = helper, numpy_helper
        self.inits, self.nodes = [], []

    def w(self, short: str) -> np.ndarray:
        """The weight tensor `short` (its name without the model prefix)."""
        if short not in self.names:
            raise BadInput(f"the model has no tensor '{short}'; it is not a plain BERT-family encoder.")
        return self.src.weights.get(self.names[short])

    def init(self, name: str, arr: np.ndarray) -> str:
        """Add `arr` as an fp32 initializer; its name."""
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(arr, np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], out: str, ms: bool = False, **attrs) -> str:
        """Add one node named for its single output (com.microsoft with `ms`); that output."""
        self.nodes.append(self.helper.make_node(op, inputs, [out], name=out, domain="com.microsoft" if ms else "",
                                                **attrs))
        return out


def _graph(src, dst: Path) -> None:
    """The fused BERT graph (module doc), saved with its weights beside it."""
    from onnx import TensorProto, helper

    cfg = src.config
    b = _Builder(src)
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    heads = int(cfg["num_attention_heads"])
    x = _embeddings(b, cfg, eps)
    n_layer = int(cfg["num_hidden_layers"])
    for i in range(n_layer):
        x = _layer(b, i, x, heads, eps, "last_hidden_state" if i == n_layer - 1 else f"l{i}_out_ln")
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
            for n in ("input_ids", "attention_mask", "token_type_ids")]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", int(cfg["hidden_size"])])
    graph = helper.make_graph(b.nodes, "bert", ints, [out], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = min(model.ir_version, 8)
    save_external(model, dst)


def _embeddings(b: _Builder, cfg: dict, eps: float) -> str:
    """The int32 casts of the inputs and the fused embedding lookup + LayerNorm; its output's name."""
    from onnx import TensorProto

    for n in ("input_ids", "token_type_ids", "attention_mask"):
        b.node("Cast", [n], f"{n}_int32", to=TensorProto.INT32)
    pos = b.w("embeddings.position_embeddings.weight")
    if cfg.get("model_type") in ("roberta", "xlm-roberta", "camembert"):  # positions start at pad_token_id + 1
        pos = pos[int(cfg.get("pad_token_id", 1)) + 1:]
    types = b.w("embeddings.token_type_embeddings.weight") if "embeddings.token_type_embeddings.weight" in b.names \
        else np.zeros((1, int(cfg["hidden_size"])), np.float32)
    b.nodes.append(b.helper.make_node(
        "EmbedLayerNormalization",
        ["input_ids_int32", "token_type_ids_int32", b.init("word_embeddings", b.w("embeddings.word_embeddings.weight")),
         b.init("position_embeddings", pos), b.init("token_type_embeddings", types),
         b.init("embeddings_ln_weight", b.w("embeddings.LayerNorm.weight")),
         b.init("embeddings_ln_bias", b.w("embeddings.LayerNorm.bias")), "attention_mask_int32"],
        ["embeddings", "mask_index"], name="embeddings", domain="com.microsoft", epsilon=eps))
    return "embeddings"


def _layer(b: _Builder, i: int, x: str, heads: int, eps: float, out: str) -> str:
    """Encoder layer `i` on `x`: fused attention, skip-LayerNorm, BiasGelu feed-forward, skip-LayerNorm into `out`."""
    w, init, node = b.w, b.init, b.node
    p = f"encoder.layer.{i}."
    qkv_w = np.concatenate([w(p + f"attention.self.{k}.weight").T for k in ("query", "key", "value")], axis=1)
    qkv_b = np.concatenate([w(p + f"attention.self.{k}.bias") for k in ("query", "key", "value")])
    a = node("Attention", [x, init(f"l{i}_qkv_w", qkv_w), init(f"l{i}_qkv_b", qkv_b), "mask_index"],
             f"l{i}_attention", ms=True, num_heads=heads)
    mm = node("MatMul", [a, init(f"l{i}_attn_out_w", w(p + "attention.output.dense.weight").T)], f"l{i}_attn_out")
    h = node("SkipLayerNormalization", [mm, x, init(f"l{i}_attn_ln_w", w(p + "attention.output.LayerNorm.weight")),
                                        init(f"l{i}_attn_ln_b", w(p + "attention.output.LayerNorm.bias")),
                                        init(f"l{i}_attn_out_b", w(p + "attention.output.dense.bias"))],
             f"l{i}_attn_ln", ms=True, epsilon=eps)
    up = node("MatMul", [h, init(f"l{i}_up_w", w(p + "intermediate.dense.weight").T)], f"l{i}_up")
    g = node("BiasGelu", [up, init(f"l{i}_up_b", w(p + "intermediate.dense.bias"))], f"l{i}_gelu", ms=True)
    down = node("MatMul", [g, init(f"l{i}_down_w", w(p + "output.dense.weight").T)], f"l{i}_down")
    return node("SkipLayerNormalization", [down, h, init(f"l{i}_out_ln_w", w(p + "output.LayerNorm.weight")),
                                           init(f"l{i}_out_ln_b", w(p + "output.LayerNorm.bias")),
                                           init(f"l{i}_down_b", w(p + "output.dense.bias"))],
                out, ms=True, epsilon=eps)


def save_external(model, dst: Path) -> None:
    """Save with the weights in `dst.data` beside the graph: ONNX Runtime then maps them instead of
    parsing them out of the protobuf, which makes a session start several times faster."""
    import onnx

    from llmkit.io import new_file_mode

    onnx.save_model(model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.name + ".data", size_threshold=1024)
    for p in (dst, dst.with_name(dst.name + ".data")):
        os.chmod(p, new_file_mode(dst.parent / ".none"))  # onnx writes the data file 0600
