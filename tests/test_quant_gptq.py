"""GPTQ within memory: Hessians collected a group of layers per pass give the same file (and so the
same GPTQ output) as one pass over every layer; the memory estimate from a model's shapes, on a
file with Qwen2.5-1.5B's shapes; a run that cannot fit stops before it starts, in one line."""

import os
import struct

import pytest

from conftest import run_cli
from ggufmake import write_tiny_llama

pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, kernel_small):
    d = tmp_path_factory.mktemp("gptqmem")
    m = write_tiny_llama(d / "m.gguf", n_embd=256, n_ff=512, n_layer=3, n_head=4, n_head_kv=2, seed=21, outliers=True)
    text = kernel_small.read_text(encoding="utf-8")[:60_000]
    (d / "calib.txt").write_text(text, encoding="utf-8")
    return d, m, text


def test_hessians_by_layer_groups_equal_one_pass(setup):
    from llmkit.quant.calibration.hessians import collect_hessians, hessian_index

    d, m, text = setup
    one, split = d / "one.gguf", d / "split.gguf"
    assert collect_hessians(str(m), text, str(one), n_ctx=128, chunks=4) == 1
    assert collect_hessians(str(m), text, str(split), n_ctx=128, chunks=4, group_bytes=1) == 3  # a layer per pass
    assert one.read_bytes() == split.read_bytes()
    idx = hessian_index(str(one))
    assert len(idx) == 3 * 7 and idx["blk.2.ffn_down.weight"][1] == 512
    assert idx["blk.1.attn_k.weight"] == idx["blk.1.attn_q.weight"]  # q/k/v share one input, one H


def test_gptq_output_unchanged_by_the_passes(setup, monkeypatch):
    """The whole pipeline with one layer per Hessian pass and one worker writes the same file."""
    from llmkit.quant import pipeline
    from llmkit.quant.calibration import hessians
    from llmkit.quant.options import QuantOptions

    d, m, text = setup
    a, b = d / "a.gguf", d / "b.gguf"
    pipeline.quantize(str(m), str(a), QuantOptions("Q3_K_S", method="gptq", calib_text=text, n_ctx=128, chunks=4))
    monkeypatch.setattr(hessians, "check_gptq_fits", lambda src, threads: (1, 1))  # the pipeline imports it per run:
    # one layer per Hessian pass, one rounding job at a time
    pipeline.quantize(str(m), str(b), QuantOptions("Q3_K_S", method="gptq", calib_text=text, n_ctx=128, chunks=4))
    assert a.read_bytes() == b.read_bytes()


def _shape_only_model(path, n_embd, n_ff, n_layer, n_kv, vocab):
    """A GGUF with a real model's tensor table (F16) and sparse, all-zero data: for estimates from shapes."""
    from llmkit.gguf.writer import kv_entry, tensor_entry

    tensors = [("token_embd.weight", (n_embd, vocab))]
    for i in range(n_layer):
        tensors += [(f"blk.{i}.attn_norm.weight", (n_embd,)), (f"blk.{i}.attn_q.weight", (n_embd, n_embd)),
                    (f"blk.{i}.attn_k.weight", (n_embd, n_kv)), (f"blk.{i}.attn_v.weight", (n_embd, n_kv)),
                    (f"blk.{i}.attn_output.weight", (n_embd, n_embd)), (f"blk.{i}.ffn_gate.weight", (n_embd, n_ff)),
                    (f"blk.{i}.ffn_up.weight", (n_embd, n_ff)), (f"blk.{i}.ffn_down.weight", (n_ff, n_embd))]
    infos, off = [], 0
    for name, shape in tensors:
        infos.append(tensor_entry(name, shape, 1, off))
        n = 2 * int(__import__("math").prod(shape))
        off += n + (-n % 32)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1) + kv_entry("general.architecture", "str", "qwen2")
    head += b"".join(infos)
    head += b"\0" * (-len(head) % 32)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + off)
    return path


