"""Hostile files for every reader, built from code: each case is (name, bytes). Small cases are
also kept on disk in tests/fixtures/fuzz/ (`python tests/fuzz/crafted.py` rewrites them); the big
ones (zip bombs, 100,000-deep nesting, files near the size limits) are generated at test time.

Every generator takes `big` (False: only the cases small enough for the fixture corpus)."""

from __future__ import annotations

import io
import json
import struct
import sys
import zlib
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "fuzz"
SMALL = 4096  # bytes: cases up to this size live in the fixture corpus


# ---- seeds: one small valid file per format ---------------------------------------------------

NOTEBOOK = {"cells": [{"cell_type": "markdown", "source": ["# Title\n", "Some prose about pages."]},
                      {"cell_type": "code", "source": "def f(x):\n    return x + 1\n", "outputs": []}],
            "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
MARKDOWN = "---\ntitle: Guide\n---\n# Pages\nThe kernel manages memory.\n\n```py\n# not a heading\n```\n## Slab\nSmall objects.\n"
HTML = ("<html><head><title>FS</title></head><body><h1>Mount</h1><p>Use mount &amp; umount.</p>"
        "<script>var x = '<p>';</script><!-- c --><h2>Opts</h2><p>noatime</p></body></html>")
CSV = "name,population,area\nOslo,709000,454\nBergen,286000,465\n\"Trond, heim\",212000,342\n"
PY = "import os\n\n\nclass Parser:\n    \"\"\"Doc.\"\"\"\n\n    def parse(self, s):\n        return s.split()\n\n\ndef main():\n    print(Parser().parse('a b'))\n"
JSONL = '{"id": 1, "text": "first record", "lang": "en"}\n{"id": 2, "text": "second record"}\n'
TOKENIZER = {"version": "1.0", "added_tokens": [{"id": 6, "content": "<s>", "special": True}],
             "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
             "post_processor": None,
             "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4, "Ġ": 5},
                       "merges": ["a b", "ab c"]}}


def zip_bytes(members: list[tuple[str, bytes]]) -> bytes:
    """A zip of deflated members (the order given; mimetype first for an EPUB, stored)."""
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members:
            z.writestr(name, data, compress_type=zipfile.ZIP_STORED if name == "mimetype" else zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def raw_zip(members: list[tuple[str, bytes, int, int]]) -> bytes:
    """A zip written by hand: (name, raw deflate data, crc32, declared uncompressed size) per member,
    so declared sizes can lie and members can be bombs built without compressing gigabytes."""
    out, central = bytearray(), bytearray()
    for name, data, crc, size in members:
        n = name.encode()
        off = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc, len(data), min(size, 0xFFFFFFFF), len(n), 0)
        out += n + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc, len(data),
                               min(size, 0xFFFFFFFF), len(n), 0, 0, 0, 0, 0, off) + n
    cd = len(out)
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), cd, 0)
    return bytes(out)


