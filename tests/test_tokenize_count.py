"""`tokenize count`, `truncate` and `split`: per-file counts equal HF tokenizers' ids for each file's whole
text (special tokens not added), directory subtotals and totals add up, bad files are listed as
skipped; truncated text and split pieces stay within the budget and the pieces give the input back."""

import csv
import io
import json
import os

import pytest
from conftest import run_cli

from ggufmake import write_vocab_gguf
from llmkit import tokenize
from llmkit.io import iter_lines
from llmkit.tokenize.corpus import count as count_mod
from llmkit.tokenize.corpus.budget import split, truncate
from llmkit.tokenize.training.train import train

hf = pytest.importorskip("tokenizers")

SPECIAL = "<|endoftext|>"
# what a whole file has and a line-by-line count would miss: a newline before indentation is one
# pre-token with the spaces after it, CRLF, an added token written in the text, and non-ASCII text
TEXTS = {
    "src/a.py": "def f(x):\n    return x  # done\n\n\n    pass\r\nclass B:  \n\tpass\n",
    "src/pkg/b.md": f"# Title\n\nSome words. More words!{SPECIAL}after\n  indented line\n",
    "src/pkg/c.txt": "naïve café — 你好，世界 🙂 don't DON'T 12345\n" * 3,
    "notes.txt": "The kernel's memory management.\n" * 40,
    "empty.txt": "",
}


@pytest.fixture(scope="module")
def toks(kernel_small, tmp_path_factory):
    """tokenizer.json files: HF-trained byte-level BPE (with an added special token), llmkit-trained BPE
    and WordPiece; a GGUF vocabulary made of the llmkit BPE."""
    d = tmp_path_factory.mktemp("toks")
    text = kernel_small.read_text(encoding="utf-8")[:40_000]
    corpus = d / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    t = hf.Tokenizer(hf.models.BPE())
    t.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = hf.decoders.ByteLevel()
    t.train([str(corpus)], hf.trainers.BpeTrainer(vocab_size=400, show_progress=False, special_tokens=[SPECIAL],
                                                  initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet()))
    t.save(str(d / "hf.json"))
    bpe = train(iter_lines([str(corpus)]), "bpe", 330)
    bpe.save(str(d / "llmkit.json"))
    train(iter_lines([str(corpus)]), "wordpiece", 200).save(str(d / "wp.json"))
    m = bpe.model
    write_vocab_gguf(d / "v.gguf", "gpt2", [m.id_to_token[i] for i in range(len(m.id_to_token))], merges=m.merges,
                     pre="gpt-2")
    return {k: str(d / f"{k}.json") for k in ("hf", "llmkit", "wp")} | {"gguf": str(d / "v.gguf")}


def hf_count(tok_json: str, text: str) -> int:
    return len(hf.Tokenizer.from_file(tok_json).encode(text, add_special_tokens=False).ids)


def _unreadable(path, monkeypatch):
    """Make `path` unreadable: chmod 0, and for root (who reads it anyway) os.open refuses it."""
    path.chmod(0)
    if os.geteuid() == 0:
        real = os.open

        def refuse(p, *a, **k):
            if os.path.abspath(os.fspath(p)) == str(path):
                raise PermissionError(13, "Permission denied", str(path))
            return real(p, *a, **k)

        monkeypatch.setattr(os, "open", refuse)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    for rel, text in TEXTS.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text.encode("utf-8"))
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / "debug.log").write_text("ignored by .gitignore\n")
    (root / "build").mkdir()
    (root / "build" / "out.txt").write_text("ignored directory\n")
    (root / ".hidden.txt").write_text("hidden\n")
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait, " .encode("latin-1") * 3)
    (root / "loop1").symlink_to(root / "loop2")
    (root / "loop2").symlink_to(root / "loop1")
    (root / "src" / "up").symlink_to(root)  # a directory link back up: not followed
    secret = root / "secret.txt"
    secret.write_text("no access\n")
    _unreadable(secret, monkeypatch)
    monkeypatch.chdir(tmp_path)
    return root


