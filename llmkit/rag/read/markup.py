"""Sections of marked-up text: Markdown (ATX and setext headings outside fenced code, `---` front
matter) and HTML (visible text, split at h1-h6)."""

from __future__ import annotations

import html.parser
import re

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


_MD_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$|^(.+)\n(=+|-+)[ \t]*$", re.M)


def markdown_sections(text: str) -> list[Section]:
    """Split Markdown at ATX (`# h`) and setext (underlined) headings, outside fenced code blocks."""
    fences = [(m.start(), m.end()) for m in re.finditer(r"^(```|~~~).*?^\1[ \t]*$", text, re.M | re.S)]
    sections, start, heading = [], 0, ""
    for m in _MD_HEADING.finditer(text):
        if any(a <= m.start() < b for a, b in fences):
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


def html_sections(text: str) -> tuple[str, list[Section]]:
    """(page title, sections) of an HTML document; markup, scripts and styles dropped."""
    p = _HTMLText()
    p.feed(text)
    p.close()
    sections = []
    for heading, parts in p.sections:
        body = re.sub(r"[ \t\r\f\v]+", " ", "".join(parts))
        body = re.sub(r" *\n *", "\n", body)
        body = re.sub(r"\n{3,}", "\n\n", body).strip()
        sections.append(Section(heading, body))
    return " ".join(p.title.split()), sections
