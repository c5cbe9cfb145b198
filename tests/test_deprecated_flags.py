"""Old flag spellings keep working until the next minor version, with a one-line note naming the new one."""

import json

import pytest

from conftest import run_cli


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    corpus = d / "c.txt"
    corpus.write_text("hug pug pun bun hugs\n" * 20)
    out = d / "bpe.json"
    assert run_cli(["tokenize", "train", "--algo", "bpe", "--vocab-size", "270", "-o", str(out), str(corpus)]).exit_code == 0
    return out, corpus


def test_tokenize_t_is_now_m_with_a_note(tok):
    path, corpus = tok
    new = run_cli(["tokenize", "encode", "-m", str(path), "hug the bug"])
    old = run_cli(["tokenize", "encode", "-t", str(path), "hug the bug"])
    assert old.exit_code == new.exit_code == 0 and old.stdout == new.stdout
    assert "`llmkit tokenize encode -t` is now `-m`" in old.stderr and "llmkit 0.3" in old.stderr
    assert "Note:" not in new.stderr
    old_long = run_cli(["tokenize", "stats", "--json", "--tokenizer", str(path), str(corpus)])
    assert old_long.exit_code == 0 and json.loads(old_long.stdout)[0]["tokenizer"] and "is now `--model`" in old_long.stderr
    assert run_cli(["tokenize", "inspect", str(path), "-n", "2", "--json"]).exit_code == 0


def test_the_note_is_said_once_per_command(tok):
    from llmkit.commands.deprecated import Renamed, rewrite

    notes = []
    args = rewrite(["-t", "a.json", "-t", "b.json"], [Renamed("-t", "-m")], "llmkit x", notes=notes)
    assert args == ["-m", "a.json", "-m", "b.json"] and len(notes) == 1
    r = run_cli(["tokenize", "stats", "--json", "-t", str(tok[0]), "-t", str(tok[0]), str(tok[1])])
    assert r.exit_code == 0 and r.stderr.count("Note:") == 1


def test_quant_t_with_a_type_is_now_type_and_t_is_threads(tmp_path):
    from ggufmake import write_tiny_llama

    src = write_tiny_llama(tmp_path / "m.gguf", n_embd=64, n_ff=128, n_layer=1, n_head=2, n_head_kv=2, seed=3)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    old = run_cli(["quant", str(src), "-t", "Q8_0", "-o", str(a)])
    new = run_cli(["quant", str(src), "--type", "Q8_0", "-t", "1", "-o", str(b)])
    assert old.exit_code == new.exit_code == 0
    assert a.read_bytes() == b.read_bytes()
    assert "`llmkit quant quantize -t` is now `--type`" in old.stderr and "Note:" not in new.stderr
    assert run_cli(["quant", str(src), "--type", "Q8_0", "--ctx", "64", "-o", str(b)]).exit_code == 0
