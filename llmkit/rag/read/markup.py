"""Sections of marked-up text: Markdown (ATX and setext headings outside fenced code, `---` front
matter) and HTML (visible text, split at h1-h6)."""

from __future__ import annotations

import html.parser
import re
import time
from bisect import bisect_right

from llmkit.bounded import LimitExceeded, limit

from llmkit.rag.read.types import Section


def front_matter(text: str) -> tuple[dict, str]:
    """YAML-style `---` front matter with simple `key: value` lines (no YAML library needed).

    >>> front_matter("---\\ntitle: Hi\\ndate: 2025-01-02\\n---\\nBody")
    ({'title': 'Hi', 'date': '2025-01-02'}, 'Body')
    """
    m = re.match(r"---[ \t]*\n(.*?)\n---[ \t]*\n?", text, re.S)
    if not m:
        return {}, text
    meta = {}
    for line in m.group(1).splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() and not k.startswith((" ", "\t", "-")):
            meta[k.strip().lower()] = v.strip().strip("'\"")
    return meta, text[m.end():]


_FENCE_LINE = re.compile(r"^(```|~~~)(.*)$", re.M)


def fenced_blocks(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of fenced code blocks: an opening ``` or ~~~ line up to the next line that
    is the same marker alone; an opener never closed is no block. One pass (a regex that searched on
    from every unclosed opener took quadratic time on a file of them).

    >>> fenced_blocks("a\\n```py\\n# x\\n```\\nb")
    [(2, 15)]
    """
    lines = [(m.start(), m.end(), m.group(1), not m.group(2).strip(" \t")) for m in _FENCE_LINE.finditer(text)]
    closers = {mark: [i for i, (_, _, mk, alone) in enumerate(lines) if mk == mark and alone] for mark in ("```", "~~~")}
    out, i = [], 0
    while i < len(lines):
        start, _, mark, _ = lines[i]
        cl = closers[mark]
        j = bisect_right(cl, i)
        if j == len(cl):
            i += 1  # never closed: the next fence line may open a block
            continue
        out.append((start, lines[cl[j]][1]))
        i = cl[j] + 1
    return out


_MD_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$|^(.+)\n(=+|-+)[ \t]*$", re.M)


def markdown_sections(text: str) -> list[Section]:
    """Split Markdown at ATX (`# h`) and setext (underlined) headings, outside fenced code blocks."""
    fences = fenced_blocks(text)
    sections, start, heading = [], 0, ""
    starts = [a for a, _ in fences]
    for m in _MD_HEADING.finditer(text):
        k = bisect_right(starts, m.start()) - 1  # the last block opening at or before the heading
        if k >= 0 and m.start() < fences[k][1]:
            continue
        title = (m.group(2) or m.group(3) or "").strip()
        if m.group(3) is not None and (not title or title.startswith(("-", "*", "|")) or "  " in title[:2]):
            continue  # a '---' rule or list item, not a setext heading
        sections.append(Section(heading, text[start:m.start()]))
        heading, start = title, m.end()
    sections.append(Section(heading, text[start:]))
    return sections


class _HTMLText(html.parser.HTMLParser):
    """Visible text of an HTML page, split into sections at h1–h6."""

    SKIP = {"script", "style", "noscript", "template", "head", "svg", "nav", "footer"}
    BLOCK = {"p", "div", "br", "li", "tr", "section", "article", "pre", "blockquote", "table", "ul", "ol", "dd", "dt"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.sections: list[list] = [["", []]]
        self.title, self._in_title, self._skip, self._heading = "", False, 0, None

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self._skip += 1
        elif tag == "title":
            self._in_title = True
        elif re.fullmatch(r"h[1-6]", tag):
            self._heading = []
        elif tag in self.BLOCK:
            self.sections[-1][1].append("\n\n" if tag in ("p", "div", "section", "article", "pre") else "\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag == "title":
            self._in_title = False
        elif re.fullmatch(r"h[1-6]", tag) and self._heading is not None:
            self.sections.append([" ".join("".join(self._heading).split()), []])
            self._heading = None
        elif tag in self.BLOCK:
            self.sections[-1][1].append("\n")

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        elif self._skip:
            return
        elif self._heading is not None:
            self._heading.append(data)
        else:
            self.sections[-1][1].append(data)


_STRAY_LT = re.compile(r"<(?![A-Za-z/!?])")
_LT = "\ufdd0"


def html_sections(text: str, what: str = "the HTML") -> tuple[str, list[Section]]:
    """(page title, sections) of an HTML document; markup, scripts and styles dropped."""
    # html.parser handles a '<' that opens no tag one character at a time (~6 us each), and searches
    # to the end of the text again for every unclosed '<!' or '<![CDATA[' (quadratic): stand a
    # noncharacter in for the first (put back below), and end the text with a '>' (in an empty
    # comment) so each search stops there
    text = _STRAY_LT.sub(_LT, text.replace(_LT, "")) + "<!---->"
    deadline = time.monotonic() + limit("LLMKIT_MAX_PARSE_SECONDS")
    p = _HTMLText()
    for i in range(0, len(text), 1 << 20):
        if time.monotonic() > deadline:
            raise LimitExceeded(what, "LLMKIT_MAX_PARSE_SECONDS", f"stopped at {i >> 20} MB")
        p.feed(text[i:i + (1 << 20)])
    p.close()
    sections = []
    for heading, parts in p.sections:
        body = re.sub(r"[ \t\r\f\v]+", " ", "".join(parts).replace(_LT, "<"))
        heading = heading.replace(_LT, "<")
        body = re.sub(r" *\n *", "\n", body)
        body = re.sub(r"\n{3,}", "\n\n", body).strip()
        sections.append(Section(heading, body))
    return " ".join(p.title.replace(_LT, "<").split()), sections
