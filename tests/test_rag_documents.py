"""The documents users have: source code chunked at definitions (tree-sitter), identifiers found by
their parts, .gitignore, every skipped file reported per extension, reStructuredText, Word, CSV/TSV,
notebooks and EPUB; syntax errors and minified files counted; path:line in hits."""

import json
from pathlib import Path

import pytest

from conftest import run_cli

PY = '''"""Configuration loading."""
import os

DEFAULT = "/etc/app.conf"


def parse_config(path):
    """Read the configuration file and return a dict."""
    with open(path) as f:
        return dict(line.split("=", 1) for line in f)


class ConfigStore:
    """Keeps parsed configurations by name."""

    cache_size = 16

    def __init__(self):
        self.items = {}

    # load one file from the system directory
    def loadFromDisk(self, name):
        return parse_config(os.path.join("/etc", name))

    def drop(self, name):
        self.items.pop(name, None)
'''
GO = '''package main

import "fmt"

// Server holds the listening port.
type Server struct {
	port int
}

// Start prints the port.
func (s *Server) Start() error {
	fmt.Println(s.port)
	return nil
}
'''
TS = '''import { x } from "y";
export const retryRequest = async (url: string): Promise<number> => { return 1; };
export class HttpClient {
  get(url: string) { return url; }
}
'''
C = '''#include <stdio.h>
static struct node *make_node(int value) {
    return NULL;
}
'''


def test_python_definitions_symbols_and_lines():
    from llmkit.rag.read.code import chunk_code

    chunks, how = chunk_code(PY, "python", 200)
    assert how == "parsed"
    got = {(c.symbol, c.kind): (c.line_start, c.line_end) for c in chunks}
    assert got[("parse_config", "function")] == (7, 10)
    assert got[("ConfigStore.loadFromDisk", "method")] == (21, 23)  # with the comment above it
    # the class header (docstring, fields) is joined to its first member
    assert got[("ConfigStore.__init__", "method")] == (13, 19)
    assert ("", "module") in got and got[("", "module")][0] == 1
    first = next(c for c in chunks if c.symbol == "ConfigStore.__init__")
    assert "cache_size = 16" in first.text and "class ConfigStore:" in first.text
    lines = PY.split("\n")
    for c in chunks:  # every chunk is its lines of the file, a member after a line naming it
        own = "\n".join(lines[c.line_start - 1:c.line_end])
        named = "." in c.symbol and c.symbol != "ConfigStore.__init__"  # the first member shows the class
        assert c.text == (f"# {c.symbol}\n{own}" if named else own)
    # even when the whole class fits, each method is its own unit
    whole, _ = chunk_code(PY, "python", 1500)
    assert [c.symbol for c in whole if c.symbol.startswith("ConfigStore")] == [
        "ConfigStore.__init__", "ConfigStore.loadFromDisk", "ConfigStore.drop"]


def test_pieces_of_a_long_definition_name_it():
    from llmkit.rag.read.code import chunk_code

    src = "def long_one(x):\n" + "".join(f"    y{i} = x + {i}\n" for i in range(40))
    chunks, _ = chunk_code(src, "python", 120)
    assert len(chunks) > 2 and chunks[0].text.startswith("def long_one")
    assert all(c.text.startswith("# long_one\n") for c in chunks[1:])
    ts, _ = chunk_code(TS.replace("}\n}", "}\n  put(url: string) { return url; }\n}"), "typescript", 1500)
    assert next(c for c in ts if c.symbol == "HttpClient.put").text.startswith("// HttpClient.put\n")
    go, _ = chunk_code(GO, "go", 1500)  # a Go method's receiver already names its type
    assert next(c for c in go if c.symbol == "Server.Start").text.startswith("// Start prints")


@pytest.mark.parametrize("src,lang,want", [
    (GO, "go", {("Server", "type"), ("Server.Start", "method")}),
    (TS, "typescript", {("retryRequest", "function"), ("HttpClient.get", "method")}),
    (C, "c", {("make_node", "function")}),
])
def test_other_languages(src, lang, want):
    from llmkit.rag.read.code import chunk_code

    chunks, how = chunk_code(src, lang, 1500)
    assert how == "parsed"
    assert want <= {(c.symbol, c.kind) for c in chunks}


