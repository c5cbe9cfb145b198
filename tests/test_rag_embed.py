"""The ONNX embedding runtime: parity with sentence-transformers on real text (the packaged MiniLM) and
on tiny models with every pooling mode, Dense heads and prompts; int8; indexes searchable by either
runtime; no torch/transformers/sentence-transformers on the query path; damaged caches rebuilt."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import llmkit_env, run_cli, run_subprocess

pytest.importorskip("onnxruntime")
pytest.importorskip("sentence_transformers")
HEAVY = ("torch", "transformers", "sentence_transformers")


@pytest.fixture(scope="module")
def paragraphs(kernel_docs):
    paras = [p.strip() for p in kernel_docs.read_text(encoding="utf-8").split("\n\n") if len(p.strip()) > 40]
    rng = np.random.default_rng(0)
    return [paras[i] for i in rng.choice(len(paras), 120, replace=False)]


def test_fp32_onnx_equals_sentence_transformers_on_real_text(paragraphs):
    from llmkit.rag.embed.embedder import load_embedder

    onnx = load_embedder(None, "onnx", "fp32")
    torch_ = load_embedder(None, "torch", "fp32")
    a, b = onnx.passages(paragraphs), torch_.passages(paragraphs)
    cos = (a * b).sum(axis=1)
    assert cos.min() >= 0.99999 and np.abs(a - b).max() < 1e-5
    q = ["How does the kernel allocate memory?"]
    assert float(onnx.queries(q)[0] @ torch_.queries(q)[0]) >= 0.99999
    assert onnx.encoder.spec.fused  # onnxruntime's optimizer fused the attention
    for t in ("國立臺灣大學位於臺北市", "memory pages", "kmalloc() ÆØÅ"):
        assert onnx.token_ids(t) == torch_.token_ids(t)
    assert onnx.unknown_share("國立臺灣大學位於臺北市") > 0.5 and onnx.unknown_share("memory pages") == 0


def test_bulk_calls_switch_to_packed_weights_with_the_same_vectors(paragraphs):
    from llmkit.rag.embed.embedder import load_embedder
    from llmkit.rag.embed.onnx_runtime import BULK_TEXTS, OnnxEncoder

    enc = OnnxEncoder(load_embedder(None, "onnx", "fp32").encoder.dir, "fp32")
    few = enc.encode(paragraphs[:8])
    assert not enc.packed  # a query keeps the session that maps the weights
    texts = (paragraphs * (BULK_TEXTS // len(paragraphs) + 1))[:BULK_TEXTS]
    many = enc.encode(texts)
    assert enc.packed
    assert np.abs(many[:8] - few).max() < 1e-5 and np.abs(many[:8] - enc.encode(paragraphs[:8])).max() < 1e-5


def test_bf16_bulk_calls_run_openvino_within_rounding_of_fp32(paragraphs):
    """bf16: queries on ONNX Runtime's fp32 session (the same vectors), bulk calls on OpenVINO's bf16
    products (within rounding of fp32; on a CPU without bf16 units OpenVINO computes fp32)."""
    from llmkit.rag.embed.embedder import load_embedder
    from llmkit.rag.embed.onnx_runtime import BULK_TEXTS, OnnxEncoder
    from llmkit.rag.embed.openvino_runtime import OpenVinoSession, native_bf16

    directory = load_embedder(None, "onnx", "fp32").encoder.dir
    ref = OnnxEncoder(directory, "fp32").encode(paragraphs[:8])
    enc = OnnxEncoder(directory, "bf16")
    assert np.abs(enc.encode(paragraphs[:8]) - ref).max() < 1e-5 and not enc.packed
    many = enc.encode((paragraphs * (BULK_TEXTS // len(paragraphs) + 1))[:BULK_TEXTS])
    assert isinstance(enc.session_for(BULK_TEXTS), OpenVinoSession)
    assert np.abs(enc.encode(paragraphs[:8]) - ref).max() < 1e-5  # later queries: fp32 again
    cos = (many[:8] * ref).sum(axis=1)
    assert cos.min() > 0.999, cos
    if native_bf16():
        import openvino as ov

        assert enc.bulk.compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.bf16
        assert np.abs(many[:8] - ref).max() > 1e-6  # really bf16 products
    assert any((directory / "openvino").iterdir())  # the compiled graph is cached for the next index


def test_bf16_falls_back_to_onnx_runtime_when_openvino_cannot_compile(monkeypatch):
    import onnxruntime as ort

    from llmkit.rag.embed import openvino_runtime
    from llmkit.rag.embed.embedder import load_embedder
    from llmkit.rag.embed.onnx_runtime import BULK_TEXTS, OnnxEncoder

    def refuse(*a, **k):
        raise RuntimeError("Exception from src/inference: unsupported operation")

    monkeypatch.setattr(openvino_runtime, "OpenVinoSession", refuse)
    enc = OnnxEncoder(load_embedder(None, "onnx", "fp32").encoder.dir, "bf16")
    assert isinstance(enc.session_for(BULK_TEXTS), ort.InferenceSession) and enc.packed


def test_new_indexes_take_bf16_where_the_cpu_has_it(monkeypatch):
    from llmkit.rag.embed import models, openvino_runtime

    for native, want in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(openvino_runtime, "native_bf16", lambda native=native: native)
        assert models.default_precision(None, "onnx") == want
        assert models.default_precision(None, "torch") == "fp32"
        assert models.default_precision("/m/embed.GGUF", "onnx") == "fp32"


def test_a_cpu_without_amx_keeps_fp32(monkeypatch):
    from llmkit import native
    from llmkit.rag.embed import openvino_runtime

    monkeypatch.setattr(native, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert openvino_runtime.native_bf16() is False


def test_int8_is_close_to_fp32(paragraphs):
    from llmkit.rag.embed.embedder import load_embedder

    a = load_embedder(None, "onnx", "fp32").passages(paragraphs)
    c = load_embedder(None, "onnx", "int8").passages(paragraphs)
    cos = (a * c).sum(axis=1)
    assert cos.mean() > 0.98 and cos.min() > 0.93
    assert not np.array_equal(a, c)  # really another graph


@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory):
    """Tiny random sentence-transformers models with each pooling mode, a Dense head and prompts."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from tinyst import tiny_bert

    root = tmp_path_factory.mktemp("tinyst")
    tiny_bert(root, seed=1)
    out = {}
    for name, pooling, dense in [("mean", "mean", False), ("cls_max", ("cls", "max"), False),
                                 ("weighted_last", ("weightedmean", "lasttoken"), False),
                                 ("sqrt_dense", "mean_sqrt_len_tokens", True)]:
        tm = models.Transformer(str(root / "bert"), max_seq_length=24)
        mods = [tm, models.Pooling(32, pooling_mode=pooling)]
        if dense:
            mods.append(models.Dense(mods[-1].get_embedding_dimension(), 16, activation_function=torch.nn.Tanh()))
        st = SentenceTransformer(modules=mods, device="cpu",
                                 prompts={"query": "query: ", "document": "passage: "} if dense else None)
        st.save(str(root / name))
        out[name] = root / name
    return out


