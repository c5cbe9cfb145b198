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


def test_dequant_reads_quantized_tensors_without_importing_quant_first():
    """gguf.dequant imports no quant module itself; the formats register their dequantizers on first use."""
    import subprocess
    import sys

    code = ("import sys, numpy as np\n"
            "from llmkit.gguf.dequant import to_f32\n"
            "from llmkit.gguf.reader import TensorInfo\n"
            "assert not [m for m in sys.modules if m.startswith('llmkit.quant')]\n"
            "block = np.float16(0.5).tobytes() + np.arange(-16, 16, dtype=np.int8).tobytes()  # one Q8_0 block\n"
            "y = to_f32(np.frombuffer(block, np.uint8), TensorInfo('w', (32,), 8, 0, len(block)))\n"
            "assert np.array_equal(y, 0.5 * np.arange(-16, 16, dtype=np.float32).reshape(1, 32)), y\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_dequant_refuses_a_type_no_format_reads():
    import numpy as np

    from llmkit.errors import BadInput
    from llmkit.gguf.dequant import to_f32
    from llmkit.gguf.reader import TensorInfo

    with pytest.raises(BadInput, match="which llmkit cannot read"):
        to_f32(np.zeros(8, np.uint8), TensorInfo("w", (4,), 4, 0, 8))  # type 4 (Q4_2) was removed from ggml
