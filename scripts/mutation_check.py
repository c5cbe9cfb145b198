"""Mutation check: undo one guarded behaviour at a time and show that a test fails (not a test).

    python scripts/mutation_check.py            # every mutation (~10 minutes on 2 cores)
    python scripts/mutation_check.py --list     # what each one breaks, and the tests that must catch it
    python scripts/mutation_check.py NAME ...   # only these

Each mutation replaces one exact piece of source (it must occur exactly once, so a refactor that
moves the code makes the check fail loudly instead of mutating nothing) in a copy of the working
tree, then runs the tests named for it there. The copy keeps your tree untouched, so this can run
beside anything. A mutation is *killed* when pytest reports failed tests, *survived* when they all
pass (the tests do not guard that behaviour), and an *error* when pytest could not run them (an
import error is not a kill). Before any mutation the named tests run once unmutated and must pass.
Exit status 0 only when every mutation is killed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str  # the behaviour the mutation removes
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


M = Mutation
MUTATIONS = [
    # the precedence fixes: these tests used to pass whatever the exit code or the graph's vocabulary
    M("simulate-zero-length", "kv simulate refuses a request of zero output tokens", "llmkit/kv/trace.py",
      "if r.prompt < 1 or r.output < 1 or", "if r.prompt < 1 or r.output < 0 or",
      ("tests/test_kv_simulate.py::test_cli_simulate_trace_file_json_and_plot",)),
    M("graph-single-chunk-entities", "the entity graph links only entities seen in two chunks or more",
      "llmkit/rag/index/graph.py", "if 2 <= d <= max_df", "if 1 <= d <= max_df",
      ("tests/test_rag_graph.py::test_graph_follows_incremental_updates",)),
    # assertions on output instead of exit codes
    M("chat-template-no-assistant-turn", "the chat template opens the assistant's turn", "llmkit/llama/chat.py",
      "add_generation_prompt=True", "add_generation_prompt=False",
      ("tests/test_generate.py::test_chat_template_renders_exact_prompt",)),
    M("rerank-ascending", "re-ranked hits come best first", "llmkit/rag/retrieve/pipeline.py",
      "key=lambda x: (-x[1].rerank, x[0])", "key=lambda x: (x[1].rerank, x[0])",
      ("tests/test_rag_llm_steps.py::test_cross_encoder_order_equals_its_own_predict",)),
    M("hyde-not-used", "HyDE's passage reaches the dense query vector", "llmkit/rag/retrieve/pipeline.py",
      "v = qvecs[0] + emb.passages([hyde_doc])[0]", "v = qvecs[0] + 0 * emb.passages([hyde_doc])[0]",
      ("tests/test_rag_llm_steps.py::test_llm_steps_reach_the_retrievers_exactly",)),
    M("rewrites-dropped", "--rewrite's paraphrases are searched", "llmkit/rag/retrieve/pipeline.py",
      "variants += alts", "variants += alts[:0]",
      ("tests/test_rag_llm_steps.py::test_llm_steps_reach_the_retrievers_exactly",)),
    M("subqueries-dropped", "--subqueries' queries are searched", "llmkit/rag/retrieve/pipeline.py",
      "variants += subs", "variants += subs[:0]",
      ("tests/test_rag_llm_steps.py::test_llm_steps_reach_the_retrievers_exactly",)),
    M("server-restore-erases", "kv restore --server restores the slot (the continuation uses its KV)",
      "llmkit/commands/kv/slots.py", '_server_slot(server, slot_id, "restore", slot)',
      '_server_slot(server, slot_id, "erase", slot)',
      ("tests/test_kv_server.py::test_restored_slot_continues_exactly_as_without_save_restore",)),
    # reference checks: llama.cpp's sampler chain, llama-imatrix, llama-quantize, HF tokenizers, rank-bm25
    M("top-k-drops-kth", "top-k keeps k candidates as llama.cpp does", "llmkit/llama/sampling.py",
      "keep &= x >= kth", "keep &= x > kth",
      ("tests/test_sampling_reference.py::test_distribution_equals_llama_cpp_sampler_chain",)),
    M("repeat-penalty-inverted", "the repeat penalty lowers repeated tokens as llama.cpp does",
      "llmkit/llama/sampling.py",
      "np.where(v > 0, v / params.repeat_penalty, v * params.repeat_penalty)",
      "np.where(v > 0, v * params.repeat_penalty, v / params.repeat_penalty)",
      ("tests/test_sampling_reference.py::test_distribution_equals_llama_cpp_sampler_chain",)),
    M("rejection-residual", "a rejected draft token is resampled from max(0, p - q)", "llmkit/llama/speculative.py",
      "np.maximum(p[i] - q[i], 0.0)", "np.maximum(p[i] - 0.5 * q[i], 0.0)",
      ("tests/test_generate_pure.py::test_rejection_sampling_preserves_target_distribution",
       "tests/test_speculative_reference.py::test_rejection_sampling_keeps_a_real_models_distribution")),
    M("imatrix-abs", "the imatrix sums squared activations as llama-imatrix does",
      "llmkit/quant/calibration/imatrix.py", "acc += (x * x).sum(axis=0)", "acc += (x * abs(x)).sum(axis=0)",
      ("tests/test_quant_binary.py::test_imatrix_equals_llama_imatrix",)),
    M("q4_k-kernel-search", "the compiled Q4_K kernel searches scales as ggml does (19 steps, not 20)",
      "llmkit/quant/formats/_kernels.py", "_k4_head(x, qw, weighted, out, i, 15, F(-1.0), F(0.1), 20, scr)",
      "_k4_head(x, qw, weighted, out, i, 15, F(-1.0), F(0.1), 19, scr)",
      ("tests/test_quant_binary.py::test_f16_base_through_the_compiled_conversion",)),
    M("bpe-merge-rank", "BPE applies the lowest-ranked merge first, as HF tokenizers does", "llmkit/tokenize/bpe/bpe.py",
      "if r is not None and (best is None or r[0] < best[0]):",
      "if r is not None and (best is None or r[0] > best[0]):",
      ("tests/test_tokenize_algorithms.py::test_bpe_matches_hf_merges_and_ids",
       "tests/test_tokenize_algorithms.py::test_saved_file_loads_in_hf_and_encodes_identically")),
    M("bm25-idf", "BM25's idf is rank-bm25's log((N - df + 0.5) / (df + 0.5))", "llmkit/rag/index/bm25.py",
      "idf = np.log(n - df + 0.5) - np.log(df + 0.5)", "idf = np.log(n - df + 1.0) - np.log(df + 0.5)",
      ("tests/test_rag_bm25.py::test_scores_equal_rank_bm25",)),
    # README bounds = test bounds
    M("ray-vectors-rounded", "Ray's vectors are bit-identical to a local run", "llmkit/rag/embed/ray_embed.py",
      '"vec": np.asarray(vecs, np.float32)', '"vec": np.asarray(vecs, np.float32) * np.float32(1 + 2**-20)',
      ("tests/test_readme_bounds.py::test_ray_vectors_are_bit_identical_to_local",)),
    M("onnx-half-precision", "fp32 ONNX vectors are within 1e-6 of sentence-transformers'",
      "llmkit/rag/embed/onnx_runtime.py", "return normalize(v) if s.normalize else v",
      "return normalize(v.astype(np.float16).astype(np.float32)) if s.normalize else v",
      ("tests/test_readme_bounds.py::test_fp32_onnx_within_1e_6_of_sentence_transformers",)),
    # options that had no test
    M("json-schema-ignored", "constrain --json-schema constrains the output to that schema", "llmkit/llama/constrained.py",
      "return LlamaGrammar.from_json_schema(self.json_schema, verbose=False)",
      "return LlamaGrammar.from_json_schema('{\"type\": \"object\"}', verbose=False)",
      ("tests/test_generate.py::test_cli_json_schema_output_parses_and_matches",)),
    M("norm-minmax-offset", "--norm minmax maps the list's scores onto [0, 1]", "llmkit/rag/retrieve/fusion.py",
      "return (s - lo) / (hi - lo) if hi > lo else np.ones_like(s)\n    if how == \"z\":",
      "return (s - lo + 1e-3) / (hi - lo) if hi > lo else np.ones_like(s)\n    if how == \"z\":",
      ("tests/test_rag_llm_steps.py::test_norm_scores_equal_normalised_rank_bm25",)),
    M("gpu-gb-budget", "kv simulate -m --gpu-gb turns GPU memory minus the weights into tokens", "llmkit/kv/plan.py",
      "return int(budget_bytes // p.kv_bytes_per_token)", "return int(budget_bytes // (2 * p.kv_bytes_per_token))",
      ("tests/test_kv_simulate.py::test_budget_from_model_bytes_and_gpu_memory",)),
    M("include-inverted", "rag index --glob keeps only matching files", "llmkit/rag/read/files.py",
      "if opts.include and not any(", "if opts.include and any(",
      ("tests/test_rag_index_options.py::test_globs_and_meta",)),
    # the guards themselves
    M("ci-skips-pass", "under CI=true a skipped test fails the run", "tests/conftest.py",
      "session.exitstatus = pytest.ExitCode.TESTS_FAILED", "session.exitstatus = session.exitstatus",
      ("tests/test_ci_skips.py",)),
    M("untested-option", "every option in --help is passed by some test", "llmkit/commands/kv/__init__.py",
      '@click.option("--gpu-gb",', '@click.option("--mutant-flag-no-test-passes", is_flag=True)\n@click.option("--gpu-gb",',
      ("tests/test_options_coverage.py",)),
]


def copy_tree(dst: str) -> None:
    """The working tree as git sees it (tracked and untracked, not ignored), plus the ignored model/data dirs."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, rel))
    for rel in ("models", "data"):  # large, read-only inputs some tests use
        if os.path.isdir(os.path.join(ROOT, rel)):
            os.symlink(os.path.join(ROOT, rel), os.path.join(dst, rel))