@pytest.mark.parametrize("name", ["mean", "cls_max", "weighted_last", "sqrt_dense"])
def test_tiny_models_every_pooling_mode_dense_and_prompts(tiny_st, name, paragraphs):
    from llmkit.rag.embed.embedder import load_embedder

    texts = paragraphs[:20] + ["x", "  padded with spaces  "]  # long ones are truncated at 24 tokens
    a = load_embedder(str(tiny_st[name]), "onnx").passages(texts)
    b = load_embedder(str(tiny_st[name]), "torch").passages(texts)
    assert (a * b).sum(axis=1).min() >= 0.99999
    if name == "sqrt_dense":
        emb = load_embedder(str(tiny_st[name]), "onnx")
        assert (emb.query_prompt, emb.passage_prompt) == ("query: ", "passage: ")
        assert a.shape[1] == 16


def _heavy_after(args, env=None):
    code = ("import sys\nfrom llmkit.cli import main\ncode = None\n"
            f"try:\n    main({args!r})\nexcept SystemExit as e:\n    code = e.code\n"
            f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules], 'EXIT', code, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=llmkit_env(**(env or {})))
    return p


@pytest.fixture(scope="module")
def small_index(tmp_path_factory, paragraphs):
    root = tmp_path_factory.mktemp("emb")
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(paragraphs[:60])))
    idx = root / "idx"
    r = run_cli(["rag", "index", str(idx), str(docs)])
    assert r.exit_code == 0, r.stderr
    return root, idx, docs