def test_memory_estimate_from_shapes(tmp_path):
    """Qwen2.5-1.5B's shapes (F16, 3.1 GB): at most twice the file at peak, the Hessians in groups of
    a few layers; a tiny model's figures by hand."""
    from llmkit.quant.calibration.hessians import OVERHEAD, gptq_memory, layer_bytes, matrix_inputs, rounding_bytes

    q = _shape_only_model(tmp_path / "qwen-shapes.gguf", 1536, 8960, 28, 256, 151936)
    size = os.path.getsize(q)
    assert 3.0e9 < size < 3.2e9
    least, group, jobs = gptq_memory(str(q), threads=2)
    assert least < 2 * size and 4 * 8960 ** 2 * 4 < group < size  # a few layers per pass, not all 28
    # the inverse Hessian of ffn_down (8960 wide) in float64 leaves room for one such job at a time, while
    # two of the 1536-wide matrices round side by side
    assert rounding_bytes(8960, 1536) <= jobs < 2 * rounding_bytes(8960, 1536)
    assert 2 * rounding_bytes(1536, 8960) <= jobs
    per = layer_bytes(matrix_inputs(str(q)))[0]
    assert per == 4 * (4 * 1536 ** 2 + 2 * 1536 ** 2 + 8960 ** 2)
    assert least == max(size + per + 4 * 8960 ** 2 + OVERHEAD,
                        OVERHEAD + size // 2 + 36 * 8960 ** 2 + 24 * 8960 * 1536)
    with pytest.raises(Exception, match=r"needs about 5\.\d GiB"):
        gptq_memory(str(q), threads=2, memory=4 << 30)


def test_gptq_that_cannot_fit_stops_before_it_starts(setup, monkeypatch, tmp_path):
    from llmkit.quant.calibration import hessians

    d, m, _ = setup
    monkeypatch.setattr(hessians, "available_memory", lambda: 100 << 20)
    out, hess = tmp_path / "g.gguf", tmp_path / "h.gguf"
    r = run_cli(["quant", str(m),"--type", "Q4_K_M", "--method", "gptq", "--calib", str(d / "calib.txt"), "-c", "128",
                 "--hessian", str(hess), "-o", str(out)])
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "GPTQ" in r.stderr and "GiB of memory" in r.stderr and "0.1 GiB is available" in r.stderr
    assert not out.exists() and not hess.exists()  # nothing collected, nothing written


def test_streamed_groups_equal_saved_hessians_and_hold_one_group_on_disk(setup, monkeypatch):
    """Without --hessian, each group of layers is collected, rounded and deleted before the next: the
    same file as a run over saved Hessians, with at most one group's Hessian file on disk at a time."""
    from llmkit.quant import pipeline
    from llmkit.quant.calibration import hessians
    from llmkit.quant.options import QuantOptions

    d, m, text = setup
    saved, streamed, h = d / "saved.gguf", d / "streamed.gguf", d / "h-saved.gguf"
    opts = dict(method="gptq", calib_text=text, n_ctx=128, chunks=4)
    pipeline.quantize(str(m), str(saved), QuantOptions("Q4_K_M", hessian_path=str(h), **opts))
    seen, real = [], hessians.stream_hessians

    def watched(*a, **k):
        for path in real(*a, **k):
            seen.append(sorted(p.name for p in __import__("pathlib").Path(path).parent.glob("hessians-*")))
            yield path

    monkeypatch.setattr(hessians, "stream_hessians", watched)
    monkeypatch.setattr(hessians, "check_gptq_fits", lambda src, threads: (1, 1))  # one layer per group
    pipeline.quantize(str(m), str(streamed), QuantOptions("Q4_K_M", **opts))
    assert saved.read_bytes() == streamed.read_bytes()
    assert seen == [["hessians-0.gguf"], ["hessians-1.gguf"], ["hessians-2.gguf"]]


def test_gptq_without_disk_room_stops_before_it_writes(setup, monkeypatch, tmp_path):
    import collections
    import shutil

    d, m, _ = setup
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 40, 1 << 40, 1 << 20))
    out, hess = tmp_path / "g.gguf", tmp_path / "h.gguf"
    for extra in ([], ["--hessian", str(hess)]):
        r = run_cli(["quant", str(m), "--type", "Q4_K_M", "--method", "gptq", "--calib", str(d / "calib.txt"),
                     "-c", "128", *extra, "-o", str(out)])
        assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "of disk in" in r.stderr and "0.0 GiB is free" in r.stderr, r.stderr
        assert ("--hessian" if extra else "TMPDIR") in r.stderr, r.stderr
        assert not out.exists() and not hess.exists()