def pytest(tree: str, tests, env, workers: str = "0", timeout: float = 1800) -> tuple[int, str]:
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", workers, *tests]
    try:
        p = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    out = (p.stdout + p.stderr).strip()
    return p.returncode, out.splitlines()[-1] if out else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="run only these mutations")
    ap.add_argument("--list", action="store_true", help="list the mutations and their tests")
    a = ap.parse_args()
    unknown = set(a.names) - {m.name for m in MUTATIONS}
    if unknown:
        ap.error(f"no mutation named {', '.join(sorted(unknown))} (see --list)")
    chosen = [m for m in MUTATIONS if not a.names or m.name in a.names]
    if a.list:
        for m in chosen:
            print(f"{m.name}: {m.what}\n    {m.path}\n    " + "\n    ".join(m.tests))
        return
    tree = tempfile.mkdtemp(prefix="llmkit-mutation-")
    try:
        copy_tree(tree)
        env = {k: v for k, v in os.environ.items() if k != "CI"}  # a skip must read as "survived", not fail
        env.update(PYTHONPATH=tree, NUMBA_CACHE_DIR=os.path.join(tree, ".numba-cache"), PYTHONDONTWRITEBYTECODE="1")
        for m in chosen:  # every mutation must apply to exactly one place
            n = open(os.path.join(tree, m.path), encoding="utf-8").read().count(m.old)
            if n != 1:
                sys.exit(f"mutation {m.name}: the source to replace occurs {n} times in {m.path} (must be once)")
        tests = sorted({t for m in chosen for t in m.tests})
        t0 = time.perf_counter()
        rc, tail = pytest(tree, tests, env, workers="auto")
        print(f"unmutated: {len(tests)} test ids, rc {rc} ({tail}), {time.perf_counter() - t0:.0f} s", flush=True)
        if rc != 0:
            sys.exit("the named tests must pass before any mutation; fix them first")
        results = []
        for m in chosen:
            path = os.path.join(tree, m.path)
            original = open(path, encoding="utf-8").read()
            t0 = time.perf_counter()
            try:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original.replace(m.old, m.new))
                rc, tail = pytest(tree, m.tests, env)
            finally:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original)
            verdict = "killed" if rc == 1 else "survived" if rc == 0 else "error"
            results.append(verdict)
            print(f"{verdict:8} {m.name:32} {time.perf_counter() - t0:5.0f} s  {tail}", flush=True)
        bad = [m.name for m, v in zip(chosen, results) if v != "killed"]
        print(f"{results.count('killed')} of {len(chosen)} mutations killed" + (f"; not killed: {', '.join(bad)}" if bad else ""))
        sys.exit(1 if bad else 0)
    finally:
        shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    main()
