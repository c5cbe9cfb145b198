"""GGUF vocabularies give the same ids as llama.cpp's own tokenizer (llama_cpp vocab_only)."""

import pytest

from ggufmake import write_vocab_gguf
from llmkit import tokenize
from llmkit.errors import BadFileFormat
from llmkit.io import iter_lines
from llmkit.tokenize.training.train import train

llama_cpp = pytest.importorskip("llama_cpp")

TAIL = " 你好，世界 🙂 \x01\x7f  x 12345 don't  DON'T\n\n  end  "


@pytest.fixture(scope="module")
def bpe_tok(kernel_small):
    return train(iter_lines([str(kernel_small)]), "bpe", 1200)


def _llama(path):
    return llama_cpp.Llama(str(path), vocab_only=True, verbose=False)


@pytest.mark.parametrize("pre", ["default", "gpt-2", "llama3", "qwen2", "smollm"])
def test_gpt2_vocab_matches_llama_cpp(bpe_tok, kernel_small, tmp_path, pre):
    m = bpe_tok.model
    tokens = [m.id_to_token[i] for i in range(len(m.id_to_token))]
    path = write_vocab_gguf(tmp_path / "v.gguf", "gpt2", tokens, merges=m.merges, pre=pre)
    ours = tokenize.load(str(path))
    text = kernel_small.read_text(encoding="utf-8")[:60_000] + TAIL
    assert ours.encode(text) == _llama(path).tokenize(text.encode(), add_bos=False, special=False)
    assert ours.decode(ours.encode(text)) == text


def test_spm_vocab_matches_llama_cpp(kernel_small, tmp_path):
    uni = train(iter_lines([str(kernel_small)]), "unigram", 900).model
    tokens = [p for p, _ in uni.pieces] + [f"<0x{b:02X}>" for b in range(256)]
    scores = [s for _, s in uni.pieces] + [0.0] * 256
    types = [2] + [1] * (len(uni.pieces) - 1) + [6] * 256
    path = write_vocab_gguf(tmp_path / "s.gguf", "llama", tokens, scores=scores, types=types)
    ours = tokenize.load(str(path))
    text = kernel_small.read_text(encoding="utf-8")[:60_000] + TAIL
    ids = ours.encode(text)
    assert ids == _llama(path).tokenize(text.encode(), add_bos=False, special=False)
    assert ours.decode(ids) == text


def test_gguf_without_vocabulary_is_refused(tmp_path):
    import gguf

    p = tmp_path / "novocab.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_context_length(16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(BadFileFormat, match="no tokenizer vocabulary"):
        tokenize.load(str(p))


def test_a_gguf_name_that_is_not_gguf_is_called_that(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_text("hello\n")
    with pytest.raises(BadFileFormat, match="is not a GGUF file"):
        tokenize.load(str(p))


def test_crafted_huge_array_fails_fast(tmp_path):
    """A 49-byte file declaring an array of 2^63 elements: refused at once, no allocation."""
    import struct
    import time

    p = tmp_path / "evil.gguf"
    key = b"tokenizer.ggml.tokens"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                  + struct.pack("<IIQ", 9, 8, 1 << 63))
    t = time.perf_counter()
    with pytest.raises(BadFileFormat, match="more than the file holds"):
        tokenize.load(str(p))
    assert time.perf_counter() - t < 0.5
