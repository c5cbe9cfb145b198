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
    old_n = run_cli(["tokenize", "inspect", str(path), "-n", "2", "--json"])
    new_n = run_cli(["tokenize", "inspect", str(path), "--sample", "2", "--json"])
    assert old_n.exit_code == new_n.exit_code == 0 and old_n.stdout == new_n.stdout and "is now `--sample`" in old_n.stderr


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


def test_generate_modes_that_became_commands_are_forwarded_with_a_note(tmp_path):
    """`generate --grammar/--json-schema` runs `constrain`, `generate --server [--batch]` runs `server
    generate|batch`, `--slot/--slot-dir` are `--prompt-cache`, `--fixed-draft` is --draft-min = --draft-max."""
    from ggufmake import write_tiny_llama

    m = str(write_tiny_llama(tmp_path / "m.gguf", n_embd=64, n_ff=128, n_layer=1, n_head=2, n_head_kv=2, seed=3))
    new = run_cli(["constrain", "-m", m, "-n", "4", "--seed", "1", "--grammar", "root ::= [0-9]+", "--json", "N:"])
    old = run_cli(["generate", "-m", m, "-n", "4", "--seed", "1", "--grammar", "root ::= [0-9]+", "--json", "N:"])
    assert new.exit_code == old.exit_code == 0, old.stderr
    assert json.loads(old.stdout)["text"] == json.loads(new.stdout)["text"]
    assert "`llmkit generate --grammar` is now `llmkit constrain`" in old.stderr
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"id": 1, "prompt": "x"}\n')
    r = run_cli(["generate", "--server", "http://127.0.0.1:9", "--batch", str(batch)])
    assert r.exit_code == 1 and "is now `llmkit server batch`" in r.stderr and "no llama-server answers" in r.stderr
    r = run_cli(["generate", "--server", "http://127.0.0.1:9", "--slot-id", "0", "hello"])
    assert r.exit_code == 1 and "is now `llmkit server generate`" in r.stderr and "cannot reach llama-server" in r.stderr
    cache = tmp_path / "cache"
    a = run_cli(["generate", "-m", m, "-n", "3", "--temp", "0", "--slot-dir", str(cache), "--json", "hello there"])
    b = run_cli(["generate", "-m", m, "-n", "3", "--temp", "0", "--prompt-cache", str(cache), "--json", "hello there"])
    assert a.exit_code == b.exit_code == 0 and "`llmkit generate --slot-dir` is now `--prompt-cache`" in a.stderr
    assert json.loads(a.stdout)["text"] == json.loads(b.stdout)["text"] and len(list(cache.glob("*.slot"))) == 1
    f = run_cli(["generate", "-m", m, "-n", "8", "--temp", "0", "--draft-model", m, "--fixed-draft", "--draft-max", "2",
                 "--json", "hello"])
    n = run_cli(["generate", "-m", m, "-n", "8", "--temp", "0", "--draft-model", m, "--draft-min", "2", "--draft-max", "2",
                 "--json", "hello"])
    assert f.exit_code == n.exit_code == 0 and "--draft-min 2 --draft-max 2" in f.stderr
    assert json.loads(f.stdout)["stats"]["drafted"] == json.loads(n.stdout)["stats"]["drafted"] > 0