def test_syntax_error_falls_back_to_lines():
    from llmkit.rag.read.code import chunk_code

    chunks, how = chunk_code("def broken(:\n    return 1\n", "python", 1500)
    assert how == "syntax error" and chunks[0].kind == "lines" and chunks[0].line_start == 1


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    (root / "src").mkdir()
    (root / "src" / "config.py").write_text(PY)
    (root / "src" / "server.go").write_text(GO)
    (root / "src" / "client.ts").write_text(TS)
    (root / "src" / "bad.py").write_text("def broken(:\n    return 1\n")
    (root / "src" / "app.min.js").write_text("var a=" + ",".join(str(i) for i in range(3000)) + ";\n")
    (root / "src" / "huge.py").write_text("x = 1\n" * 200_000)
    (root / "package-lock.json").write_text('{"lockfileVersion": 3}')
    (root / ".gitignore").write_text("build/\n*.log\n!keep.log\n")
    (root / "build").mkdir()
    (root / "build" / "out.txt").write_text("generated")
    (root / "debug.log").write_text("noise")
    (root / "keep.log").write_text("the keep log explains the zqkeep incident")
    (root / "node_modules" / "x").mkdir(parents=True)
    (root / "node_modules" / "x" / "i.js").write_text("module.exports = 1;")
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    (root / "data.bin").write_bytes(bytes(range(256)))
    docs = root / "docs"
    docs.mkdir()
    (docs / "guide.rst").write_text("Guide\n=====\n\nIntro text.\n\n=======\nInstall\n=======\n\nRun pip install zqrst.\n\n"
                                    "Usage\n-----\n\nStart the zqserver with --port.\n")
    (docs / "cities.csv").write_text("city,country,population\nParis,France,2100000\nBerlin,Germany,3600000\n"
                                     "Rome,Italy,2800000\n")
    (docs / "notes.tsv").write_text("term\tmeaning\nzqtsv\ta tab separated row\n")
    nb = {"cells": [{"cell_type": "markdown", "source": ["# Analysis\n", "We load the zqnotebook data."]},
                    {"cell_type": "code", "source": ["import pandas\n", "def load_frame(p):\n", "    return pandas.read_csv(p)\n"],
                     "outputs": [{"output_type": "stream", "text": ["zqoutput should not be indexed"]}]}],
          "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    (docs / "analysis.ipynb").write_text(json.dumps(nb))
    (docs / "broken.ipynb").write_text("{not json")
    import docx

    d = docx.Document()
    d.core_properties.title = "Quarterly report"
    d.add_heading("Revenue", level=1)
    d.add_paragraph("Revenue grew because of the zqdocx product line.")
    t = d.add_table(rows=2, cols=2)
    t.cell(0, 0).text, t.cell(0, 1).text = "region", "sales"
    t.cell(1, 0).text, t.cell(1, 1).text = "north", "zqtable"
    d.add_heading("Costs", level=1)
    d.add_paragraph("Costs fell.")
    d.save(str(docs / "report.docx"))
    (docs / "corrupt.docx").write_bytes(b"PK\x03\x04 not really a zip")
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("id1")
    book.set_title("A small book")
    book.set_language("en")
    ch = epub.EpubHtml(title="One", file_name="one.xhtml", lang="en")
    ch.content = "<html><body><h1>Chapter one</h1><p>The zqepub whale swims.</p></body></html>"
    book.add_item(ch)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", ch]
    epub.write_epub(str(docs / "book.epub"), book)
    idx = root.parent / (root.name + "-idx")
    r = run_cli(["rag", "index", str(idx), str(root), "--csv-meta", "population", "--json"])
    assert r.exit_code == 0, r.stderr
    return root, idx, json.loads(r.stdout), r.stderr


def _q(idx, text, *args):
    r = run_cli(["rag", "query", str(idx), text, "--jsonl", "-k", "3", *args])
    assert r.exit_code == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines()]


