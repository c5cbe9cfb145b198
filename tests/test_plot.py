"""`--plot FILE` (llmkit.plot): the written chart files parsed back (SVG as XML: its series and
labels; PNG: a valid image of the requested size; PDF: its header), refusals before any work starts,
and the charts of `rag eval` and `tokenize stats` with the data behind them in their JSON output.
`quant sweep --plot` is tested in test_quant_sweep.py."""

import json

import pytest

from chartread import png_size, svg_ids, svg_notes, svg_series, svg_texts
from conftest import run_cli


def test_chart_formats_by_extension(tmp_path):
    from llmkit.plot import SIZE, Panel, Series, draw

    panels = [Panel("memory", "context (tokens)", "GiB",
                    [Series("model-a", [4096, 8192, 16384], [1.0, 1.5, 2.5]),
                     Series("model-b", [4096, 8192, 16384], [2.0, 3.0, 5.0]),
                     Series("measured", [8192], [1.6], style="points", notes=["run 1"])],
                    hlines=[(4.0, "RAM 4 GiB")]),
              Panel("share", "t", "share", [Series("used", [0, 1, 2], [0.2, 0.3, 0.4], style="area", color="#2b8a3e"),
                                            Series("free", [0, 1, 2], [0.5, 0.4, 0.3], style="area", color="#74c0fc")],
                    ylim=(0, 1))]
    draw(str(tmp_path / "c.svg"), panels, title="two panels")
    assert svg_series(tmp_path / "c.svg", 0) == {"series-0-0", "series-0-1", "series-0-2"}
    assert svg_series(tmp_path / "c.svg", 1) == {"series-1-0", "series-1-1"}
    assert svg_ids(tmp_path / "c.svg", "ref-") == ["ref-0-0"]
    texts = svg_texts(tmp_path / "c.svg")
    for label in ("model-a", "model-b", "RAM 4 GiB", "run 1", "two panels", "context (tokens)"):
        assert label in texts
    assert "#2b8a3e" in (tmp_path / "c.svg").read_text()  # a series' own colour
    draw(str(tmp_path / "c.png"), panels, size=(640, 800))
    assert png_size(tmp_path / "c.png") == (640, 800)
    draw(str(tmp_path / "d.PNG"), panels)
    assert png_size(tmp_path / "d.PNG") == SIZE
    draw(str(tmp_path / "c.pdf"), panels)
    assert (tmp_path / "c.pdf").read_bytes()[:5] == b"%PDF-"
    before = (tmp_path / "c.svg").read_bytes()
    draw(str(tmp_path / "c.svg"), panels, title="two panels")
    assert (tmp_path / "c.svg").read_bytes() == before  # no date or random ids: the same chart, the same bytes
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_grouped_bars(tmp_path):
    from llmkit.plot import Panel, Series, draw

    draw(str(tmp_path / "b.svg"), [Panel("bars", "x", "y", [Series("a", ["p", "q", "r"], [1, 2, 3], style="bar"),
                                                            Series("b", ["p", "q"], [2, 1], style="bar")])])
    assert len(svg_ids(tmp_path / "b.svg", "series-0-0-")) == 3 and len(svg_ids(tmp_path / "b.svg", "series-0-1-")) == 2
    assert {"p", "q", "r", "a", "b"} <= set(svg_texts(tmp_path / "b.svg"))


def test_unknown_series_style_is_refused_when_made():
    from llmkit.plot import Series

    with pytest.raises(ValueError) as e:
        Series("a", [1], [1.0], style="pie")
    assert str(e.value) == ("Series 'a' has style 'pie', which is not one of line, points, bar, area. "
                            "Pass one of those to Series(style=...).")


