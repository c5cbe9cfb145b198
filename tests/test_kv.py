"""KV planning against llama.cpp's real allocation; KV slots saved, restored, reused and refused."""

import ctypes
import json
import re

import pytest

from conftest import run_cli

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory):
    from ggufmake import write_tiny_llama

    d = tmp_path_factory.mktemp("kv")
    return str(write_tiny_llama(d / "gqa.gguf", seed=1, n_embd=256, n_head=8, n_head_kv=2, n_layer=3, n_ctx=4096))


@pytest.fixture(scope="module")
def small_models(tmp_path_factory):
    from ggufmake import write_tiny_llama

    d = tmp_path_factory.mktemp("kvs")
    return str(write_tiny_llama(d / "a.gguf", seed=1)), str(write_tiny_llama(d / "b.gguf", seed=2))


def _llama_kv_log(path, n_ctx, tk, tv, fa):
    """Load the model with llama.cpp and return (cells, K MiB, V MiB) from its own log line."""
    lines = []

    @llama_cpp.llama_log_callback
    def cb(level, text, user_data):
        lines.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
    try:
        types = {"f16": 1, "q8_0": 8, "q4_0": 2}
        m = llama_cpp.Llama(path, n_ctx=n_ctx, type_k=types[tk], type_v=types[tv], flash_attn=fa, verbose=True)
        del m
    finally:
        import llmkit.llama.runtime as rt

        rt._LOG_CALLBACK = None
        rt.silence_llama_log()
    line = next(x for x in lines if "cells" in x and "K (" in x)
    cells = int(re.search(r"\(\s*(\d+) cells", line).group(1))
    k = float(re.search(r"K \(\w+\):\s*([\d.]+) MiB", line).group(1))
    v = float(re.search(r"V \(\w+\):\s*([\d.]+) MiB", line).group(1))
    return cells, k, v


@pytest.mark.parametrize("n_ctx,tk,tv,fa", [(2048, "f16", "f16", False), (1500, "q8_0", "q8_0", True),
                                             (1000, "q8_0", "f16", False), (3000, "q4_0", "q4_0", True)])
def test_plan_equals_llama_cpp_allocation(gqa_model, n_ctx, tk, tv, fa):
    from llmkit.kv.plan import plan

    p = plan(gqa_model, n_ctx, cache_type_k=tk, cache_type_v=tv)
    cells, k, v = _llama_kv_log(gqa_model, n_ctx, tk, tv, fa)
    assert p.n_ctx_cells == cells
    assert p.k_bytes / 2**20 == pytest.approx(k, rel=0.01, abs=0.006)
    assert p.v_bytes / 2**20 == pytest.approx(v, rel=0.01, abs=0.006)
    assert p.head_count_kv == [2, 2, 2]  # grouped-query attention: 2 of 8 heads are cached


def _llama_compute_mib(path, n_ctx, fa):
    """llama.cpp's own figure for its compute buffer (from its log) for a context size."""
    lines = []

    @llama_cpp.llama_log_callback
    def cb(level, text, user_data):
        lines.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
    try:
        m = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, flash_attn=fa, verbose=True)
        del m
    finally:
        import llmkit.llama.runtime as rt

        rt._LOG_CALLBACK = None
        rt.silence_llama_log()
    line = next(x for x in lines if "compute buffer size =" in x)
    return float(re.search(r"=\s*([\d.]+) MiB", line).group(1))


@pytest.mark.parametrize("n_ctx,fa", [(8192, False), (8192, True), (1024, False)])
def test_plan_compute_buffer_near_llama_cpp(gqa_model, n_ctx, fa):
    """The compute buffer kv plan adds is within 20 % (+2 MiB) of the one llama.cpp reports: the
    attention scores grow with heads x context without flash attention, only the mask with it."""
    from llmkit.kv.plan import plan

    p = plan(gqa_model, n_ctx, flash_attn=fa)
    assert p.compute_bytes / 2**20 == pytest.approx(_llama_compute_mib(gqa_model, n_ctx, fa), rel=0.20, abs=2.0)