def deflate(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


_BOMB: dict = {}


def zero_bomb(mib: int) -> tuple[bytes, int, int]:
    """(raw deflate data, crc32, size) of `mib` MiB of zeros in ~1 kB per MiB: each full-flushed MiB
    of zeros deflates to the same bytes, so the stream is one block repeated (the crc, computed once
    per size, is the slow part: ~1 s per GiB)."""
    if mib not in _BOMB:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        zeros = bytes(1 << 20)
        block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
        crc = 0
        for _ in range(mib):
            crc = zlib.crc32(zeros, crc)
        _BOMB[mib] = (block * mib + c.flush(), crc, mib << 20)
    return _BOMB[mib]


def docx_seed() -> bytes:
    import docx

    d = docx.Document()
    d.core_properties.title = "Report"
    d.add_heading("Findings", 1)
    d.add_paragraph("The zqdocx cache grows.")
    t = d.add_table(rows=1, cols=2)
    t.rows[0].cells[0].text, t.rows[0].cells[1].text = "k", "v"
    buf = io.BytesIO()
    d.save(buf)
    return buf.getvalue()


def epub_seed() -> bytes:
    container = ('<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
                 '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
                 '</rootfiles></container>')
    opf = ('<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">'
           '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier id="id">x</dc:identifier>'
           '<dc:title>Book</dc:title><dc:language>en</dc:language></metadata>'
           '<manifest><item id="c1" href="c1.xhtml" media-type="application/xhtml+xml"/></manifest>'
           '<spine><itemref idref="c1"/></spine></package>')
    ch = '<html xmlns="http://www.w3.org/1999/xhtml"><body><h1>One</h1><p>The zqepub whale swims.</p></body></html>'
    return zip_bytes([("mimetype", b"application/epub+zip"), ("META-INF/container.xml", container.encode()),
                      ("OEBPS/content.opf", opf.encode()), ("OEBPS/c1.xhtml", ch.encode())])


def pdf(objs: list[str | bytes], root: int = 1, extra_trailer: str = "") -> bytes:
    """A PDF of the given object bodies (numbered from 1), xref offsets computed."""
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + (o if isinstance(o, bytes) else o.encode()) + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{off:010d} 00000 n \n" for off in offsets).encode()
    out += f"trailer\n<< /Size {len(objs) + 1} /Root {root} 0 R {extra_trailer}>>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def pdf_page(content: str | bytes, contents_dict: str = "") -> list:
    stream = content if isinstance(content, bytes) else content.encode()
    return ["<< /Type /Catalog /Pages 2 0 R >>", "<< /Type /Pages /Kids [4 0 R] /Count 1 >>",
            "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents 5 0 R >>",
            f"<< /Length {len(stream)} {contents_dict}>>\nstream\n".encode() + stream + b"\nendstream"]


def pdf_seed() -> bytes:
    return pdf(pdf_page("BT /F1 12 Tf 72 720 Td (The zqpdf page.) Tj ET"))


def cuts(data: bytes, marks: bytes, most: int = 60) -> list[tuple[str, bytes]]:
    """Truncations at structural boundaries: just before and after each byte in `marks`."""
    pos = sorted({i for i, b in enumerate(data) if b in marks} | {i + 1 for i, b in enumerate(data) if b in marks})
    step = max(1, len(pos) // most)
    return [(f"cut{p}", data[:p]) for p in pos[::step] if 0 < p < len(data)]


def common(seed: bytes) -> list[tuple[str, bytes]]:
    """Cases every text format gets: NUL bytes, invalid UTF-8, empty, a BOM, random bytes."""
    import random

    rnd = random.Random(7)
    return [("nul", seed[:len(seed) // 2] + b"\x00" + seed[len(seed) // 2:]), ("badutf8", seed + b"\xff\xfe\xc3("),
            ("empty", b""), ("spaces", b" \n\t\n"), ("bom", b"\xef\xbb\xbf" + seed),
            ("random", bytes(rnd.randrange(256) for _ in range(3000))),
            ("utf16", b"\xff\xfe" + seed.decode("utf-8", "replace").encode("utf-16-le"))]


# ---- per format -------------------------------------------------------------------------------

def ipynb(big: bool) -> list[tuple[str, bytes]]:
    seed = json.dumps(NOTEBOOK).encode()
    out = [("seed", seed), ("cells_not_list", b'{"cells": 3}'), ("cells_ints", b'{"cells": [1, 2, null]}'),
           ("source_int", b'{"cells": [{"cell_type": "markdown", "source": 5}]}'),
           ("source_list_ints", b'{"cells": [{"cell_type": "code", "source": [1, 2]}]}'),
           ("metadata_list", b'{"cells": [], "metadata": [1]}'), ("array_top", b"[1, 2]"),
           ("deep300", b"[" * 300 + b"]" * 300), ("latin1", json.dumps(NOTEBOOK).replace("pages", "p\u00e2ges").encode("latin-1"))]
    out += cuts(seed, b'{}[],:"') + common(seed)
    if big:
        out += [("deep100k", b"[" * 100000 + b"]" * 100000),
                ("deep_in_cell", b'{"cells": [{"source": ' + b"[" * 100000 + b"]" * 100000 + b"}]}"),
                ("many_cells", json.dumps({"cells": [{"cell_type": "markdown", "source": "x"}] * 50000}).encode()),
                ("huge_source", json.dumps({"cells": [{"cell_type": "code", "source": "x = 1\n" * 2_000_000}]}).encode())]
    return out


def _docx_with(document_xml: bytes) -> bytes:
    import zipfile

    seed = docx_seed()
    with zipfile.ZipFile(io.BytesIO(seed)) as z:
        members = [(i.filename, z.read(i)) for i in z.infolist()]
    return zip_bytes([(n, document_xml if n == "word/document.xml" else d) for n, d in members])


def docx(big: bool) -> list[tuple[str, bytes]]:
    seed = docx_seed()
    w = b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>'
    laughs = (b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa">' +
              b"".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">'.encode() for i in range(9)) +
              b"]>" + w + b"<w:p><w:r><w:t>&j;</w:t></w:r></w:p></w:body></w:document>")
    out = [("seed", seed), ("not_zip", b"PK\x03\x04 not really a zip"), ("text", b"plain text named .docx"),
           ("no_document", zip_bytes([("[Content_Types].xml", b"<Types/>")])),
           ("bad_xml", _docx_with(w + b"<w:p><unclosed>")), ("laughs", _docx_with(laughs)),
           ("deep_xml", _docx_with(w + b"<w:p>" * 5000 + b"</w:p>" * 5000 + b"</w:body></w:document>"))]
    out += [(f"zipcut{i}", seed[:p]) for i, p in enumerate(sorted({seed.find(b"PK\x03\x04", 1), seed.rfind(b"PK\x01\x02"),
                                                                  seed.rfind(b"PK\x05\x06"), len(seed) - 5, 30}))]
    data, crc, size = deflate(b"<w:document/>"), zlib.crc32(b"<w:document/>"), 13
    out += [("size_lie_small", raw_zip([("word/document.xml", data, crc, 2)])),
            ("size_lie_huge", raw_zip([("word/document.xml", data, crc, 0xFFFFFFF0)])),
            ("crc_lie", raw_zip([("word/document.xml", data, crc ^ 1, size)]))]
    if big:
        d, c, n = zero_bomb(2048)  # 2 MB that inflate to 2 GiB: the docx
        out += [("bomb2g", raw_zip([("[Content_Types].xml", deflate(b"<Types/>"), zlib.crc32(b"<Types/>"), 8),
                                    ("word/document.xml", d, c, n)])),
                ("bomb_declared_small", raw_zip([("word/document.xml", d, c, 100)])),
                ("entries30k", zip_bytes([(f"x/{i}.xml", b"") for i in range(30000)]))]
    return out


def epub(big: bool) -> list[tuple[str, bytes]]:
    import zipfile

    seed = epub_seed()
    with zipfile.ZipFile(io.BytesIO(seed)) as z:
        members = [(i.filename, z.read(i)) for i in z.infolist()]

    def swap(name, data):
        return zip_bytes([(n, data if n == name else d) for n, d in members])

    laughs = (b'<?xml version="1.0"?><!DOCTYPE html [<!ENTITY a "aaaaaaaaaa">' +
              b"".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">'.encode() for i in range(9)) +
              b']><html xmlns="http://www.w3.org/1999/xhtml"><body><p>&j;</p></body></html>')
    out = [("seed", seed), ("not_zip", b"garbage"), ("no_container", zip_bytes([("mimetype", b"application/epub+zip")])),
           ("container_points_nowhere", swap("META-INF/container.xml", b'<container><rootfiles><rootfile full-path="nope.opf"/></rootfiles></container>')),
           ("opf_garbage", swap("OEBPS/content.opf", b"<<<")), ("chapter_laughs", swap("OEBPS/c1.xhtml", laughs)),
           ("chapter_deep", swap("OEBPS/c1.xhtml", b"<div>" * 100000)),
           ("opf_deep", swap("OEBPS/content.opf", b"<package>" + b"<a>" * 100000)),
           ("chapter_badutf8", swap("OEBPS/c1.xhtml", b"<html><body>\xff\xfe</body></html>"))]
    out += [(f"zipcut{i}", seed[:p]) for i, p in enumerate(sorted({seed.find(b"PK\x03\x04", 1), seed.rfind(b"PK\x01\x02"),
                                                                  seed.rfind(b"PK\x05\x06"), len(seed) - 5}))]
    if big:
        d, c, n = zero_bomb(2048)
        out += [("bomb2g", raw_zip([("mimetype", deflate(b"application/epub+zip"), zlib.crc32(b"application/epub+zip"), 20),
                                    ("OEBPS/c1.xhtml", d, c, n)])),
                ("entries30k", zip_bytes([("mimetype", b"application/epub+zip")] + [(f"x/{i}", b"") for i in range(30000)]))]
    return out


def pdf_cases(big: bool) -> list[tuple[str, bytes]]:
    seed = pdf_seed()
    objs = pdf_page("BT /F1 12 Tf 72 720 Td (x) Tj ET")
    loop = list(objs)
    loop[1] = "<< /Type /Pages /Kids [2 0 R 4 0 R] /Count 2 >>"  # the page tree contains itself
    out = [("seed", seed), ("header_only", b"%PDF-1.4\n"), ("garbage", b"%PDF-1.4 truncated garbage"),
           ("count_huge", pdf([objs[0], "<< /Type /Pages /Kids [4 0 R] /Count 999999999999 >>", *objs[2:]])),
           ("tree_loop", pdf(loop)), ("root_missing", pdf(objs, root=42)),
           ("deep_array", pdf([objs[0], objs[1], "[" * 5000 + "]" * 5000, *objs[3:]])),
           ("xref_lies", seed.replace(b"xref\n0 6", b"xref\n0 999999")),
           ("startxref_lies", seed.rsplit(b"startxref", 1)[0] + b"startxref\n99999999\n%%EOF\n"),
           ("length_lies", pdf(pdf_page("BT (x) Tj ET", "/Length 99999999 ")[:4] + [b"<< /Length 99999999 >>\nstream\nBT ET\nendstream"])),
           ("bad_filter", pdf(pdf_page(b"\x00\x01garbage", "/Filter /FlateDecode "))),
           ("nul_stream", pdf(pdf_page(b"BT (\x00\x00) Tj ET")))]
    out += cuts(seed, b"\n", most=40)
    if big:
        d, _, _ = zero_bomb(2048)
        out += [("flate_bomb2g", pdf(pdf_page(b"\x78\x9c" + d, "/Filter /FlateDecode "))),
                ("deep100k", pdf([objs[0], objs[1], "[" * 100000 + "]" * 100000, *objs[3:]])),
                ("many_pages", pdf(["<< /Type /Catalog /Pages 2 0 R >>",
                                    "<< /Type /Pages /Kids [" + "3 0 R " * 100000 + "] /Count 100000 >>",
                                    "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 10 10] >>"]))]
    return out


def markdown(big: bool) -> list[tuple[str, bytes]]:
    seed = MARKDOWN.encode()
    out = [("seed", seed), ("cp1252", "# Café\n\n“Naïve” résumé — 5 €\n".encode("cp1252")),
           ("latin1", "# Café\n\nUn texte naïve, résumé.\n".encode("latin-1")),
           ("unclosed_front", b"---\ntitle: x\n# no end\n"), ("only_fences", b"```\n" * 101),
           ("control_chars", bytes(range(1, 32)) * 50)] + common(seed)
    if big:
        out += [("fences200k", b"```x\n" * 200000), ("headings50k", b"# h\ntext\n" * 50000),
                ("one_line30m", b"a" * (30 << 20)), ("setext", b"x\n===\n" * 100000),
                ("over_cap", b"# big\n" + b"word " * (7 << 20))]
    return out


def html(big: bool) -> list[tuple[str, bytes]]:
    seed = HTML.encode()
    out = [("seed", seed), ("unclosed_comment", b"<p>a<!-- never closed"), ("unclosed_script", b"<script>var a = 1;"),
           ("entities", b"<p>&#99999999999; &#x110000; &bogus; &#0;</p>"), ("unclosed_tag", b"<div class='x"),
           ("cp1252", "<p>Café “quotes”</p>".encode("cp1252"))] + cuts(seed, b"<>", most=30) + common(seed)
    if big:
        out += [("decl1m", b"<!" * 1_000_000), ("cdata500k", b"<![CDATA[" * 500_000), ("lt4m", b"<" * 4_000_000),
                ("div_deep100k", b"<div>" * 100_000), ("attr_unclosed", b"<a href='" + b"x" * 10_000_000)]
    return out


def csv_cases(big: bool) -> list[tuple[str, bytes]]:
    seed = CSV.encode()
    out = [("seed", seed), ("unbalanced_quote", b'a,b\n"never closed,1\n2,3\n'), ("ragged", b"a,b,c\n1\n1,2,3,4,5\n"),
           ("only_header", b"a,b\n"), ("field1m", b"a,b\n" + b"x" * (1 << 20) + b",1\n"),
           ("latin1", "ville,pays\nMontréal,Canada\n".encode("latin-1")), ("semicolon", b"a;b\n1;2\n")]
    out += cuts(seed, b',\n"', most=30) + common(seed)
    if big:
        out += [("columns1m", b",".join(b"c%d" % i for i in range(1_000_000)) + b"\n1\n"),
                ("rows500k", b"a,b\n" + b"1,2\n" * 500_000), ("quote_all", b'"' + b"x\n" * 2_000_000)]
    return out


def code(big: bool) -> list[tuple[str, bytes]]:
    seed = PY.encode()
    out = [("seed", seed), ("syntax_error", b"def f(:\n  return\n"), ("minified", b"x=1;" * 2000),
           ("deep_parens", b"x = " + b"(" * 5000 + b"1" + b")" * 5000 + b"\n"),
           ("nested_classes", "".join("    " * i + f"class C{i}:\n" for i in range(60)).encode() + b"    " * 60 + b"pass\n")]
    out += cuts(seed, b":()\n", most=30) + common(seed)
    if big:
        out += [("deep_parens100k", b"x = " + b"(" * 100000 + b"1" + b")" * 100000 + b"\n"),
                ("over_cap", b"x = 1\n" * 200000), ("many_defs", b"".join(b"def f%d():\n    pass\n" % i for i in range(40000)))]
    return out


def jsonl(big: bool) -> list[tuple[str, bytes]]:
    seed = JSONL.encode()
    out = [("seed", seed), ("wrong_types", b'{"id": 1, "text": 5}\n[1, 2]\n"str"\n{"id": {"a": 1}, "text": "ok"}\n'),
           ("deep_line", b'{"id": 1, "text": "ok"}\n' + b"[" * 300 + b"]" * 300 + b"\n"),
           ("bad_line_utf8", seed + b'{"id": 3, "text": "\xff"}\n'), ("truncated_line", seed + b'{"id": 3, "te')]
    out += cuts(seed, b'{}:,"\n', most=30) + common(seed)
    if big:
        out += [("deep100k", seed + b"[" * 100000 + b"]" * 100000 + b"\n"),
                ("lines100k", b'{"id": 1}\n' * 100_000), ("long_line", b'{"id": 9, "text": "' + b"x" * (3 << 20) + b'"}\n')]
    return out


def tokenizer(big: bool) -> list[tuple[str, bytes]]:
    def variant(**changes):
        t = json.loads(json.dumps(TOKENIZER))
        for path, v in changes.items():
            node = t
            keys = path.split("__")
            for k in keys[:-1]:
                node = node[k]
            node[keys[-1]] = v
        return json.dumps(t).encode()

    seed = json.dumps(TOKENIZER).encode()
    out = [("seed", seed), ("merge_three", variant(model__merges=["a b c"])), ("merge_one", variant(model__merges=["ab"])),
           ("merge_list_three", variant(model__merges=[["a", "b", "c"]])), ("merge_int", variant(model__merges=[5])),
           ("id_5e9", variant(model__vocab={"a": 5_000_000_000})), ("id_negative", variant(model__vocab={"a": -1})),
           ("id_float", variant(model__vocab={"a": 1.5})), ("id_string", variant(model__vocab={"a": "1"})),
           ("vocab_list", variant(model__vocab=[1, 2])), ("merges_dict", variant(model__merges={"a": 1})),
           ("added_id_huge", variant(added_tokens=[{"id": 1 << 40, "content": "x"}])),
           ("added_not_list", variant(added_tokens=7)), ("model_string", variant(model="BPE")),
           ("pre_unknown", variant(pre_tokenizer={"type": "Nope"})), ("pre_list", variant(pre_tokenizer=[1])),
           ("normalizer_int", variant(normalizer=3)), ("post_huge_id", variant(post_processor={"type": "BertProcessing", "cls": ["<s>", 1 << 40], "sep": ["</s>", 1]})),
           ("unigram_unk", json.dumps({"model": {"type": "Unigram", "vocab": [["a", -1.0]], "unk_id": 99}}).encode()),
           ("unigram_pairs", json.dumps({"model": {"type": "Unigram", "vocab": [["a"]]}}).encode()),
           ("normalizer_seq_deep", variant(normalizer=json.loads('{"type": "Sequence", "normalizers": [' * 60 + "]}" * 60))),
           ("deep300", b"[" * 300 + b"]" * 300), ("array_top", b"[]"), ("version_9", variant(version="9.9"))]
    out += cuts(seed, b'{}[],:"', most=40) + [c for c in common(seed) if c[0] != "empty"] + [("empty", b"")]
    if big:
        out += [("deep100k", b"[" * 100000 + b"]" * 100000), ("deep_in_model", b'{"model": ' + b"{\"a\": " * 100000 + b"1" + b"}" * 100001)]
    return out


FORMATS = {  # format -> (suffix, generator)
    "ipynb": (".ipynb", ipynb), "docx": (".docx", docx), "epub": (".epub", epub), "pdf": (".pdf", pdf_cases),
    "markdown": (".md", markdown), "html": (".html", html), "csv": (".csv", csv_cases), "code": (".py", code),
    "jsonl": (".jsonl", jsonl), "tokenizer": (".json", tokenizer),
}


def seed_of(fmt: str) -> bytes:
    """The valid file the mutation tests start from."""
    return dict(FORMATS[fmt][1](False))["seed"]


def write_fixtures() -> int:
    """Rewrite tests/fixtures/fuzz/FORMAT/NAME.SUFFIX for every small case; returns the count."""
    n = 0
    for fmt, (suffix, gen) in FORMATS.items():
        d = FIXTURES / fmt
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            old.unlink()
        for name, data in gen(False):
            if len(data) <= SMALL:
                (d / f"{name}{suffix}").write_bytes(data)
                n += 1
    return n


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    print(f"{write_fixtures()} crafted files written under {FIXTURES}")
