"""Known answers for the pure parts of llmkit rag: chunk boundaries and overlap, RRF, filters,
required-term detection, duplicates, documents, metrics, compression."""

import numpy as np
import pytest

from llmkit.errors import BadInput
from llmkit.rag.chunk import dedupe
from llmkit.rag.chunk import spans as chunking
from llmkit.rag.index.bm25 import tokenize
from llmkit.rag.read.documents import load_file
from llmkit.rag.evaluate.metrics import ndcg, recall, reciprocal_rank
from llmkit.rag.retrieve.fusion import convex, normalize, rrf
from llmkit.rag.retrieve.filters import detect_required, parse_filter
from llmkit.rag.retrieve.hits import dedupe_to_groups

TEXT = ("The kernel manages memory in pages. Each page is four kilobytes on x86. Pages are tracked by "
        "struct page.\n\nThe scheduler picks the next task. It uses a red-black tree. Fairness matters!\n\n"
        "内存管理是内核的核心。页面大小通常为四千字节。调度器选择下一个任务！")


def test_recursive_chunks_end_at_sentence_boundaries_and_fit():
    spans = chunking.recursive_spans(TEXT, 120, 0)
    assert all(len(s.text) <= 120 for s in spans)
    for s in spans[:-1]:
        assert s.text[-1] in ".!?。！？；", s.text  # never mid-sentence when a sentence end is available
    assert "".join(s.text for s in spans).replace(" ", "").replace("\n", "") == TEXT.replace(" ", "").replace("\n", "")


def test_recursive_prefers_paragraph_break():
    text = "A" * 50 + ". " + "B" * 30 + ".\n\n" + "C" * 60 + "."
    spans = chunking.recursive_spans(text, 100, 0)
    assert spans[0].text.endswith("B" * 30 + ".")  # the paragraph break (level 4) beats the sentence end


def test_overlap_is_whole_sentences_within_limit():
    spans = chunking.recursive_spans(TEXT, 120, 60)
    for a, b in zip(spans, spans[1:]):
        shared = a.end - b.start
        assert 0 < shared <= 60, (a, b)  # always some overlap, never more than asked
        assert TEXT[b.start:a.end] == a.text[len(a.text) - shared:]
    second = spans[1]
    # the overlap begins at a sentence start when a whole sentence fits
    assert TEXT[second.start - 2:second.start] in (". ", "! ", "? ") or TEXT[second.start - 1] in "。！？"


def test_overlap_falls_back_to_words_when_no_sentence_fits():
    text = " ".join(f"word{i}" for i in range(200))  # one long sentence
    spans = chunking.recursive_spans(text, 100, 30)
    for a, b in zip(spans, spans[1:]):
        shared = text[b.start:a.end]
        assert 0 < len(shared) <= 30 and shared.split()[0].startswith("word") and text[b.start - 1] == " "


def test_window_overlap_exact():
    text = " ".join(str(i) for i in range(23))
    spans = chunking.window_spans(text, 10, 3)
    words = [s.text.split() for s in spans]
    assert [w[0] for w in words] == ["0", "7", "14"] and words[-1][-1] == "22"
    for a, b in zip(words, words[1:]):
        assert a[-3:] == b[:3]
    cjk = chunking.window_spans("内存管理是内核的核心", 4, 2)
    assert [s.text for s in cjk] == ["内存管理", "管理是内", "是内核的", "核的核心"]


def test_bad_chunk_parameters():
    with pytest.raises(BadInput):
        chunking.recursive_spans(TEXT, 100, 80)
    with pytest.raises(BadInput):
        chunking.window_spans(TEXT, 5, 5)


def _l(w, ids, scores=None, name="x"):
    return (name, w, ids, scores)


