"""The PagedAttention simulator reproduces the paper's qualitative results on fixed traces."""

import copy
import json

import pytest

from conftest import run_cli
from llmkit.errors import BadInput
from llmkit.kv.simulate import POLICIES, simulate
from llmkit.kv.trace import read_trace, synthetic_trace, unshared


@pytest.fixture(scope="module")
def busy_trace():
    return synthetic_trace(300, rate=4, seed=1)


def test_paged_wastes_little_and_batches_more(busy_trace):
    res = {p: simulate(copy.deepcopy(busy_trace), p, 20000) for p in POLICIES}
    waste = {p: r.reserved + r.internal + r.external for p, r in res.items()}
    assert all(r.completed == 300 for r in res.values())
    assert waste["paged"] < 0.04
    assert waste["max"] > 0.6 and waste["pow2"] > 0.3 and waste["oracle"] > 0.15
    assert res["paged"].mean_batch > 2 * res["max"].mean_batch
    assert res["paged"].throughput_rps > 2 * res["max"].throughput_rps
    assert res["paged"].throughput_rps >= res["pow2"].throughput_rps


def test_sharing_cuts_memory_for_parallel_samples_and_prefixes():
    reqs = synthetic_trace(120, rate=1, seed=2, prompt_mean=600, output_mean=60, n_samples=4, shared_prefix=256)
    shared = simulate(copy.deepcopy(reqs), "paged", 30000)
    alone = simulate(unshared(copy.deepcopy(reqs)), "paged", 30000)
    per_seq_shared = shared.used / (shared.mean_batch * 4)
    per_seq_alone = alone.used / alone.mean_batch
    assert per_seq_shared < 0.5 * per_seq_alone
    assert shared.prefix_hit_rate > 0.5 and alone.prefix_hit_rate == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_under_memory_pressure_still_completes(busy_trace, mode):
    r = simulate(copy.deepcopy(synthetic_trace(200, rate=20, seed=3)), "paged", 6000, preempt=mode)
    assert r.completed == 200 and r.preemptions > 0


def test_bad_traces_and_budgets():
    with pytest.raises(BadInput, match="negative or zero"):
        read_trace(['{"prompt_tokens": -3, "output_tokens": 5}'])
    with pytest.raises(BadInput, match="needs prompt_tokens"):
        read_trace(['{"prompt_tokens": 3}'])
    with pytest.raises(BadInput, match="smaller than one block"):
        simulate(synthetic_trace(5), "paged", 8)


def test_cli_simulate_trace_file_json_and_plot(tmp_path):
    from chartread import png_size, svg_series

    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps({"arrival": i * 0.1, "prompt_tokens": 100 + i, "output_tokens": 50,
                                           "prefix_id": "sys", "prefix_tokens": 64}) for i in range(40)) + "\n")
    png = tmp_path / "kv.png"
    r = run_cli(["kv", "simulate", str(trace), "--budget-tokens", "4000", "--json", "--plot", str(png)])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert [x["policy"] for x in d["results"]] == list(POLICIES)
    assert png_size(png) == (900, 240 * len(POLICIES))
    svg = tmp_path / "kv.svg"
    assert run_cli(["kv", "simulate", str(trace), "--budget-tokens", "4000", "--plot", str(svg)]).exit_code == 0
    assert all(svg_series(svg, p) == {f"series-{p}-{i}" for i in range(4)} for p in range(len(POLICIES)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_tokens": 5, "output_tokens": 0}\n')
    r = run_cli(["kv", "simulate", str(bad), "--budget-tokens", "4000"])
    assert r.exit_code == 1 and ("zero length" in r.stderr or "negative or zero" in r.stderr), r.stderr


def test_budget_from_model_bytes_and_gpu_memory(tmp_path):
    """-m tiny.gguf: 2 layers x (K + V) x 2 KV heads x 16 dims x 2 bytes (f16) = 256 bytes per token;
    --gpu-gb leaves GPU memory minus the weights (the F32 tensors' bytes, read here with gguf-py)."""
    import gguf

    from ggufmake import write_tiny_llama

    model = write_tiny_llama(tmp_path / "tiny.gguf", seed=1)
    weights = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(model)).tensors)
    assert weights == 429824
    small = ["--requests", "20", "--max-len", "64", "--prompt-mean", "16", "--output-mean", "16"]
    r = run_cli(["kv", "simulate", *small, "-m", str(model), "--budget-bytes", "25600", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["budget_tokens"] == 100
    r = run_cli(["kv", "simulate", *small, "-m", str(model), "--gpu-gb", "0.001", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["budget_tokens"] == (10**6 - weights) // 256 == 2227
    r = run_cli(["kv", "simulate", "--requests", "20", "-m", str(model), "--gpu-gb", "0.0001"])
    assert r.exit_code == 1 and "do not fit in 0.0001 GB" in r.stderr
    r = run_cli(["kv", "simulate", "--requests", "20", "--gpu-gb", "24"])
    assert r.exit_code == 2 and "-m MODEL" in r.stderr


def test_cli_trace_and_policy_flags_reach_the_simulator():
    """Every built-in-trace and policy flag: the CLI's JSON equals the library run with the same values."""
    from llmkit.kv.simulate import compare

    args = {"--requests": 60, "--rate": 8.0, "--prompt-mean": 120, "--output-mean": 90, "--shared-prefix": 32,
            "--samples": 2, "--seed": 5, "--max-len": 512, "--block-size": 32, "--step-ms": 10.0}
    cli_args = [x for k, v in args.items() for x in (k, str(v))]
    r = run_cli(["kv", "simulate", *cli_args, "--budget-tokens", "1500", "--policy", "paged", "--policy", "pow2",
                 "--preempt", "swap", "--json"])
    assert r.exit_code == 0, r.stderr
    got = json.loads(r.stdout)
    reqs = synthetic_trace(60, 8.0, 5, 120, 90, 32, 2, 512)
    want = compare(reqs, ["paged", "pow2"], 1500, 32, 512, "swap", 0.01)
    assert got["requests"] == len(reqs) and got["results"] == json.loads(json.dumps([w.to_dict() for w in want]))
    assert any(x["preemptions"] for x in got["results"])  # the budget is tight enough for --preempt to matter
    other = json.loads(run_cli(["kv", "simulate", *cli_args, "--budget-tokens", "1500", "--policy", "paged",
                                "--policy", "pow2", "--preempt", "recompute", "--json"]).stdout)
    assert other["results"] != got["results"]
