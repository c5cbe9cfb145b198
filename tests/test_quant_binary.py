"""llmkit quant against llama.cpp's command-line tools, as the install builds them:
whole files equal to the `llama-quantize` binary's (metadata included: with an imatrix the binary
also writes quantize.imatrix.*), with the numba kernels forced on (LLMKIT_JIT=1) as on real models;
and llmkit's imatrix equal to `llama-imatrix`'s for the same model, text, context and chunks."""

import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from ggufmake import write_tiny_llama
from llamatools import run_tool
from quantref import binary_quantize, setup  # noqa: F401  (a module fixture)

llama_cpp = pytest.importorskip("llama_cpp")

ROOT = Path(__file__).parent.parent


def metadata(path) -> dict:
    from llmkit.gguf.reader import read_gguf

    return read_gguf(str(path)).metadata


@pytest.mark.parametrize("ftype,imx", [("Q8_0", None), ("Q4_0", None), ("Q4_1", None), ("Q5_0", None), ("Q5_1", None),
                                       ("Q2_K", None), ("Q3_K_M", None),
                                       ("Q4_K_M", None), ("Q5_K_S", None), ("Q6_K", None), ("IQ4_XS", None),
                                       ("Q4_K_M", "gguf"), ("Q2_K", "gguf"), ("Q3_K_S", "gguf"), ("IQ4_NL", "gguf"),
                                       ("Q5_0", "gguf"), ("Q4_K_M", "dat"), ("Q6_K", "dat")])
def test_same_file_as_the_llama_quantize_binary(setup, monkeypatch, ftype, imx):
    """Whole files, header and metadata included, with the compiled kernels forced on."""
    from llmkit.quant.formats import jit, native

    d, base, imx_gguf, imx_dat = setup
    monkeypatch.setenv("LLMKIT_JIT", "1")
    seen, real, real_w, real_n = [], jit.run, jit.run_weighted, native.run
    monkeypatch.setattr(jit, "run", lambda name, *a: seen.append(name) or real(name, *a))
    monkeypatch.setattr(jit, "run_weighted", lambda name, *a: seen.append(name) or real_w(name, *a))
    # the plain formats' kernels run from the linked library when it is built (the same loops)
    monkeypatch.setattr(native, "run", lambda name, *a: seen.append(name) or real_n(name, *a))
    path = {None: None, "gguf": imx_gguf, "dat": imx_dat}[imx]
    ref, ours = d / f"bin-{ftype}-{imx}.gguf", d / f"ours-{ftype}-{imx}.gguf"
    binary_quantize(base, ref, ftype, path)
    args = ["quant", str(base),"--type", ftype, "-o", str(ours)] + (["--imatrix", str(path)] if path else [])
    r = run_cli(args)
    assert r.exit_code == 0, r.stderr
    assert ours.read_bytes() == ref.read_bytes(), f"{ftype} with imatrix {imx} differs from llama-quantize"
    if path is None and ftype != "IQ4_XS":  # the compiled kernel of the main type ran (IQ4 has none)
        main = {"Q3_K_M": "q3_k", "Q4_K_M": "q4_k", "Q5_K_S": "q5_k"}.get(ftype, ftype.lower())
        assert main in seen, seen
    if path is not None and ftype in ("Q3_K_S", "Q6_K", "Q4_K_M", "Q2_K"):  # the imatrix kernels ran
        want = {"Q3_K_S": {"q3_k_w"}, "Q6_K": {"q6_k_w"}, "Q4_K_M": {"q4_k_w", "q6_k_w"}, "Q2_K": {"q2_k_w"}}[ftype]
        assert want <= set(seen), seen
    meta = metadata(ours)
    if path is None:
        assert not [k for k in meta if k.startswith("quantize.")]
    else:
        assert meta["quantize.imatrix.file"] == str(path)
        assert meta["quantize.imatrix.entries_count"] == 2 * 7 and meta["quantize.imatrix.chunks_count"] == 6
        assert meta["quantize.imatrix.dataset"].endswith("kernel-small.txt")
    os.unlink(ours), os.unlink(ref)


