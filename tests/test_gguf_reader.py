"""The hardened GGUF reader on real files and on a corpus of malformed ones."""

import time

import pytest

from conftest import run_cli
from ggufbad import MALFORMED, good_file
from llmkit.errors import BadFileFormat
from llmkit.gguf.reader import read_gguf


def test_reads_a_valid_file(tmp_path):
    p = tmp_path / "ok.gguf"
    p.write_bytes(good_file())
    g = read_gguf(str(p))
    assert g.get("general.architecture") == "llama" and g.tensors[0].shape == (8,) and g.tensors[0].nbytes == 32


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_files_fail_fast_with_one_clear_sentence(tmp_path, name):
    assert len(MALFORMED) >= 25
    p = tmp_path / "bad.gguf"
    p.write_bytes(MALFORMED[name])
    t = time.perf_counter()
    with pytest.raises(BadFileFormat) as e:
        read_gguf(str(p))
    assert time.perf_counter() - t < 0.5
    assert str(p) in str(e.value)
    r = run_cli(["gguf", "inspect", str(p)])
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1


def test_inspect_real_tiny_model(tmp_path):
    import json

    from ggufmake import write_tiny_llama

    p = write_tiny_llama(tmp_path / "m.gguf", seed=1)
    d = json.loads(run_cli(["gguf", "inspect", "--json", str(p)]).stdout)
    assert d["metadata"]["general.architecture"] == "llama"
    assert d["metadata"]["tokenizer.ggml.tokens"]["length"] == 261
    names = [t["name"] for t in d["tensors"]]
    assert "token_embd.weight" in names and all(t["type"] == "F32" for t in d["tensors"])
    import gguf

    ref = gguf.GGUFReader(str(p))
    assert sorted(names) == sorted(t.name for t in ref.tensors)
    table = run_cli(["gguf", "inspect", str(p)])
    assert table.exit_code == 0 and "blk.0.attn_q.weight" in table.stdout
