"""Quantization quality rows for run.py (not a test): llmkit's size budgets against llama.cpp's mixes.

    python benchmarks/run.py --area quant-quality --quant-model BASE-F16.gguf --quant-imatrix IMATRIX

For each of llama.cpp's mixes Q3_K_M, IQ3_XXS and IQ2_M (--quick: Q3_K_M only): the `llama-quantize`
binary writes the mix with the imatrix, and `llmkit quant --target-size <that file's size> --imatrix`
(no other flag: the probes run on text the model writes itself, with an empty probe cache) writes
llmkit's file of the same size. Both files are scored against the F16 base on the same evaluation
text (Python's standard library sources, a text neither side calibrated on) with `llmkit quant ppl
--kld` (llama-perplexity's statistics, tested equal to the binary's): rows qq-<mix>-kld give mean
KLD, PPL and the ratio. Rows qq-<mix>-time time both commands as whole processes, clock outside,
alternating; Q3_K_M's with the median of 3 (the issue's "budget within 3x llama-quantize"), the
others one run a side (minutes each).

Quality figures do not depend on load; the time rows do. About 45 minutes on 2 cores (--quick: 20).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import PY, Cmd, Row, cmds_of, compare, llama_bin, rss, run_once, walls  # noqa: E402

MIXES = ("Q3_K_M", "IQ3_XXS", "IQ2_M")
EVAL_CTX, EVAL_CHUNKS = 256, 16


def eval_text(work: str) -> str:
    """The first 600k characters of Python's standard library sources (another text than the imatrix's)."""
    path = os.path.join(work, "eval.txt")
    stdlib = os.path.dirname(os.__file__)
    text = "".join(open(p, encoding="utf-8", errors="replace").read() for p in sorted(glob.glob(os.path.join(stdlib, "*.py"))))
    open(path, "w", encoding="utf-8").write(text[:600_000])
    return path


def kld(path: str, base: str, work: str) -> dict:
    out = os.path.join(work, "kld.json")
    run_once(Cmd("kld", [PY, "-m", "llmkit", "-q", "quant", "ppl", "-m", path, "--kld", base, "--json"], stdout=out))
    return json.loads(open(out, encoding="utf-8").read())


def kld_cells(ka: dict, kb: dict) -> tuple[str, str, str]:
    """The anchor, llmkit and ratio cells of a KLD row from two `quant ppl --kld --json` reports."""
    def cell(k):
        return f"KLD {k['kld']['mean']:.4f} ± {k['kld']['uncertainty']:.4f}, PPL {k['ppl']['value']:.4f}"
    return cell(ka), cell(kb), f"{kb['kld']['mean'] / ka['kld']['mean']:.2f}× llama.cpp's KLD"


def kld_command(base: str) -> str:
    return f"kld: `python -m llmkit quant ppl -m FILE --kld {base} --json`"


def rows(cfg):
    q = llama_bin("llama-quantize")
    src, imx = cfg.quant_model, cfg.quant_imatrix
    title = "llmkit --target-size vs llama.cpp's mixes (quality at the same size)"
    if not (q and src and imx):
        why = "llama-quantize not built (scripts/build_llama_server.sh)" if not q else \
            "give --quant-model BASE-F16.gguf and --quant-imatrix IMATRIX"
        return title, [why], []
    work = cfg.tmp("quant-quality")
    text = eval_text(work)
    base = os.path.join(work, "base.kld")
    mk_base = Cmd("setup: base log-probabilities", [PY, "-m", "llmkit", "-q", "quant", "ppl", "-m", src, "--save-logits",
                                                    base, text, "-c", EVAL_CTX, "--chunks", EVAL_CHUNKS])
    run_once(mk_base, timeout=4 * 3600)
    cache = os.path.join(work, "cache")  # an LLMKIT_CACHE of its own: no probes from an earlier run
    probes = os.path.join(cache, "quant-probes")
    from llmkit.config import cache_dir

    numba_cache = os.environ.get("NUMBA_CACHE_DIR") or str(cache_dir("numba"))  # compiled kernels stay warm
    out = []
    for mix in cfg.pick(MIXES, MIXES[:1], MIXES[:1]):
        ref, ours = os.path.join(work, f"llamacpp-{mix}.gguf"), os.path.join(work, f"llmkit-{mix}.gguf")
        a = Cmd("llama-quantize", [q, "--imatrix", imx, src, ref, mix, 2])
        first = run_once(a, timeout=4 * 3600)  # the budget is this file's size
        size = os.path.getsize(ref)
        b = Cmd("llmkit", [PY, "-m", "llmkit", "-q", "quant", src, "--target-size", size, "--imatrix", imx, "-o", ours,
                           "--threads", 2], env={"LLMKIT_CACHE": cache, "NUMBA_CACHE_DIR": numba_cache})
        fresh = lambda label: shutil.rmtree(probes, ignore_errors=True)  # noqa: E731 - every llmkit run probes anew
        if mix == "Q3_K_M" and not cfg.smoke:  # the first run was the warm-up: three alternating rounds
            runs = compare([a, b], cfg, warmup=False, min_runs=3, between=fresh)
        else:  # minutes a run: the first llama-quantize run and one llmkit run
            fresh(b.label)
            runs = {a.label: [first], b.label: [run_once(b, timeout=4 * 3600)]}
        wa, wb = walls(runs[a.label]), walls(runs[b.label])
        out.append(Row(f"qq-{mix.lower()}-time", f"{mix} + imatrix vs --target-size {size:,} B --imatrix, "
                       f"{os.path.basename(src)}, 2 threads, whole process (wall, peak RSS)",
                       f"{wa.fmt()}, {rss(runs[a.label]):.0f} MB", f"{wb.fmt()}, {rss(runs[b.label]):.0f} MB",
                       f"{wb.median / wa.median:.2f}× llama-quantize's time",
                       f"llmkit's file {os.path.getsize(ours):,} B (budget {size:,} B)", cmds_of(a, b)))
        ka, kb = kld(ref, base, work), kld(ours, base, work)
        out.append(Row(f"qq-{mix.lower()}-kld", f"mean KLD to the F16 base at {mix}'s size ({size / 2**20:.1f} MiB), "
                       f"{EVAL_CHUNKS} × {EVAL_CTX} tokens of Python's stdlib", *kld_cells(ka, kb),
                       f"same top token {ka['same_top_p']['value']:.2%} vs {kb['same_top_p']['value']:.2%}",
                       cmds_of(mk_base, a, b) + [kld_command(base)]))
        os.unlink(ref), os.unlink(ours)
    setup = [f"base: {src}; imatrix: {imx}; evaluation text: the first 600k characters of Python's standard "
             f"library (*.py), {EVAL_CHUNKS} chunks of {EVAL_CTX} tokens",
             "llama.cpp side: the llama-quantize binary built by scripts/build_llama_server.sh, same imatrix, 2 threads",
             "llmkit side: --target-size of the llama.cpp file's size and --imatrix, nothing else (probes on the "
             "model's own text; the probe cache emptied before every run)"]
    return title, setup, out
