"""`gguf inspect --json --full` (and its alias `quant inspect`) prints whole arrays, equal to what
gguf-py reads; without --full an array is its type, length and first items."""

import json

from conftest import run_cli


def test_full_arrays_equal_gguf_py(tmp_path):
    import gguf

    from ggufmake import byte_vocab, write_tiny_llama

    p = write_tiny_llama(tmp_path / "t.gguf", seed=1)
    tokens = byte_vocab() + ["Ġt", "he", "Ġthe"]
    reader = gguf.GGUFReader(str(p))
    ref = reader.fields["tokenizer.ggml.tokens"]
    assert [bytes(ref.parts[i]).decode() for i in ref.data] == tokens
    for cmd in (["gguf", "inspect"], ["quant", "inspect"]):
        full = json.loads(run_cli([*cmd, "--json", "--full", str(p)]).stdout)["metadata"]
        assert full["tokenizer.ggml.tokens"] == tokens
        assert full["tokenizer.ggml.merges"] == ["Ġ t", "h e", "Ġt he"]
        assert full["tokenizer.ggml.token_type"] == [1] * 256 + [3, 3] + [1] * 3
        short = json.loads(run_cli([*cmd, "--json", str(p)]).stdout)["metadata"]["tokenizer.ggml.tokens"]
        assert short["length"] == len(tokens) and short["head"] == tokens[: len(short["head"])] and short["array"] == "str"
