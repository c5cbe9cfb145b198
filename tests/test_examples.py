"""Every script in examples/ runs from a fresh clone: the repository's files alone (no folder beside it,
no models or data fetched), the installed llmkit on PATH, LLMKIT_EXAMPLE_QUICK=1 for smaller inputs
(and, for the quant scripts, a tiny model as their MODEL argument: quantizing SmolLM2 takes minutes);
and the shipped Cranfield copy converts to the files the benchmark figures were measured on."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "examples").glob("*.sh") if not p.name.startswith("_"))
# a line each script prints when its last steps worked (the exit status covers the rest: set -e, pipefail)
EXPECT = {
    "generate_pipeline.sh": "number:",
    "kv_pipeline.sh": "slot",
    "quant_budget_pipeline.sh": "gptq.gguf",
    "quant_pipeline.sh": "largest RMSE:",
    "rag_code_pipeline.sh": "llmkit/",
    "rag_pipeline.sh": "nDCG@10",
    "rag_tune_pipeline.sh": "fusion",
    "scale_pipeline.sh": "chat ",
    "tokenize_pipeline.sh": "The kernel schedules tasks.",
}
TINY_MODEL = {"quant_pipeline.sh", "quant_budget_pipeline.sh"}


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The checkout's files as a clone would have them (tracked, plus new files not yet committed and not
    ignored), in a folder with nothing beside it."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    dest = tmp_path_factory.mktemp("fresh") / "llmkit"
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():  # a tracked file deleted in the working tree is not there
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    assert not (dest.parent / "shared").exists() and (dest / "examples" / "data" / "cranfield").is_dir()
    return dest


def test_every_example_is_tested():
    assert set(SCRIPTS) == set(EXPECT), "give the new example script a line in EXPECT"


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_from_a_fresh_clone(clone, script, tmp_path):
    args = []
    if script in TINY_MODEL:  # rows of 256 and 512 so the K-quant mixes apply, as on a real model
        from ggufmake import write_tiny_llama

        args = [str(write_tiny_llama(tmp_path / "tiny.gguf", n_embd=256, n_ff=512, n_layer=2, seed=1))]
    bindir = os.path.dirname(sys.executable)  # the venv's llmkit and python3, as after `source .venv/bin/activate`
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "LLMKIT_EXAMPLE_QUICK": "1"}
    env.pop("PYTHONPATH", None)
    p = subprocess.run(["bash", str(clone / "examples" / script), *args], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, f"{script} failed:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    assert EXPECT[script] in p.stdout, p.stdout[-3000:]
    assert "shared/data" not in p.stdout + p.stderr


def test_shipped_cranfield_converts_to_the_benchmarks_files(tmp_path):
    """Same documents, queries and judgments as the plain files the RESULTS.md rows were measured on."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "cranfield.py"), "-o", str(tmp_path)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and "1400 documents, 225 queries, 1612 judgments" in p.stderr, p.stderr
    digests = {n: hashlib.sha256((tmp_path / n).read_bytes()).hexdigest()[:16]
               for n in ("docs.jsonl", "queries.jsonl", "qrels.txt")}
    assert digests == {"docs.jsonl": "0a401007162c1f3f", "queries.jsonl": "10d48cd1ede74d45",
                       "qrels.txt": "887c1729b2a74c30"}