def test_context_that_cannot_fit_is_refused_before_loading(gqa_model, monkeypatch):
    """The figure needed, the memory available and the largest context that fits, in one line; a
    context past the training context (4096 here) warns once; -c 0 is the training context."""
    import llmkit.kv.plan as kp

    need = kp.plan(gqa_model, 65536).allocated_bytes
    monkeypatch.setattr("llmkit.machine.available_memory", lambda: need // 2)
    r = run_cli(["generate", "-m", gqa_model, "-c", "65536", "-n", "2", "hi"])
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    m = re.search(r"needs ([\d.]+) GiB .* but ([\d.]+) GiB of memory is available; the largest context that fits is "
                  r"(\d+) tokens", r.stderr)
    assert m, r.stderr
    fits = int(m.group(3))
    assert kp.plan(gqa_model, fits).allocated_bytes <= need // 2 < kp.plan(gqa_model, fits + 256).allocated_bytes
    monkeypatch.undo()
    r = run_cli(["generate", "-m", gqa_model, "-c", "8192", "-n", "2", "--json", "hi"])
    assert r.exit_code == 0 and r.stderr.count("larger than the model's training context (4096)") == 1
    assert json.loads(r.stdout)["peak_rss_bytes"] > 10 * 2**20
    r = run_cli(["kv", "plan", "-m", gqa_model, "-c", "0", "--json"])
    assert json.loads(r.stdout)[0]["n_ctx"] == 4096


def test_plan_cli_json(gqa_model):
    r = run_cli(["kv", "plan", "-m", gqa_model, "-c", "1024", "-c", "4096", "--ctk", "q8_0", "--json"])
    rows = json.loads(r.stdout)
    assert [x["n_ctx"] for x in rows] == [1024, 4096]
    assert rows[1]["kv_bytes"] == 4 * rows[0]["kv_bytes"]
    assert rows[0]["decode_bound_tok_s_full_ctx"] > 0
    assert rows[1]["process_bytes"] == (rows[1]["weights_bytes"] + rows[1]["kv_bytes"] + rows[1]["compute_bytes"]
                                        + rows[1]["output_bytes"])


def test_plan_plot_draws_memory_per_model_with_ram_line(gqa_model, small_models, tmp_path):
    from chartread import svg_ids, svg_series

    chart = tmp_path / "mem.svg"
    r = run_cli(["kv", "plan", "-m", gqa_model, "-m", small_models[0], "-b", "256", "--flash-attn",
                 "--plot", str(chart), "--json"])
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {x["n_ctx"] for x in rows if x["model"] == gqa_model} == {1024, 2048, 4096}  # up to the training context
    assert all(x["flash_attn"] and x["n_ubatch"] == 256 for x in rows)
    assert svg_series(chart, 0) == {"series-0-0", "series-0-1"} and svg_ids(chart, "ref-0-") == ["ref-0-0"]


PROMPT = "You are a helpful assistant. Answer briefly and precisely. " * 3


def _gen_json(args):
    r = run_cli(["generate", "--temp", "0", "-n", "12", "--ignore-eos", "--json", *args])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_slot_restore_reuses_prefix_and_matches_fresh(small_models, tmp_path):
    a, _ = small_models
    slot = tmp_path / "sys.slot"
    r = run_cli(["kv", "save", "-m", a, "-o", str(slot), PROMPT])
    assert r.exit_code == 0, r.stderr
    fresh = _gen_json(["-m", a, PROMPT + "Question: why?"])
    cached = _gen_json(["-m", a, "--prompt-cache", str(slot), PROMPT + "Question: why?"])
    assert cached["text"] == fresh["text"]
    n_slot = len(json.loads(run_cli(["kv", "show", "--json", str(slot)]).stdout)["tokens"])
    assert n_slot > 100 and cached["stats"]["prefill_reused"] >= n_slot - 2
    assert fresh["stats"]["prefill_reused"] == 0
    show = run_cli(["kv", "show", str(slot)])
    assert show.stdout == PROMPT
    ls = run_cli(["kv", "ls", "--json", str(tmp_path)])
    rec = json.loads(ls.stdout.splitlines()[0])
    assert rec["tokens"] > 100 and rec["path"].endswith("sys.slot")


def test_slot_dir_is_a_prefix_cache_across_runs(small_models, tmp_path):
    a, _ = small_models
    d = tmp_path / "cache"
    first = _gen_json(["-m", a, "--prompt-cache", str(d), PROMPT + "Q1"])
    second = _gen_json(["-m", a, "--prompt-cache", str(d), PROMPT + "Q2"])
    fresh = _gen_json(["-m", a, PROMPT + "Q2"])
    assert first["stats"]["prefill_reused"] == 0
    assert second["stats"]["prefill_reused"] > 100
    assert second["text"] == fresh["text"]
    assert len(list(d.glob("*.slot"))) == 2


def test_foreign_and_broken_slots_are_refused(small_models, tmp_path):
    a, b = small_models
    slot = tmp_path / "a.slot"
    assert run_cli(["kv", "save", "-m", a, "-o", str(slot), PROMPT]).exit_code == 0
    r = run_cli(["generate", "-m", b, "--prompt-cache", str(slot), PROMPT])
    assert r.exit_code == 1 and "different model" in r.stderr
    r = run_cli(["generate", "-m", a, "--ctk", "q8_0", "--prompt-cache", str(slot), PROMPT])
    assert r.exit_code == 1 and "--ctk f16" in r.stderr
    junk = tmp_path / "junk.slot"
    junk.write_bytes(b"not a slot at all")
    for cmd in (["generate", "-m", a, "--prompt-cache", str(junk), "x"], ["kv", "show", str(junk)], ["kv", "erase", str(junk)]):
        r = run_cli(cmd)
        assert r.exit_code == 1 and "not an llmkit KV slot" in r.stderr and "Traceback" not in r.stderr
    assert junk.exists()  # erase refuses files that are not slots
    data = slot.read_bytes()
    trunc = tmp_path / "trunc.slot"
    trunc.write_bytes(data[:40])
    r = run_cli(["kv", "show", str(trunc)])
    assert r.exit_code == 1 and "truncated" in r.stderr
    assert run_cli(["kv", "erase", str(slot)]).exit_code == 0 and not slot.exists()


def test_cache_reuse_shifts_later_chunks_exactly_on_one_layer(tmp_path):
    """A change in the middle: the chunk after it is reused by shifting its KV positions. With one
    layer K/V depend only on token and position, so greedy output equals a fresh run."""
    from ggufmake import write_tiny_llama

    model = str(write_tiny_llama(tmp_path / "one.gguf", seed=4, n_layer=1))
    head, gap, tail = "System rules: be brief. " * 2, "Some context that will be removed later. ", "Now the question text comes here. " * 2
    slot = tmp_path / "a.slot"
    assert run_cli(["kv", "save", "-m", model, "-o", str(slot), head + gap + tail]).exit_code == 0
    new = head + tail + "Answer:"
    fresh = _gen_json(["-m", model, new])
    reused = _gen_json(["-m", model, "--prompt-cache", str(slot), "--cache-reuse", "8", new])
    assert reused["stats"]["shifted"] > len(tail) // 2  # the tail chunk came from the cache
    assert reused["stats"]["prefill_reused"] > len(head) // 2 + reused["stats"]["shifted"] // 2
    assert reused["text"] == fresh["text"]
    plain = _gen_json(["-m", model, "--prompt-cache", str(slot), new])  # without --cache-reuse only the prefix is kept
    assert plain["stats"]["shifted"] == 0 and plain["text"] == fresh["text"]


def test_quantized_v_cache_plan_save_restore(gqa_model, tmp_path):
    """--ctv through plan (3 layers x 2 KV heads x 32 dims per token for K and for V; f16 = 2 bytes a
    value, q8_0 = 34 bytes per 32), save (header), restore (same continuation) and the refusal."""
    a = gqa_model  # head size 32: q8_0 blocks of 32 fit a head (the 16-wide heads of the smaller model do not)
    rows = {tv: json.loads(run_cli(["kv", "plan", "-m", a, "-c", "1024", "--ctv", tv, "--json"]).stdout)[0]
            for tv in ("f16", "q8_0")}
    assert rows["f16"]["kv_bytes"] == 1024 * 3 * (128 + 128)
    assert rows["q8_0"]["kv_bytes"] == 1024 * 3 * (128 + 68)
    q8 = ["--flash-attn", "--ctk", "q8_0", "--ctv", "q8_0"]  # llama.cpp quantizes V only with flash attention
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(PROMPT)
    slot = tmp_path / "q8.slot"
    r = run_cli(["kv", "save", "-m", a, *q8, "-o", str(slot), "--prompt-file", str(prompt_file)])
    assert r.exit_code == 0, r.stderr
    hdr = json.loads(run_cli(["kv", "show", "--json", str(slot)]).stdout)
    assert (hdr["cache_type_k"], hdr["cache_type_v"], hdr["text"]) == ("q8_0", "q8_0", PROMPT)
    restored = run_cli(["kv", "restore", "-m", a, *q8, str(slot), "Question: why?", "-n", "12", "--json"])
    assert restored.exit_code == 0, restored.stderr
    fresh = _gen_json(["-m", a, *q8, PROMPT + "Question: why?"])
    got = json.loads(restored.stdout)
    assert got["text"] == fresh["text"] and got["stats"]["prefill_reused"] >= len(hdr["tokens"]) - 2
    r = run_cli(["kv", "restore", "-m", a, "--flash-attn", "--ctk", "q8_0", str(slot), "x"])
    assert r.exit_code == 1 and "--ctk q8_0 --ctv q8_0" in r.stderr


def test_slot_token_ids_are_a_section_read_only_when_needed(small_models, tmp_path):
    """Version 2 keeps the ids out of the JSON header: listing reads no id, a restore reads and checks
    them against the header's hash, and a version 1 file (ids inside the JSON) still restores."""
    import struct

    from llmkit.kv import slots

    a, _ = small_models
    slot = tmp_path / "s.slot"
    assert run_cli(["kv", "save", "-m", a, "-o", str(slot), PROMPT]).exit_code == 0
    data = slot.read_bytes()
    version, n = struct.unpack("<II", data[8:16])
    head = json.loads(data[16:16 + n])
    assert version == 2 and "tokens" not in head and head["n_tokens"] > 100
    hdr, off = slots.read_header(str(slot))
    assert hdr.tokens is None and off == 16 + n + 4 * head["n_tokens"]
    ids = slots.read_header(str(slot), tokens=True)[0].tokens
    assert len(ids) == head["n_tokens"] and ids == json.loads(run_cli(["kv", "show", "--json", str(slot)]).stdout)["tokens"]
    saved = json.loads(run_cli(["kv", "save", "-m", a, "-o", str(tmp_path / "j.slot"), "--json", PROMPT]).stdout)
    assert saved["tokens"] == len(ids) and saved["bytes"] == (tmp_path / "j.slot").stat().st_size
    assert saved["peak_rss_bytes"] > 10 * 2**20
    rec = json.loads(run_cli(["kv", "ls", "--json", str(tmp_path)]).stdout.splitlines()[0])
    assert rec["tokens"] == len(ids)
    # an id changed in the section: refused by its hash before llama.cpp sees the state
    bad = tmp_path / "bad.slot"
    bad.write_bytes(data[:16 + n] + struct.pack("<i", ids[0] ^ 1) + data[16 + n + 4:])
    r = run_cli(["generate", "-m", a, "--prompt-cache", str(bad), PROMPT])
    assert r.exit_code == 1 and "corrupt token ids" in r.stderr
    # the same state written as a version 1 file restores to the same continuation
    old = dict(head, tokens=ids, version=1)
    del old["n_tokens"], old["tokens_sha"]
    raw = json.dumps(old).encode()
    v1 = tmp_path / "v1.slot"
    v1.write_bytes(slots.MAGIC + struct.pack("<II", 1, len(raw)) + raw + data[off:])
    want = _gen_json(["-m", a, "--prompt-cache", str(slot), PROMPT + " more"])
    got = _gen_json(["-m", a, "--prompt-cache", str(v1), PROMPT + " more"])
    assert got["text"] == want["text"] and got["stats"]["prefill_reused"] == want["stats"]["prefill_reused"] > 100