def test_rrf_known_answer():
    # w/(k+rank): doc 3 = 1/62 + 1/61, doc 7 = 1/61, doc 9 = 1/62 (missing from list 1: no term)
    fused = dict(rrf([_l(1.0, [7, 3]), _l(1.0, [3, 9])], k=60))
    assert fused[3] == pytest.approx(1 / 62 + 1 / 61)
    assert fused[7] == pytest.approx(1 / 61) and fused[9] == pytest.approx(1 / 62)
    weighted = rrf([_l(0.3, [1, 2]), _l(0.7, [2, 1])], k=0)
    assert weighted[0] == (2, pytest.approx(0.3 / 2 + 0.7 / 1))
    assert [d for d, _ in rrf([_l(1.0, [5]), _l(1.0, [4])], k=60)] == [4, 5]  # exact tie: same best rank, lower id


def test_score_normalisations_known_answers():
    s = np.array([4.0, 2.0, 0.0])
    assert normalize(s, "minmax").tolist() == [1.0, 0.5, 0.0]
    assert normalize(s, "z").tolist() == pytest.approx([1.2247449, 0.0, -1.2247449])
    # dbsf: mean 2, std 1.633; (s - (2 - 4.899)) / 9.798
    assert normalize(s, "dbsf").tolist() == pytest.approx([0.7041241, 0.5, 0.2958759])
    assert normalize(np.array([0.5, 0.0]), "tmm", "dense").tolist() == pytest.approx([1.0, 2 / 3])
    assert normalize(np.array([6.0, 3.0]), "tmm", "bm25").tolist() == [1.0, 0.5]
    assert normalize(np.array([1.0, 1.0]), "minmax").tolist() == [1.0, 1.0]


def test_convex_combination_known_answer():
    # bm25 minmax: d1 1, d2 0 ; dense minmax: d2 1, d3 0.5, d4 0 -> d4 and d3 are missing from bm25 (0 there)
    lists = [_l(0.3, [1, 2], [10.0, 4.0], "bm25"), _l(0.7, [2, 3, 4], [0.9, 0.6, 0.3], "dense")]
    fused = dict(convex(lists, "minmax"))
    assert fused[1] == pytest.approx(0.3) and fused[2] == pytest.approx(0.7)
    assert fused[3] == pytest.approx(0.35) and fused[4] == pytest.approx(0.0)
    # z-score: a document missing from a list gets that list's lowest z, not 0
    z = dict(convex(lists, "z"))
    zb, zd = normalize(np.array([10.0, 4.0]), "z"), normalize(np.array([0.9, 0.6, 0.3]), "z")
    assert z[3] == pytest.approx(0.3 * zb.min() + 0.7 * zd[1])
    assert z[1] == pytest.approx(0.3 * zb[0] + 0.7 * zd.min())
    assert [d for d, _ in convex(lists, "minmax")] == [2, 3, 1, 4]


def test_parents_not_double_counted():
    group = np.array([0, 0, 1, 1])  # rows 0,1 share parent 0
    assert dedupe_to_groups([0, 1, 2, 3], group) == [0, 1]
    assert dedupe_to_groups([0, 1, 2], group, [0.9, 0.8, 0.5]) == ([0, 1], [0.9, 0.5])
    fused = dict(rrf([_l(1.0, dedupe_to_groups([0, 1, 2], group)), _l(1.0, dedupe_to_groups([2, 0, 1], group))], 60))
    assert fused[0] == pytest.approx(1 / 61 + 1 / 62)  # not 1/61 + 1/62 + 1/63 + ...


def test_filters_and_required_terms():
    assert parse_filter("date>=2025-01-01") == ("date", ">=", "2025-01-01")
    assert parse_filter("source=notes/*") == ("source", "=", "notes/*")
    with pytest.raises(BadInput):
        parse_filter("no operator here")
    assert detect_required('errors in "page cache" from kmalloc() under CONFIG_SLUB') == ["page cache", "kmalloc", "CONFIG_SLUB"]
    assert detect_required("who calls kv_cache_seq_rm()") == ["kv_cache_seq_rm"]  # calls have arguments


def test_near_duplicates():
    base = "the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat all day long"
    sigs = np.stack([dedupe.minhash(tokenize(t)) for t in
                     [base, "completely different text about kernel memory pages and schedulers here", base + " ok"]])
    assert dedupe.near_duplicates(sigs, 0.8).tolist() == [-1, -1, 0]
    assert dedupe.text_key("Hello  World") == dedupe.text_key("hello world")