def test_count_equals_hf_for_every_file_with_subtotals_and_skipped(tree, toks):
    r = run_cli(["tokenize", "count", "-m", toks["hf"], "-m", toks["llmkit"], "-m", toks["wp"], "-m", toks["gguf"],
                 "-t", "2", "--json", "proj"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["tokenizers"] == [toks["hf"], toks["llmkit"], toks["wp"], toks["gguf"]]
    files = {os.path.relpath(f["path"], "proj"): f for f in d["files"]}
    assert set(files) == set(TEXTS)  # not the ignored, hidden, binary or unreadable ones
    for rel, f in files.items():
        for name in ("hf", "llmkit", "wp"):
            assert f["tokens"][toks[name]] == hf_count(toks[name], TEXTS[rel]), (rel, name)
        # the GGUF vocabulary is the llmkit BPE with GPT-2's pre-tokenizer: the same ids
        assert f["tokens"][toks["gguf"]] == f["tokens"][toks["llmkit"]]
        assert f["bytes"] == len(TEXTS[rel].encode("utf-8"))
    assert files["src/pkg/b.md"]["tokens"][toks["hf"]] < hf_count(toks["hf"], TEXTS["src/pkg/b.md"].replace(SPECIAL, "<|x|>"))
    for name in toks.values():
        assert d["total"]["tokens"][name] == sum(f["tokens"][name] for f in files.values())
    dirs = {os.path.relpath(x["path"], "proj"): x for x in d["directories"]}
    assert dirs["src/pkg"]["files"] == 2
    assert dirs["src/pkg"]["tokens"][toks["hf"]] == sum(files[f"src/pkg/{n}"]["tokens"][toks["hf"]] for n in ("b.md", "c.txt"))
    assert dirs["src"]["files"] == 3 and dirs["."]["files"] == 5
    skipped = {os.path.basename(s["path"]): s["reason"] for s in d["skipped"]}
    assert skipped["logo.png"] == "binary" and skipped["latin1.txt"] == "not UTF-8 (byte 3)"
    assert skipped["secret.txt"] == "Permission denied"
    assert "symbolic links" in skipped["loop1"] and "symbolic links" in skipped["loop2"]
    assert d["total"]["skipped"] == 5 and d["total"]["ignored"] == 2 and d["max_tokens"] is None
    assert "5 file(s) skipped" in r.stderr


def test_tree_text_max_tokens_and_no_gitignore(tree, toks):
    big = hf_count(toks["hf"], TEXTS["notes.txt"])
    r = run_cli(["tokenize", "count", "-m", toks["hf"], "--max-tokens", str(big - 1), "proj/src", "proj/notes.txt"])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == [toks["hf"], "path"]
    rows = {ln.split()[1]: ln for ln in lines[1:]}
    assert lines[1].split()[1] == "proj/" and "      a.py" in rows["a.py"] and "    src/" in rows["src/"]
    assert rows["notes.txt"].split()[0] == str(big) and rows["notes.txt"].endswith(f"  notes.txt  (over {big - 1})")
    assert lines[-1].split()[1:3] == ["total", "(4"] and "1 file(s) over" in r.stderr
    # the .gitignore of proj/ is found only when walking proj/ itself
    r = run_cli(["tokenize", "count", "-m", toks["hf"], "--json", "proj"])
    r2 = run_cli(["tokenize", "count", "-m", toks["hf"], "--json", "--no-gitignore", "proj"])
    paths = {os.path.basename(f["path"]) for f in json.loads(r2.stdout)["files"]}
    assert {"debug.log", "out.txt"} <= paths and not {"debug.log", "out.txt"} & {
        os.path.basename(f["path"]) for f in json.loads(r.stdout)["files"]}


def test_csv_globs_and_stdin(tree, toks):
    r = run_cli(["tokenize", "count", "-m", toks["hf"], "-m", toks["wp"], "--csv", "proj/src/**/*.*", "-"],
                input="from stdin\n  indented\n")
    assert r.exit_code == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    by_path = {x["path"]: x for x in rows}
    assert set(by_path["proj/src/pkg/c.txt"]) == {"path", "kind", "files", "bytes", toks["hf"], toks["wp"],
                                                  "over_budget", "skipped"}
    assert int(by_path["-"][toks["hf"]]) == hf_count(toks["hf"], "from stdin\n  indented\n")
    assert int(by_path["proj/src/a.py"][toks["wp"]]) == hf_count(toks["wp"], TEXTS["src/a.py"])
    total = rows[-1]
    assert total["kind"] == "total" and total["files"] == "4"
    assert int(total[toks["hf"]]) == sum(int(x[toks["hf"]]) for x in rows if x["kind"] == "file")


def test_count_refuses_bad_usage(tree, toks):
    r = run_cli(["tokenize", "count", "-m", toks["hf"], "--json", "--csv", "proj"])
    assert r.exit_code == 2 and "cannot be used together" in r.stderr
    r = run_cli(["tokenize", "count", "-m", toks["hf"], "proj/nothing-here.txt"])
    assert r.exit_code == 1 and "does not exist" in r.stderr
    r = run_cli(["tokenize", "count", "-m", toks["hf"], "proj/*.nope"])
    assert r.exit_code == 1 and "no file matches" in r.stderr


def test_double_star_goes_where_the_directory_walk_goes(tmp_path, monkeypatch):
    """'**' skips junk directories (node_modules, venv) and what .gitignore files exclude, at any depth;
    a final '**' gives the files under it, never directories (so nothing is walked twice)."""
    from llmkit.walk import expand_glob

    files = ["src/a.py", "src/sub/b.py", "src/sub/c.txt", "src/sub/gen/d.py", "src/node_modules/m/e.py",
             "src/venv/lib/site-packages/f.py", "src/x.log", "src/.hidden/g.py"]
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    (tmp_path / "src" / ".gitignore").write_text("*.log\n")
    (tmp_path / "src" / "sub" / ".gitignore").write_text("gen/\n")
    monkeypatch.chdir(tmp_path)
    assert expand_glob("src/**/*.py") == (["src/a.py", "src/sub/b.py"], 3)  # node_modules, venv, sub/gen
    assert expand_glob("src/**/*.py", gitignore=False) == (["src/a.py", "src/sub/b.py", "src/sub/gen/d.py"], 2)
    assert expand_glob("src/**") == (["src/a.py", "src/sub/b.py", "src/sub/c.txt"], 4)  # and x.log
    assert expand_glob("src/**/*") == (["src/a.py", "src/sub/b.py", "src/sub/c.txt"], 4)
    assert expand_glob("src/*/*.py") == (["src/sub/b.py"], 0)  # no '**': named directories are not skipped
    assert expand_glob("src/**/m/*.py") == ([], 3)  # m is inside node_modules
    entries, ignored, _ = count_mod.plan(["src/**"])
    assert [e.path for e in entries] == ["src/a.py", "src/sub/b.py", "src/sub/c.txt"] and ignored == 4


def test_compiled_and_python_counts_equal_hf(toks, kernels, monkeypatch):
    texts = list(TEXTS.values()) + [SPECIAL * 3, f"a{SPECIAL}\n\n  b" * 50]
    want = [hf_count(toks["hf"], t) for t in texts]
    tok = tokenize.load(toks["hf"])
    assert tok.model.native() is not None
    assert count_mod.count_texts(tok, texts) == want
    monkeypatch.setenv("LLMKIT_NO_JIT", "1")
    slow = tokenize.load(toks["hf"])
    assert slow.model.native() is None and count_mod.count_texts(slow, texts) == want


def test_vanished_and_changing_files_are_skipped(tmp_path, toks, monkeypatch):
    for name in ("gone.txt", "grows.txt", "stays.txt"):
        (tmp_path / name).write_text("some text\n")
    entries, _, _ = count_mod.plan([str(tmp_path)])
    (tmp_path / "gone.txt").unlink()
    real = os.fstat
    calls = []

    def growing(fd):
        st = real(fd)
        calls.append(fd)
        return os.stat_result((*st[:6], st.st_size + len(calls), *st[7:10]))

    grows = next(e for e in entries if e.path.endswith("grows.txt"))
    monkeypatch.setattr(os, "fstat", growing)
    assert count_mod._read(grows, 1 << 20) == (b"", "changed while read")
    monkeypatch.setattr(os, "fstat", real)
    got = {os.path.basename(f.path): f for f in count_mod._count_batch([tokenize.load(toks["hf"])], entries, 1 << 20, 0)}
    assert got["gone.txt"].skipped == "No such file or directory"
    assert got["stays.txt"].tokens == [hf_count(toks["hf"], "some text\n")]


def _long_text(kernel_small) -> str:
    text = kernel_small.read_text(encoding="utf-8")[:6000]
    return text + "x" * 300 + " no sentence end " * 40 + "\n" + "ünïcödé 🙂 " * 30 + "\r\nend"


@pytest.mark.parametrize("name", ["hf", "wp"])
def test_split_pieces_fit_and_give_the_input_back(kernel_small, toks, tmp_path, name):
    text = _long_text(kernel_small)
    src = tmp_path / "in.txt"
    src.write_bytes(text.encode("utf-8"))
    for n in (4, 40):  # a character is at most 4 bytes: 4 byte-level tokens
        r = run_cli(["tokenize", "split", "-m", toks[name], "--max-tokens", str(n), "--jsonl", str(src)])
        assert r.exit_code == 0, r.stderr
        pieces = [json.loads(x) for x in r.stdout.splitlines()]
        assert "".join(p["text"] for p in pieces) == text
        for p in pieces:
            assert p["tokens"] == hf_count(toks[name], p["text"]) <= n
    # a budget that holds every line: pieces end at line ends
    lines = kernel_small.read_text(encoding="utf-8")[:3000]
    lines = lines[: lines.rindex("\n") + 1]
    pieces = [p for p, _ in split(tokenize.load(toks[name]), iter_lines([str(_write(tmp_path, lines))]), 200)]
    assert "".join(pieces) == lines and all(p.endswith("\n") for p in pieces) and len(pieces) > 1


def _write(tmp_path, text):
    p = tmp_path / "lines.txt"
    p.write_text(text, encoding="utf-8")
    return p


def test_split_text_output_with_separators(toks):
    text = "One sentence here. Another one there! " * 20 + "\nshort\n"
    r = run_cli(["tokenize", "split", "-m", toks["hf"], "--max-tokens", "25", "-"], input=text)
    assert r.exit_code == 0, r.stderr
    pieces = r.stdout.split("\0")
    assert len(pieces) > 2 and "".join(pieces) == text
    assert all(hf_count(toks["hf"], p) <= 25 for p in pieces)
    assert all(p.endswith(("! ", ". ", "\n")) for p in pieces[:-1])  # cut at sentence ends
    r = run_cli(["tokenize", "split", "-m", toks["hf"], "--max-tokens", "25", "--separator", "\n====\n", "-"], input=text)
    assert r.stdout.split("\n====\n") == pieces


@pytest.mark.parametrize("keep", ["head", "tail", "both"])
def test_truncate_fits_the_budget(kernel_small, toks, tmp_path, keep):
    text = _long_text(kernel_small)
    src = tmp_path / "in.txt"
    src.write_bytes(text.encode("utf-8"))
    for name in ("hf", "wp"):
        r = run_cli(["tokenize", "truncate", "-m", toks[name], "--max-tokens", "50", "--keep", keep,
                     "--marker", " [cut] ", "--json", str(src)])
        assert r.exit_code == 0, r.stderr
        d = json.loads(r.stdout)
        out = d["text"]
        assert d["cut"] and d["tokens"] == hf_count(toks[name], out) <= 50 and d["tokens"] >= 40
        assert d["input_tokens"] == hf_count(toks[name], text)
        head, _, tail = out.partition(" [cut] ")
        assert text.startswith(head) and text.endswith(tail)
        assert (keep == "tail") == (head == "") and (keep == "head") == (tail == "")
    r = run_cli(["tokenize", "truncate", "-m", toks["hf"], "--max-tokens", "30", "--keep", keep, str(src)])
    assert r.exit_code == 0 and hf_count(toks["hf"], r.stdout) <= 30 and "[...]" in r.stdout
    assert "kept" in r.stderr


def test_truncate_leaves_a_fitting_text_and_refuses_a_long_marker(toks):
    r = run_cli(["tokenize", "truncate", "-m", toks["hf"], "--max-tokens", "100", "-"], input="short text\n")
    assert r.exit_code == 0 and r.stdout == "short text\n"
    r = run_cli(["tokenize", "truncate", "-m", toks["hf"], "--max-tokens", "2", "--marker", "a long marker here", "-"],
                input="some text that is longer than two tokens\n")
    assert r.exit_code == 1 and "--marker alone takes" in r.stderr and "Raise --max-tokens" in r.stderr


def test_budget_errors_say_what_is_wrong_and_how_to_fix_it(toks):
    from llmkit.errors import OptionError

    tok = tokenize.load(toks["hf"])
    with pytest.raises(OptionError) as e:
        truncate(tok, "word " * 50, 5, "middle")
    assert str(e.value) == "keep must be head, tail or both, not 'middle'. Pass one of those three."
    with pytest.raises(OptionError) as e:
        truncate(tok, "word " * 50, 2, "head", " [...] " * 10)
    assert str(e.value).endswith("Raise max_tokens or shorten the marker.")
    with pytest.raises(OptionError) as e:
        list(split(tok, ["a line\n"], 0))
    assert e.value.spelled({"max_tokens": "--max-tokens"}) == (
        "--max-tokens must be at least 1 to split, not 0. Pass a budget of 1 token or more.")


def test_truncate_both_library(toks):
    tok = tokenize.load(toks["hf"])
    r = truncate(tok, "word " * 200, 21, "both", "")
    assert r.cut and r.tokens <= 21 and r.text.startswith("word") and r.text.endswith("word ")


def test_tokens_added_around_a_text_are_not_counted(toks, tmp_path):
    """A post-processor that adds BOS to every text (as Llama's does): count, truncate and split leave it
    out, as HF's add_special_tokens=False does; a BOS written in the text is counted."""
    t = hf.Tokenizer.from_file(toks["hf"])
    t.post_processor = hf.processors.TemplateProcessing(single=f"{SPECIAL} $A", special_tokens=[(SPECIAL, 0)])
    bos = str(tmp_path / "bos.json")
    t.save(bos)
    text = f"Some words.\n  {SPECIAL} written in the text\n"
    assert len(t.encode(text).ids) == hf_count(bos, text) + 1
    r = run_cli(["tokenize", "count", "-m", bos, "--json", "-"], input=text)
    assert json.loads(r.stdout)["total"]["tokens"][bos] == hf_count(bos, text)
    r = run_cli(["tokenize", "split", "-m", bos, "--max-tokens", "5", "--jsonl", "-"], input=text)
    assert all(json.loads(x)["tokens"] == hf_count(bos, json.loads(x)["text"]) <= 5 for x in r.stdout.splitlines())