def test_query_path_imports_no_torch(small_index):
    _, idx, _ = small_index
    for mode in ("hybrid", "dense", "bm25"):
        p = _heavy_after(["rag", "query", str(idx), "memory allocation in the kernel", "--mode", mode, "-k", "2"])
        assert "HEAVY [] EXIT None" in p.stderr, p.stderr[-1500:]
        assert p.stdout.count("docs.jsonl#p") == 2


def test_answer_reaches_the_llm_without_torch(small_index, tmp_path):
    pytest.importorskip("llama_cpp")
    from ggufmake import write_tiny_llama

    _, idx, _ = small_index
    model = write_tiny_llama(tmp_path / "tiny.gguf", seed=3, n_ctx=2048)
    p = _heavy_after(["rag", "answer", str(idx), "How is memory tracked?", "--llm", str(model), "-n", "4", "-k", "2"])
    assert "HEAVY [] EXIT None" in p.stderr, p.stderr[-1500:]
    assert "Sources:" in p.stdout


def test_index_of_one_runtime_is_searchable_by_the_other(small_index, tmp_path):
    root, idx, docs = small_index
    idx_t = tmp_path / "idx-torch"
    assert run_cli(["rag", "index", str(idx_t), str(docs), "--runtime", "torch"]).exit_code == 0
    v_onnx = np.load(next(idx.glob("gen-*")) / "vectors.npy")
    v_torch = np.load(next(idx_t.glob("gen-*")) / "vectors.npy")
    assert (v_onnx * v_torch).sum(axis=1).min() >= 0.99999
    for q in ("memory allocation", "device driver interrupts", "file system locking"):
        runs = []
        for index in (idx, idx_t):
            for rt in ("onnx", "torch"):
                r = run_cli(["rag", "query", str(index), q, "--mode", "dense", "-k", "5", "--jsonl", "--runtime", rt])
                assert r.exit_code == 0, r.stderr
                runs.append([json.loads(x)["doc"] for x in r.stdout.splitlines()])
        assert all(r == runs[0] for r in runs)


