"""`quant sweep`: each point equals `quant` + `quant ppl --save-logits` / `--kld` run by hand (the same
file bytes, the same base file, the same KLD digits); a second run redoes nothing, a point removed from
the state (or its file) is redone alone, a killed sweep resumes after its last finished point; the
front's chart parsed back."""

import json

import pytest

from conftest import run_cli

pytest.importorskip("llama_cpp")
from ggufmake import write_tiny_llama  # noqa: E402
from chartread import png_size, svg_notes, svg_series, svg_texts  # noqa: E402

EVAL = ["-c", "128", "--chunks", "3"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, kernel_small):
    d = tmp_path_factory.mktemp("sweep")
    base = write_tiny_llama(d / "base.gguf", seed=5, n_embd=64, n_ff=128, n_ctx=512)
    text = d / "eval.txt"
    text.write_text(kernel_small.read_text(encoding="utf-8")[20_000:26_000])
    (d / "calib.txt").write_text(kernel_small.read_text(encoding="utf-8")[:6_000])
    # a budget between the Q4_0 and Q8_0 files, which the allocator can meet with a mix of types
    sizes = {}
    for t in ("Q4_0", "Q8_0"):
        r = run_cli(["quant", str(base), "--type", t, "-o", str(d / f"{t}.gguf")])
        assert r.exit_code == 0, r.stderr
        sizes[t] = (d / f"{t}.gguf").stat().st_size
    budget = (sizes["Q4_0"] + sizes["Q8_0"]) // 2 // 1024
    return d, base, text, f"{budget}K"


def sweep(base, text, out, *args):
    r = run_cli(["quant", "sweep", str(base), "--text", str(text), "-o", str(out), *EVAL, *args])
    return r, [json.loads(x) for x in r.stdout.splitlines()]