def test_skipped_files_are_counted_per_extension(repo):
    _, _, report, err = repo
    reasons = {Path(s["source"]).name: s["reason"] for s in report["skipped"]}
    assert reasons["logo.png"] == "unsupported type" and reasons["data.bin"] == "unsupported type"
    assert reasons["app.min.js"] == "minified" and reasons["package-lock.json"] == "lock file"
    assert reasons["huge.py"].startswith("too large for code")
    assert reasons["corrupt.docx"].startswith("unreadable .docx") and reasons["broken.ipynb"].startswith("not a notebook")
    assert "1 .png (unsupported type)" in err and "1 .bin (unsupported type)" in err and "1 .js (minified)" in err
    assert "1 file(s) (syntax error)" in err
    assert report["code_fallbacks"] == {"syntax error": 1}
    assert report["ignored"] == 3  # build/, debug.log, node_modules/ (keep.log is re-included)


def test_gitignore_is_respected(repo):
    _, idx, _, _ = repo
    assert _q(idx, "zqkeep", "--mode", "bm25")[0]["doc"].endswith("keep.log")
    assert not _q(idx, "generated", "--mode", "bm25")
    assert not _q(idx, "noise", "--mode", "bm25")


# (the class's members are named "ConfigStore.*" in their text, so "config" alone also finds them:
# the queries name the file the function reads too)
@pytest.mark.parametrize("query", ["parse_config", "parseConfig file", "parse config file"])
def test_identifiers_found_by_their_parts(repo, query):
    _, idx, _, _ = repo
    hit = _q(idx, query, "--mode", "bm25")[0]
    assert hit["meta"]["symbol"] == "parse_config" and hit["meta"]["kind"] == "function"
    assert hit["meta"]["language"] == "python" and hit["line"] == 7 and hit["meta"]["line_end"] == 10


def test_code_hits_show_path_and_line(repo):
    _, idx, _, _ = repo
    r = run_cli(["rag", "query", str(idx), "loadFromDisk", "--mode", "bm25", "-k", "1"])
    assert r.exit_code == 0
    assert "config.py:" in r.stdout and "(ConfigStore" in r.stdout
    hit = _q(idx, "Server Start port", "--mode", "bm25", "--filter", "language=go")[0]
    assert hit["meta"]["symbol"] in ("Server.Start", "Server")


def test_rst_docx_csv_notebook_epub(repo):
    _, idx, _, _ = repo
    h = _q(idx, "zqrst", "--mode", "bm25")[0]
    assert h["meta"]["section"] == "Install" and h["doc"].endswith("guide.rst")
    assert _q(idx, "zqserver", "--mode", "bm25")[0]["meta"]["section"] == "Usage"
    h = _q(idx, "zqdocx", "--mode", "bm25")[0]
    assert h["meta"]["section"] == "Revenue" and h["meta"]["title"] == "Quarterly report"
    assert _q(idx, "zqtable", "--mode", "bm25")[0]["doc"].endswith("report.docx")
    rows = _q(idx, "Germany", "--mode", "bm25")
    assert rows[0]["text"].startswith("city,country,population") and "Berlin" in rows[0]["text"]
    assert rows[0]["meta"]["population"] == 3600000 and rows[0]["meta"]["row_start"] == 3
    big = _q(idx, "city", "--mode", "bm25", "--filter", "population>2500000")
    assert {h["text"].split("\n")[1].split(",")[0] for h in big} == {"Berlin", "Rome"}
    assert _q(idx, "zqtsv", "--mode", "bm25")[0]["text"].startswith("term\tmeaning")
    assert _q(idx, "zqnotebook", "--mode", "bm25")[0]["doc"].endswith("analysis.ipynb")
    code_cell = _q(idx, "load_frame", "--mode", "bm25")[0]
    assert code_cell["meta"]["cell"] == 2 and code_cell["meta"]["symbol"] == "load_frame"
    assert not _q(idx, "zqoutput", "--mode", "bm25")  # outputs dropped
    h = _q(idx, "zqepub", "--mode", "bm25")[0]
    assert h["doc"].endswith("book.epub") and h["meta"]["title"] == "A small book"


def test_csv_meta_names_a_missing_column(repo, tmp_path):
    root, _, _, _ = repo
    r = run_cli(["rag", "index", str(tmp_path / "i"), str(root / "docs" / "cities.csv"), "--csv-meta", "area"])
    assert r.exit_code == 1 and "no CSV/TSV input has a column 'area'" in r.stderr
    assert not (tmp_path / "i").exists()  # refused before the index was touched