@pytest.mark.parametrize("ftype", ["Q4_0", "Q8_0", "Q4_K_M"])
def test_f16_base_through_the_compiled_conversion(setup, monkeypatch, tmp_path, ftype):
    """An F16 model (as real ones come) is read through the compiled half -> float conversion when the
    kernels run: same file as llama-quantize; a NaN half is still refused (the conversion counts it,
    so the input needs no second pass)."""
    from llmkit.quant.formats import jit, native

    d, base, _, _ = setup
    f16 = d / "base-f16.gguf"
    if not f16.exists():
        assert run_cli(["quant", str(base),"--type", "F16", "-o", str(f16)]).exit_code == 0
    monkeypatch.setenv("LLMKIT_JIT", "1")
    calls, real, real_n = [], jit.f16_rows, native.f16_rows
    monkeypatch.setattr(jit, "f16_rows", lambda raw, ne0: calls.append(ne0) or real(raw, ne0))
    # with the linked library built, the same conversion runs from it
    monkeypatch.setattr(native, "f16_rows", lambda raw, ne0, table: calls.append(ne0) or real_n(raw, ne0, table))
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    binary_quantize(f16, ref, ftype)
    r = run_cli(["quant", str(f16),"--type", ftype, "-o", str(ours)])
    assert r.exit_code == 0, r.stderr
    assert calls and ours.read_bytes() == ref.read_bytes(), f"{ftype} from F16 differs from llama-quantize"
    if ftype == "Q8_0":
        from llmkit.gguf.reader import read_gguf

        g = read_gguf(str(f16))
        t = next(t for t in g.tensors if t.name == "blk.1.ffn_up.weight")
        data = bytearray(f16.read_bytes())
        data[g.data_offset + t.offset + 2 * 300: g.data_offset + t.offset + 2 * 301] = b"\x00\x7e"  # a NaN half
        bad = tmp_path / "nan-f16.gguf"
        bad.write_bytes(bytes(data))
        n = len(calls)
        r = run_cli(["quant", str(bad),"--type", "Q8_0", "-o", str(tmp_path / "nan-out.gguf")])
        assert r.exit_code == 1 and "NaN/Inf" in r.stderr and "blk.1.ffn_up.weight" in r.stderr, r.stderr
        assert len(calls) > n and not (tmp_path / "nan-out.gguf").exists()


def test_compiled_kernels_ran(setup, monkeypatch, tmp_path):
    """LLMKIT_JIT=1 forces the numba kernels even where the run-time decision would skip them (a test
    model saves less than numba's start-up), so the whole-file test above does check them."""
    pytest.importorskip("numba")
    from llmkit.quant.formats import get_format, jit
    from llmkit.quant.write.quantize import quantize_file

    d, base, _, _ = setup
    seen = []
    real = jit.run
    monkeypatch.setattr(jit, "run", lambda name, *a: seen.append(name) or real(name, *a))
    quantize_file(str(base), str(tmp_path / "a.gguf"), "Q4_K_M")
    assert seen == []  # the run-time decision: too small to repay numba's start-up
    monkeypatch.setenv("LLMKIT_JIT", "1")
    quantize_file(str(base), str(tmp_path / "b.gguf"), "Q4_K_M")
    assert {"q4_k", "q6_k"} <= set(seen)
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    monkeypatch.setenv("LLMKIT_NO_JIT", "1")  # off wins over forced
    assert not get_format("Q4_K").compiled()


def test_two_runs_in_one_process_do_not_interfere(setup, monkeypatch, tmp_path):
    """A run whose decision leaves the kernels to numpy (a model too small to repay numba's start-up)
    does not switch them off for another caller quantizing meanwhile in the same process; each run's
    notice callback is its own (jit.Kernels is passed down a run, not kept in the module)."""
    pytest.importorskip("numba")
    from llmkit.quant.formats import get_format, jit
    from llmkit.quant.write.quantize import quantize_file

    d, base, _, _ = setup
    seen, real = [], jit.run
    monkeypatch.setattr(jit, "run", lambda name, *a: seen.append(name) or real(name, *a))
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    inside = []

    def other_caller(i, n, name):  # called in the middle of the small run
        if i == 3:
            inside.append(get_format("Q4_K").quantize(x))
            inside.append(list(seen))

    heard = []
    quantize_file(str(base), str(tmp_path / "a.gguf"), "Q4_K_M", progress=other_caller, notice=heard.append)
    assert inside and inside[1] == ["q4_k"]  # the other caller's kernel ran; the small run's did not
    assert seen == ["q4_k"]
    assert jit.Kernels(notice=heard.append).quiet().notice is None
    jit.Kernels(notice=heard.append).note_if_cold("_kernels", "no_such_kernel")
    assert len(heard) == 1 and "no_such_kernel" in heard[0]


def test_long_imatrix_path_cut_like_the_binary(setup, tmp_path):
    """quantize.cpp copies the path into a 128-byte kv-override: longer paths are cut at 127 bytes."""
    d, base, imx_gguf, _ = setup
    deep = tmp_path / ("x" * 60) / ("y" * 60)
    deep.mkdir(parents=True)
    long = deep / "imatrix.gguf"
    long.write_bytes(imx_gguf.read_bytes())
    assert len(str(long).encode()) > 127
    ref, ours = tmp_path / "bin.gguf", tmp_path / "ours.gguf"
    binary_quantize(base, ref, "Q4_0", long)
    assert run_cli(["quant", str(base),"--type", "Q4_0", "-o", str(ours), "--imatrix", str(long)]).exit_code == 0
    assert ours.read_bytes() == ref.read_bytes()
    assert metadata(ours)["quantize.imatrix.file"] == str(long)[:127]


