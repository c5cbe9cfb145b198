"""`quant --method gptq --damp/--shrink/--no-refit` reach the GPTQ solver: the explicit default equals the
default byte for byte, and each setting changes the quantized tensors (Hessians computed once)."""

import pytest

from conftest import run_cli

pytest.importorskip("llama_cpp")


def test_damp_and_no_refit_change_gptq_output(tmp_path, kernel_small):
    from ggufmake import write_tiny_llama
    from llmkit.gguf.reader import read_gguf

    m = write_tiny_llama(tmp_path / "m.gguf", seed=1, n_ctx=256)
    calib = tmp_path / "calib.txt"
    calib.write_text(kernel_small.read_text(encoding="utf-8")[:20000])
    hess = tmp_path / "h.gguf"

    def run(name, *extra):
        out = tmp_path / f"{name}.gguf"
        args = ["--hessian", str(hess)] + (["--calib", str(calib), "-c", "128", "--chunks", "4"] if not hess.exists() else [])
        r = run_cli(["quant", str(m),"--type", "Q4_0", "--method", "gptq", *args, *extra, "-o", str(out)])
        assert r.exit_code == 0, r.stderr
        g = read_gguf(str(out))
        data = out.read_bytes()
        return {t.name: data[g.data_offset + t.offset: g.data_offset + t.offset + t.nbytes] for t in g.tensors
                if t.type_name == "Q4_0"}

    base = run("base")
    assert base  # some tensors were GPTQ-quantized to Q4_0
    assert run("explicit", "--damp", "0.01", "--shrink", "3") == base
    for name, extra in (("damp", ("--damp", "1.0")), ("norefit", ("--no-refit",)), ("plain", ("--shrink", "0"))):
        other = run(name, *extra)
        assert other.keys() == base.keys() and any(other[k] != base[k] for k in base), name