def test_check_path_refusals(tmp_path, monkeypatch):
    from llmkit.errors import MissingDependency, OptionError
    from llmkit.plot import check_path

    assert check_path(str(tmp_path / "x.svg")) == "svg"
    wanted = r"'\.jpg' is not a chart format; name a file ending in \.svg, \.png or \.pdf"
    with pytest.raises(OptionError, match=wanted):
        check_path(str(tmp_path / "x.jpg"))
    with pytest.raises(OptionError, match="no extension"):
        check_path(str(tmp_path / "chart"))
    with pytest.raises(OptionError, match="does not exist; create it first"):
        check_path(str(tmp_path / "no" / "x.png"))
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    with pytest.raises(MissingDependency, match=r"pip install 'llmkit\[plot\]'"):
        check_path(str(tmp_path / "x.svg"))


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, kernel_small):
    d = tmp_path_factory.mktemp("tok")
    corpus = d / "corpus.txt"
    corpus.write_text(kernel_small.read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    paths = []
    for algo in ("bpe", "unigram"):
        p = d / f"{algo}.json"
        r = run_cli(["tokenize", "train", "--algo", algo, "--vocab-size", "300", "-o", str(p), str(corpus)])
        assert r.exit_code == 0, r.stderr
        paths.append(p)
    return corpus, paths


def test_tokenize_stats_plot(tokenizers, tmp_path):
    corpus, (bpe, uni) = tokenizers
    svg, png = tmp_path / "tpw.svg", tmp_path / "tpw.png"
    r = run_cli(["tokenize", "stats", "-m", str(bpe), "-m", str(uni), str(corpus), "--json", "--plot", str(svg)])
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)  # the chart's data
    bars = sorted(svg_ids(svg, "series-0-0-"))
    assert bars == ["series-0-0-0", "series-0-0-1"] and svg_series(svg, 0) == {"series-0-0"}
    texts = svg_texts(svg)
    assert str(bpe) in texts and str(uni) in texts
    assert svg_notes(svg, "note-0-0-") == [f"{row['tokens_per_word']:.3f}" for row in rows]
    r = run_cli(["tokenize", "stats", "-m", str(bpe), str(corpus), "--plot", str(png)])
    assert r.exit_code == 0, r.stderr
    assert png_size(png) == (960, 540)


def test_plot_refused_before_the_work(tmp_path, monkeypatch):
    """A bad --plot is a usage error even when the work itself would fail (the tokenizer does not exist):
    the option is checked first."""
    missing = str(tmp_path / "no-such-tokenizer.json")
    r = run_cli(["tokenize", "stats", "-m", missing, "-", "--plot", str(tmp_path / "x.jpg")], input="some text\n")
    assert r.exit_code == 2
    assert "Invalid value for '--plot'" in r.stderr and "'.jpg' is not a chart format" in r.stderr
    assert "no-such-tokenizer" not in r.stderr.replace(str(tmp_path), "")
    r = run_cli(["tokenize", "stats", "-m", missing, "-", "--plot", str(tmp_path / "nowhere" / "x.svg")], input="x\n")
    assert r.exit_code == 2 and "nowhere' does not exist; create it first" in r.stderr
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    r = run_cli(["tokenize", "stats", "-m", missing, "-", "--plot", str(tmp_path / "x.svg")], input="x\n")
    assert r.exit_code == 1
    assert r.stderr.strip() == ("Error: this command needs the Python package 'matplotlib'. "
                                "Install it with: pip install 'llmkit[plot]'")


def test_rag_eval_plot(tmp_path, kernel_docs):
    from ragfixtures import kernel_paragraphs, write_jsonl

    docs = kernel_paragraphs(kernel_docs)[:30]
    write_jsonl(tmp_path / "docs.jsonl", docs)
    queries = [" ".join(p.split()[:8]) for p in docs[:10]]
    write_jsonl(tmp_path / "q.jsonl", queries, prefix="q")
    (tmp_path / "qrels.txt").write_text("".join(f"q{i} 0 d{i} 1\n" for i in range(10)))
    idx = tmp_path / "idx"
    r = run_cli(["rag", "index", str(idx), str(tmp_path / "docs.jsonl"), "--no-tune"])
    assert r.exit_code == 0, r.stderr
    svg = tmp_path / "eval.svg"
    judged = ["--queries", str(tmp_path / "q.jsonl"), "--qrels", str(tmp_path / "qrels.txt")]
    r = run_cli(["rag", "eval", str(idx), *judged, "--config", "bm25", "--config", "dense", "--config", "hybrid",
                 "--recall-k", "20", "--jsonl", "--plot", str(svg)])
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    for row in rows:  # the curve behind the chart, in the JSON: k = 1, 2, 5, 10, 20, ending at --recall-k
        assert list(row["recall_curve"]) == ["1", "2", "5", "10", "20"]
        assert row["recall_curve"]["20"] == row["recall@20"]
        values = list(row["recall_curve"].values())
        assert values == sorted(values) and 0 < values[-1] <= 1
    assert len(svg_ids(svg, "series-0-0-")) == 3  # one nDCG@10 bar per configuration
    assert svg_series(svg, 1) == {"series-1-0", "series-1-1", "series-1-2"}  # one recall curve per configuration
    texts = svg_texts(svg)
    assert {"bm25", "dense", "hybrid", "nDCG@10", "Recall@k"} <= set(texts)
    assert svg_notes(svg, "note-0-0-") == [f"{row['ndcg@10']:.3f}" for row in rows]
    png = tmp_path / "eval.png"
    r = run_cli(["rag", "eval", str(idx), *judged, "--config", "bm25", "--plot", str(png)])
    assert r.exit_code == 0, r.stderr
    assert png_size(png) == (960, 540) and "nDCG@10" in r.stdout