def test_int8_index_records_precision_and_refuses_mixing(small_index, tmp_path):
    _, idx, docs = small_index
    idx8 = tmp_path / "idx8"
    r = run_cli(["rag", "index", str(idx8), str(docs), "--embed-precision", "int8", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads((idx8 / "manifest.json").read_text())["embed_precision"] == "int8"
    hits = run_cli(["rag", "query", str(idx8), "memory allocation", "--mode", "dense", "-k", "3"])
    assert hits.exit_code == 0 and hits.stdout.count("docs.jsonl#p") == 3
    have = json.loads((idx / "manifest.json").read_text())["embed_precision"]
    r = run_cli(["rag", "index", str(idx), str(docs), "--embed-precision", "int8"])
    assert r.exit_code == 1 and f"holds {have} embeddings" in r.stderr
    r = run_cli(["rag", "index", str(idx8), str(docs), "--runtime", "torch"])
    assert r.exit_code == 0  # nothing new to embed; int8 with torch would be refused only when embedding


def test_fp32_and_bf16_vectors_share_an_index(small_index, tmp_path):
    """bf16 vectors differ from fp32 ones only by rounding: either may extend the other's index."""
    _, _, docs = small_index
    for first, then in (("fp32", "bf16"), ("bf16", "fp32")):
        idx = tmp_path / f"idx-{first}"
        r = run_cli(["rag", "index", str(idx), str(docs), "--embed-precision", first])
        assert r.exit_code == 0, r.stderr
        more = tmp_path / f"more-{first}.jsonl"
        more.write_text(json.dumps({"id": "extra", "text": "Huge pages cut TLB misses for large mappings."}) + "\n")
        r = run_cli(["rag", "index", str(idx), str(more), "--embed-precision", then])
        assert r.exit_code == 0, r.stderr
        assert json.loads((idx / "manifest.json").read_text())["embed_precision"] == first
        hits = run_cli(["rag", "query", str(idx), "huge pages and the TLB", "--mode", "dense", "-k", "1", "--jsonl"])
        assert hits.exit_code == 0 and json.loads(hits.stdout.splitlines()[0])["doc"].endswith("#extra"), hits.stdout


def test_damaged_and_stale_exports_are_rebuilt(small_index):
    from llmkit.rag.embed.embedder import _LOADED
    from llmkit.rag.embed.models import resolve_model
    from llmkit.rag.embed.onnx_runtime import export_path, model_key

    _, idx, _ = small_index
    d = export_path(model_key(resolve_model(None)))
    (d / "model-fp32.onnx").write_bytes(b"garbage")
    _LOADED.clear()
    p = run_subprocess(["rag", "query", idx, "memory", "--mode", "dense", "-k", "1"], timeout=300, text=True)
    assert p.returncode == 0 and "docs.jsonl#p" in p.stdout, p.stderr
    spec = json.loads((d / "spec.json").read_text())
    spec["version"] = 999
    (d / "spec.json").write_text(json.dumps(spec))
    p = run_subprocess(["rag", "query", idx, "memory", "--mode", "dense", "-k", "1"], timeout=300, text=True)
    assert p.returncode == 0 and "docs.jsonl#p" in p.stdout, p.stderr
    assert json.loads((d / "spec.json").read_text())["version"] == 1


def test_model_directory_that_cannot_be_exported(tmp_path, small_index):
    _, _, docs = small_index
    bad = tmp_path / "notamodel"
    bad.mkdir()
    (bad / "README.md").write_text("nothing here")
    r = run_cli(["rag", "index", str(tmp_path / "i"), str(docs), "--model", str(bad)])
    assert r.exit_code == 1 and "not a sentence-transformers model directory" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    half = tmp_path / "half"
    half.mkdir()
    (half / "config.json").write_text('{"model_type": "bert"}')
    r = run_cli(["rag", "index", str(tmp_path / "j"), str(docs), "--model", str(half)])
    assert r.exit_code == 1 and "cannot load the embedding model" in r.stderr


def test_graph_built_from_safetensors_equals_the_torch_export(tmp_path, paragraphs):
    """The torch-free build writes the graph onnxruntime's optimizer makes of a torch export: the same
    fused operators in the same order, the same vectors, fp32 and int8 (the same quantizer on it)."""
    import collections

    import onnx

    from llmkit.rag.embed.models import resolve_model
    from llmkit.rag.embed.onnx_build import build
    from llmkit.rag.embed.onnx_export import _quantize_int8, torch_export
    from llmkit.rag.embed.onnx_runtime import OnnxEncoder

    path = resolve_model(None)
    built, exported = tmp_path / "built", tmp_path / "exported"
    built.mkdir(), exported.mkdir()
    build(path, "k", built)
    _quantize_int8(built / "model-fp32.onnx", built)
    torch_export(path, "k", exported, "int8")

    def ops(d, name):
        return [(n.op_type, n.domain) for n in onnx.load(str(d / name), load_external_data=False).graph.node
                if n.op_type not in ("Cast", "Identity")]

    for name in ("model-fp32.onnx", "model-int8.onnx"):
        assert ops(built, name) == ops(exported, name)
    assert collections.Counter(o for o, _ in ops(built, "model-fp32.onnx"))["Attention"] == 6
    for precision, tol in (("fp32", 1e-5), ("int8", 2e-3)):
        a = OnnxEncoder(built, precision, 1).encode(paragraphs[:40], batch_size=16)
        b = OnnxEncoder(exported, precision, 1).encode(paragraphs[:40], batch_size=16)
        assert np.abs(a - b).max() < tol, precision
    spec_b, spec_e = (json.loads((d / "spec.json").read_text()) for d in (built, exported))
    spec_e["prompts"] = {k: v for k, v in spec_e["prompts"].items() if v}  # sentence-transformers' empty defaults
    assert spec_b == {**spec_e, "input_names": ["input_ids", "attention_mask", "token_type_ids"]}
