"""`llmkit doctor` on this (full) install and on broken ones: a tool that dies, an unusable cache."""

import json
import os
import signal

from conftest import run_cli


def test_full_install_is_healthy_and_names_llama_cpp_and_its_tools():
    r = run_cli(["doctor", "--json"])
    assert r.exit_code == 0, r.stdout
    rep = json.loads(r.stdout)
    checks = {(c["section"], c["name"]): c for c in rep["checks"]}
    assert rep["ok"] and all(c["status"] != "error" for c in rep["checks"])
    assert checks["llama.cpp", "binding"]["status"] == "ok" and "llama-cpp-python 0.3" in checks["llama.cpp", "binding"]["detail"]
    for tool in ("llama-server", "llama-quantize", "llama-perplexity", "llama-imatrix"):
        assert checks["llama.cpp", tool]["status"] == "ok", checks["llama.cpp", tool]
    assert "commit" in checks["llama.cpp", "llama-server"]["detail"]  # the llama.cpp version it was built from
    for extra in ("llama", "rag", "quant", "model", "dev"):
        assert checks["features", extra]["status"] == "ok"
    assert checks["models", "generation"]["status"] == "ok"
    for lib in ("tokenize", "quant"):  # scripts/install.sh links them (python -m llmkit.build_native)
        assert checks["kernels", lib]["status"] == "ok", checks["kernels", lib]


def test_unbuilt_kernel_libraries_are_noted_with_the_command_that_builds_them(tmp_path, monkeypatch):
    from llmkit.quant.formats import native

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(native, "_LOADED", None)
    r = run_cli(["doctor"])
    assert r.exit_code == 0  # slower small inputs, not a broken install
    assert r.stdout.count("-m llmkit.build_native") == 2 and "not built yet" in r.stdout


def test_text_report_lists_sections():
    r = run_cli(["doctor"])
    assert r.exit_code == 0
    for line in ("features", "llama.cpp", "models", "caches", "everything installed can run"):
        assert line in r.stdout


def test_a_tool_that_dies_is_an_error_with_its_fix(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("llama-server", "llama-quantize", "llama-perplexity", "llama-imatrix"):
        p = bin_dir / tool
        p.write_text(f"#!/bin/sh\nkill -{int(signal.SIGILL)} $$\n")  # what a build for a missing CPU feature does
        p.chmod(0o755)
    monkeypatch.setenv("LLMKIT_LLAMA_BIN", str(bin_dir))
    r = run_cli(["doctor"])
    assert r.exit_code == 1
    assert "llama-quantize" in r.stdout and "killed by signal 4" in r.stdout
    assert "fix: bash scripts/build_llama_server.sh" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_an_unusable_cache_is_an_error_not_a_traceback(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "embed").write_text("")  # a file where a directory belongs still reports sizes
    bad = cache / "numba"
    bad.mkdir()
    monkeypatch.setenv("LLMKIT_CACHE", str(cache))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(bad))
    if os.geteuid() == 0:  # root reads everything: make the root a file instead
        cache2 = tmp_path / "cache-file"
        cache2.write_text("")
        monkeypatch.setenv("LLMKIT_CACHE", str(cache2))
        monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache2 / "numba"))
    else:
        bad.chmod(0)
    r = run_cli(["doctor", "--json"])
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    rep = json.loads(r.stdout)
    errs = [c for c in rep["checks"] if c["status"] == "error"]
    assert errs and errs[0]["section"] == "caches" and errs[0]["fix"]