def _read_imatrix_raw(path):
    """{name: (in_sum2, counts)} and the metadata of a GGUF imatrix, straight from the file."""
    from llmkit.gguf.reader import read_gguf

    g = read_gguf(str(path))
    out = {}
    with open(path, "rb") as f:
        for t in g.tensors:
            f.seek(g.data_offset + t.offset)
            out[t.name] = np.frombuffer(f.read(t.nbytes), "<f4").copy()
    return out, g.metadata


def with_bos(path: Path) -> Path:
    """The model with tokenizer.ggml.add_bos_token set to true (the bool's byte flipped in place)."""
    data = bytearray(path.read_bytes())
    key = b"tokenizer.ggml.add_bos_token"
    at = data.index(key) + len(key)
    assert struct.unpack("<I", data[at:at + 4])[0] == 7  # GGUF bool
    data[at + 4] = 1
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("n_ctx,chunks,bos", [(128, 5, True), (128, 0, True), (256, 0, False)])
def test_imatrix_equals_llama_imatrix(tmp_path, kernel_small, n_ctx, chunks, bos):
    """Same model, text, context and chunks: the same entries, token counts and chunk count, and sums
    equal within float tolerance (llama-imatrix adds float32 squares token by token, llmkit sums in
    float64; the two builds' matmul kernels differ in the last bits). With BOS, each chunk's first
    token is replaced by it, as llama-imatrix does."""
    base = write_tiny_llama(tmp_path / "m.gguf", n_embd=256, n_ff=512, n_layer=2, n_head=4, n_head_kv=2, seed=12)
    if bos:
        with_bos(base)
    text = tmp_path / "calib.txt"
    text.write_text(kernel_small.read_text(encoding="utf-8")[:12_000], encoding="utf-8")
    cpp, ours = tmp_path / "cpp.gguf", tmp_path / "ours.gguf"
    run_tool("llama-imatrix", "-m", base, "-f", text, "-o", cpp, "-c", n_ctx, "-b", n_ctx, "-t", 2, "--no-ppl",
             *(["--chunks", chunks] if chunks else []), timeout=600)
    r = run_cli(["quant", "imatrix", "-m", str(base), "--text", str(text), "-o", str(ours), "-c", str(n_ctx),
                 "--chunks", str(chunks), "--threads", "2"])
    assert r.exit_code == 0, r.stderr
    a, ma = _read_imatrix_raw(cpp)
    b, mb = _read_imatrix_raw(ours)
    assert sorted(a) == sorted(b) and len(a) == 2 * 2 * 7
    for k in ("imatrix.chunk_count", "imatrix.chunk_size", "imatrix.datasets"):
        assert ma[k] == mb[k], k
    assert (ma["imatrix.chunk_count"] == 5) if chunks else (ma["imatrix.chunk_count"] > 5)  # all full chunks
    for name in a:
        if name.endswith(".counts"):
            assert np.array_equal(a[name], b[name]), name
        else:
            np.testing.assert_allclose(b[name], a[name], rtol=2e-4, atol=1e-6, err_msg=name)


def test_build_script_completes_an_old_cache(tmp_path):
    """A cache made before llama-imatrix was added is completed (the script goes on to build), a full
    one is used as it is. A stub python stands in: it reports the version and fails at pip."""
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\nif [ "$1" = "-c" ]; then echo 0.3.36; exit 0; fi\nexit 3\n')
    stub.chmod(0o755)
    cache = tmp_path / "cache" / "llama-server-0.3.36"
    cache.mkdir(parents=True)
    for t in ("llama-server", "llama-perplexity", "llama-quantize"):
        (cache / t).write_text("")
        (cache / t).chmod(0o755)
    env = {**os.environ, "PYTHON": str(stub), "LLMKIT_CACHE": str(tmp_path / "cache")}
    run = lambda: subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_server.sh")], capture_output=True,  # noqa: E731
                                 text=True, env=env, timeout=60)
    assert run().returncode == 3  # llama-imatrix missing: it went on to fetch the source and build
    (cache / "llama-imatrix").write_text("")
    (cache / "llama-imatrix").chmod(0o755)
    p = run()
    assert p.returncode == 0 and p.stdout.strip() == str(cache / "llama-server")