def test_documents_markdown_html_jsonl(tmp_path):
    md = b"---\ntitle: Guide\ndate: 2025-03-01\n---\n# Intro\nHello there.\n\n```\n# not a heading\n```\n## Usage\nRun it."
    (doc,), _ = load_file(str(tmp_path / "g.md"), md)
    assert doc.meta["title"] == "Guide" and doc.meta["date"] == "2025-03-01"
    assert [s.heading for s in doc.sections if s.text.strip()] == ["Intro", "Usage"]
    html = b"<html><head><title>T</title><style>x{}</style></head><body><h1>Head</h1><p>Para one.</p><script>bad()</script></body></html>"
    (doc,), _ = load_file(str(tmp_path / "p.html"), html)
    assert doc.meta["title"] == "T" and doc.sections[-1].heading == "Head" and "bad" not in doc.sections[-1].text
    docs, skipped = load_file(str(tmp_path / "d.jsonl"), b'{"id": 7, "text": "x y", "lang": "en"}\nnot json\n{"id": 8}\n')
    assert len(docs) == 1 and docs[0].meta["lang"] == "en" and docs[0].meta["doc_id"] == "7"
    assert len(skipped) == 2
    assert load_file(str(tmp_path / "b.txt"), b"\x00\x01\x02binary")[1][0].reason == "binary"
    assert load_file(str(tmp_path / "e.txt"), b"  \n")[1][0].reason == "empty"


def test_metrics_known_answers():
    judged = {"a": 2, "b": 1}
    assert ndcg(["a", "b"], judged) == pytest.approx(1.0)
    assert ndcg(["x", "a"], judged) == pytest.approx((2 / np.log2(3)) / (2 + 1 / np.log2(3)))
    assert recall(["a", "x"], judged, 1) == 0.5 and reciprocal_rank(["x", "y", "b"], judged) == pytest.approx(1 / 3)


def test_compress_by_sentence_relevance():
    from llmkit.rag.answer.compress import compress

    texts = ["Cats sleep a lot. The kernel allocates memory pages. Dogs bark.", "Memory pages are four kilobytes."]
    c = compress("kernel memory pages", texts, 12, lambda t: len(t.split()))
    assert c.tokens_after <= 12 and c.ratio > 1
    assert "memory pages" in c.texts[0] and "Cats" not in c.texts[0]


def tiny_pdf(pages: list[str]) -> bytes:
    """A minimal valid PDF with one line of Helvetica text per page (xref offsets computed)."""
    n = len(pages)
    objs = ["<< /Type /Catalog /Pages 2 0 R >>",
            "<< /Type /Pages /Kids [" + " ".join(f"{4 + 2 * i} 0 R" for i in range(n)) + f"] /Count {n} >>",
            "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for i, text in enumerate(pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET"
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                    f"/Contents {5 + 2 * i} 0 R >>")
        objs.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    out, offsets = b"%PDF-1.4\n", []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n{o}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{off:010d} 00000 n \n" for off in offsets).encode()
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def test_pdf_pages_become_sections_with_page_numbers(tmp_path):
    pytest.importorskip("pypdf")
    (doc,), skipped = load_file(str(tmp_path / "r.pdf"), tiny_pdf(["First page about pages.", "Second page on tasks."]))
    assert not skipped and [(s.page, s.text.strip()) for s in doc.sections] == [
        (1, "First page about pages."), (2, "Second page on tasks.")]
    docs, skipped = load_file(str(tmp_path / "bad.pdf"), b"%PDF-1.4 truncated garbage")
    assert not docs and skipped[0].reason.startswith(("unreadable PDF", "PDF without"))


def test_library_option_errors_name_no_flags_and_the_cli_spells_them():
    from llmkit.commands.rag.options import FLAGS
    from llmkit.errors import OptionError
    from llmkit.rag.retrieve.options import parse_weights

    with pytest.raises(OptionError) as e:
        parse_weights("bm25")
    assert "--" not in str(e.value) and "write weights bm25=0.3" in str(e.value)
    assert "write --weights bm25=0.3,dense=0.7" in e.value.spelled(FLAGS)