def by_hand(d, base, text, quant_args, name):
    """`quant` then `quant ppl --kld` against a base file saved by `quant ppl --save-logits`."""
    kld = d / "hand-base.kld"
    if not kld.exists():
        r = run_cli(["quant", "ppl", "-m", str(base), "--save-logits", str(kld), str(text), *EVAL])
        assert r.exit_code == 0, r.stderr
    out = d / f"hand-{name}.gguf"
    r = run_cli(["quant", str(base), *quant_args, "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    r = run_cli(["quant", "ppl", "-m", str(out), "--kld", str(kld), "--json"])
    assert r.exit_code == 0, r.stderr
    return out, kld, json.loads(r.stdout)


def test_points_equal_quant_and_ppl_by_hand(setup, tmp_path, monkeypatch):
    from llmkit.quant.sweep import size_name

    d, base, text, budget = setup
    name = "size-" + size_name(int(budget[:-1]) * 1024)
    out, svg = tmp_path / "sw", tmp_path / "front.svg"
    # a budget's recipe says whether its probes were cached: each run gets a cache of its own, so both probe
    monkeypatch.setenv("LLMKIT_CACHE", str(tmp_path / "cache-sweep"))
    r, points = sweep(base, text, out, "--type", "Q8_0,q4_0", "--target-size", budget, "-b", "2048",
                      "--ubatch-size", "512", "--flash-attn", "auto", "--plot", str(svg))
    assert r.exit_code == 0, r.stderr
    assert [(p["name"], p["kind"], p["resumed"]) for p in points] == [
        ("Q8_0", "type", False), ("Q4_0", "type", False), (name, "budget", False)]
    for p, args in zip(points, (["--type", "Q8_0"], ["--type", "Q4_0"], ["--target-size", budget])):
        monkeypatch.setenv("LLMKIT_CACHE", str(tmp_path / f"cache-{p['name']}"))
        hand, hand_kld, ref = by_hand(d, base, text, args, p["name"])
        assert (out / "base.kld").read_bytes() == hand_kld.read_bytes()
        assert open(p["file"], "rb").read() == hand.read_bytes() and p["bytes"] == hand.stat().st_size
        for key in ("kld", "ppl", "ppl_base", "same_top_p"):
            assert p[key] == ref[key], key  # the same digits, not just close
        assert 0 < p["kld"]["mean"] < p["kld"]["p99.9"] and 4 < p["bpw"] < 9
    assert points[0]["kld"]["mean"] < points[1]["kld"]["mean"] and points[0]["bytes"] > points[1]["bytes"]
    assert points[2]["target_size"] == int(budget[:-1]) * 1024 >= points[2]["bytes"]
    # the front: llama.cpp's types and the budgets as two series, each point named
    assert svg_series(svg, 0) == {"series-0-0", "series-0-1"}
    texts = svg_texts(svg)
    assert {"llama.cpp types", "llmkit budgets", "Q8_0", "Q4_0", name.removeprefix("size-"), "mean KLD"} <= set(texts)
    assert svg_notes(svg, "note-0-0-") == ["Q4_0", "Q8_0"]  # by size
    assert svg_notes(svg, "note-0-1-") == [name.removeprefix("size-")]


def test_resume_redoes_nothing_finished(setup, tmp_path, monkeypatch):
    import llmkit.quant.pipeline as pipeline
    import llmkit.quant.quality.kld as kld

    d, base, text, _ = setup
    out = tmp_path / "sw"
    calls = []
    real_quantize, real_kld = pipeline.quantize, kld.kl_divergence

    def quantize(src, dst, opts):
        calls.append(("quantize", dst.rsplit("-", 1)[-1]))
        return real_quantize(src, dst, opts)

    def kl_divergence(model, base_path, **kw):
        calls.append(("kld", model.rsplit("-", 1)[-1]))
        if len([c for c in calls if c[0] == "kld"]) == 2 and stop:
            raise KeyboardInterrupt  # killed while measuring the second point
        return real_kld(model, base_path, **kw)

    monkeypatch.setattr(pipeline, "quantize", quantize)
    monkeypatch.setattr(kld, "kl_divergence", kl_divergence)
    args = ("--type", "Q4_0", "--type", "Q5_0,Q8_0", "-t", "2")
    stop = True
    r, points = sweep(base, text, out, *args)
    assert r.exit_code == 130 and [p["name"] for p in points] == ["Q4_0"]
    stop, calls[:] = False, []
    r, points = sweep(base, text, out, *args)
    assert r.exit_code == 0, r.stderr
    assert [(p["name"], p["resumed"]) for p in points] == [("Q4_0", True), ("Q5_0", False), ("Q8_0", False)]
    assert calls == [("quantize", "Q5_0.gguf"), ("kld", "Q5_0.gguf"), ("quantize", "Q8_0.gguf"), ("kld", "Q8_0.gguf")]
    first = points
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    calls[:] = []
    r, points = sweep(base, text, out, *args)  # everything finished: nothing is redone
    assert r.exit_code == 0 and calls == [] and all(p["resumed"] for p in points)
    assert [{**p, "resumed": False} for p in points] == [{**p, "resumed": False} for p in first]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    assert "measured by an earlier run" in r.stderr
    # one point removed from the state, another's file deleted: those two alone are done again
    state = (out / "sweep.jsonl").read_text().splitlines()
    (out / "sweep.jsonl").write_text("".join(x + "\n" for x in state if '"name":"Q5_0"' not in x))
    (out / "base-Q8_0.gguf").unlink()
    r, points = sweep(base, text, out, *args)
    assert r.exit_code == 0, r.stderr
    assert calls == [("quantize", "Q5_0.gguf"), ("kld", "Q5_0.gguf"), ("quantize", "Q8_0.gguf"), ("kld", "Q8_0.gguf")]
    assert [p["resumed"] for p in points] == [True, False, False]
    assert [p["kld"] for p in points] == [p["kld"] for p in first]
    assert (out / "base.kld").stat().st_mtime_ns == stamps["base.kld"]


def test_delete_files_imatrix_and_png(setup, tmp_path):
    d, base, text, _ = setup
    imx = tmp_path / "imatrix.gguf"
    r = run_cli(["quant", "imatrix", "-m", str(base), "--text", str(d / "calib.txt"), "-o", str(imx), "-c", "128",
                 "--chunks", "2"])
    assert r.exit_code == 0, r.stderr
    out, png = tmp_path / "sw", tmp_path / "front.png"
    r, points = sweep(base, text, out, "--type", "IQ2_XS", "--imatrix", str(imx), "--delete-files", "--plot", str(png))
    assert r.exit_code == 0, r.stderr
    assert points[0]["file"] is None and points[0]["kld"]["mean"] > 0
    assert sorted(p.name for p in out.iterdir()) == ["base.kld", "sweep.jsonl"]
    assert png_size(png) == (960, 540)
    r, again = sweep(base, text, out, "--type", "IQ2_XS", "--imatrix", str(imx), "--delete-files")
    assert r.exit_code == 0 and again[0]["resumed"] and again[0]["kld"] == points[0]["kld"]


def test_refusals(setup, tmp_path):
    from llmkit.quant.quality.kld import read_header

    d, base, text, _ = setup
    out = tmp_path / "sw"
    r, _ = sweep(base, text, out, "--type", "IQ2_XS")
    assert r.exit_code == 2 and "IQ2_XS needs an importance matrix (--imatrix)" in r.stderr and not out.exists()
    r, _ = sweep(base, text, out)
    assert r.exit_code == 2 and "--type TYPES and/or --target-size SIZES" in r.stderr
    r, _ = sweep(base, text, out, "--type", "Q4_0", "--plot", str(tmp_path / "front.gif"))
    assert r.exit_code == 2 and "'.gif' is not a chart format" in r.stderr and not out.exists()
    for flag in ("-t", "-b", "--ubatch-size"):
        r, _ = sweep(base, text, out, "--type", "Q4_0", flag, "0")
        assert r.exit_code == 2 and "0 is not in the range x>=1" in r.stderr and not out.exists(), flag
    r, _ = sweep(base, text, out, "--type", "Q4_0")
    assert r.exit_code == 0, r.stderr
    r = run_cli(["quant", "sweep", str(base), "--text", str(text), "-o", str(out), "--type", "Q4_0", "-c", "64",
                 "--chunks", "3"])
    assert r.exit_code == 1 and "holds a sweep with other settings (n_ctx differ)" in r.stderr
    (out / "sweep.jsonl").write_text("not json\n")
    r, _ = sweep(base, text, out, "--type", "Q4_0")
    assert r.exit_code == 1 and "sweep.jsonl' is damaged" in r.stderr
    # the state deleted to start over: the base logits left beside it are not reused for other settings
    (out / "sweep.jsonl").unlink()
    r = run_cli(["quant", "sweep", str(base), "--text", str(text), "-o", str(out), "--type", "Q4_0", "-c", "64",
                 "--chunks", "3"])
    assert r.exit_code == 0, r.stderr
    assert read_header(str(out / "base.kld")).n_ctx == 64 and not json.loads(r.stdout)["resumed"]
    r = run_cli(["quant", "sweep", str(base), "--text", str(text), "-o", str(out / "base.kld" / "d"),
                 "--type", "Q4_0"])
    assert r.exit_code == 1 and "cannot create the folder" in r.stderr
