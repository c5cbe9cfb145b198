"""Source code as retrieval units: chunks at definitions (functions, classes, methods), parsed with
tree-sitter grammars from their own PyPI packages (tree-sitter-python, tree-sitter-go, ...).

A definition that fits in the chunk size and holds no other definitions is one chunk; a container
(a class, an impl block, a namespace) becomes one chunk per nested definition (qualified symbols:
`Parser.parse`), its header joined to the first member when both fit; a large definition without
nested ones is cut at line boundaries. A member, and every piece after the first of a cut
definition, starts with a comment line naming it (`# Parser.parse`). Statements between
definitions (imports, constants) are grouped into `module` chunks. Comments right above a
definition stay with it. Every chunk keeps whole lines and its 1-based line
range, so a hit can be opened at `path:line`.

A file that does not parse (a syntax error) or whose grammar is not installed is cut at line
boundaries instead, and the caller counts it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

# extension -> language
LANGUAGES = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".jsx": "javascript", ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust", ".java": "java", ".kt": "kotlin", ".kts": "kotlin", ".c": "c", ".h": "c",
    ".cpp": "cpp", ".cc": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp", ".cs": "c_sharp",
    ".rb": "ruby", ".php": "php", ".swift": "swift", ".scala": "scala", ".sc": "scala", ".sh": "bash",
    ".bash": "bash", ".zsh": "bash", ".sql": "sql", ".lua": "lua",
}
# language -> (module, function returning the grammar)
GRAMMARS = {
    "python": ("tree_sitter_python", "language"), "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"), "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"), "rust": ("tree_sitter_rust", "language"),
    "java": ("tree_sitter_java", "language"), "kotlin": ("tree_sitter_kotlin", "language"),
    "c": ("tree_sitter_c", "language"), "cpp": ("tree_sitter_cpp", "language"),
    "c_sharp": ("tree_sitter_c_sharp", "language"), "ruby": ("tree_sitter_ruby", "language"),
    "php": ("tree_sitter_php", "language_php"), "swift": ("tree_sitter_swift", "language"),
    "scala": ("tree_sitter_scala", "language"), "bash": ("tree_sitter_bash", "language"),
    "sql": ("tree_sitter_sql", "language"), "lua": ("tree_sitter_lua", "language"),
}
# node type -> kind, for every grammar (node type names rarely collide across grammars)
DEFINITIONS = {
    "function_definition": "function", "function_declaration": "function", "function_item": "function",
    "generator_function_declaration": "function", "method_definition": "method", "method_declaration": "method",
    "method": "method", "singleton_method": "method", "constructor_declaration": "constructor",
    "class_definition": "class", "class_declaration": "class", "abstract_class_declaration": "class",
    "class_specifier": "class", "class": "class", "object_declaration": "object", "object_definition": "object",
    "interface_declaration": "interface", "protocol_declaration": "interface", "trait_item": "trait",
    "trait_definition": "trait", "trait_declaration": "trait", "struct_item": "struct", "struct_specifier": "struct",
    "struct_declaration": "struct", "record_declaration": "record", "enum_item": "enum", "enum_declaration": "enum",
    "enum_specifier": "enum", "impl_item": "impl", "mod_item": "module", "module": "module",
    "namespace_definition": "namespace", "namespace_declaration": "namespace", "internal_module": "namespace",
    "type_declaration": "type", "type_alias_declaration": "type", "type_definition": "type",
    "macro_definition": "macro", "create_table": "table", "create_function": "function", "create_view": "view",
}
# wrappers whose inner declaration names the unit
WRAPPERS = {"decorated_definition", "export_statement", "template_declaration"}
_IDENT = {"identifier", "type_identifier", "field_identifier", "property_identifier", "constant", "name",
          "simple_identifier", "qualified_identifier", "scoped_identifier", "word", "object_reference"}
_TRIVIAL = re.compile(r"^[\s{}()\[\];,]*(end)?[\s;]*$")
_FUNC_VALUE = {"arrow_function", "function_expression", "function", "generator_function"}
_COMMENT = {"python": "#", "ruby": "#", "bash": "#", "sql": "--", "lua": "--"}  # else //

MAX_BYTES = 1 << 20  # larger source files are skipped (generated code, vendored bundles)


@dataclass
class CodeChunk:
    text: str
    line_start: int  # 1-based, inclusive
    line_end: int
    symbol: str
    kind: str


def language_of(path: str) -> str | None:
    return LANGUAGES.get(os.path.splitext(path)[1].lower())


_PARSERS: dict = {}


def parser_for(lang: str):
    """A tree-sitter parser for `lang`, or None when its grammar package is not installed."""
    if lang not in _PARSERS:
        try:
            import importlib

            from tree_sitter import Language, Parser

            mod, fn = GRAMMARS[lang]
            _PARSERS[lang] = Parser(Language(getattr(importlib.import_module(mod), fn)()))
        except (ImportError, AttributeError, KeyError, ValueError, TypeError):
            _PARSERS[lang] = None
    return _PARSERS[lang]


def minified(text: str) -> bool:
    """Minified or generated code: very long lines on average (a bundle, a lock file in one line)."""
    lines = text.count("\n") + 1
    return len(text) / lines > 300 and max(len(ln) for ln in text.split("\n")) > 2000


def chunk_code(text: str, lang: str, size: int, measure: Callable[[str], int] = len) -> tuple[list[CodeChunk], str]:
    """(chunks, how): how is 'parsed', 'syntax error' or 'no grammar' (the last two cut at lines).
    `size` is in the unit `measure` counts: characters (len), or an embedding model's tokens."""
    lines = text.split("\n")
    parser = parser_for(lang)
    if parser is None:
        return split_lines(lines, 0, len(lines) - 1, size, "", "lines", measure), "no grammar"
    tree = parser.parse(text.encode("utf-8"))
    if tree.root_node.has_error:
        return split_lines(lines, 0, len(lines) - 1, size, "", "lines", measure), "syntax error"
    out: list[CodeChunk] = []
    _units(tree.root_node.named_children, lines, size, "", out, measure=measure)
    return with_context([c for c in out if c.text.strip()], lang, size, measure), "parsed"


def with_context(chunks: list[CodeChunk], lang: str, size: int, measure: Callable[[str], int] = len) -> list[CodeChunk]:
    """Give a chunk that does not show where it sits a first comment line naming it: a member of a
    container (`# Parser.parse`: the method's own text names only `parse`; not the first member, which
    carries the container's header) and every piece after the first of a definition cut at lines. Both
    retrievers see the owner's name then, so a question naming the class finds its methods. The line range
    stays the source's; a chunk the line would push past `size` goes without it.

    >>> [c.text for c in with_context([CodeChunk("def f():", 2, 2, "A.f", "method")], "python", 100)]
    ['# A.f\\ndef f():']
    """
    mark = _COMMENT.get(lang, "//")
    out, prev = [], None
    for c in chunks:
        piece = prev is not None and c.symbol and c.symbol == prev.symbol and c.line_start == prev.line_end + 1
        prev = c
        owner = c.symbol.rpartition(".")[0].rpartition(".")[2]
        shown = piece or (owner and not re.search(rf"\b{re.escape(owner)}\b", c.text))  # a joined header names it
        if c.symbol and shown:
            text = f"{mark} {c.symbol}\n{c.text}"
            if measure(text) <= size:
                c = CodeChunk(text, c.line_start, c.line_end, c.symbol, c.kind)
        out.append(c)
    return out


def split_lines(lines: list[str], a: int, b: int, size: int, symbol: str, kind: str,
                measure: Callable[[str], int] = len) -> list[CodeChunk]:
    """Rows a..b (0-based, inclusive) cut into chunks of whole lines of at most `size` (characters,
    or what `measure` counts; a single longer line is cut into pieces)."""
    out: list[CodeChunk] = []
    start, buf, n = a, [], 0
    sep = 1 if measure is len else 0  # a line break is a character, not a token
    for r in range(a, b + 1):
        line = lines[r]
        cost = measure(line)
        if buf and n + cost + sep > size:
            out.append(CodeChunk("\n".join(buf), start + 1, r, symbol, kind))
            start, buf, n = r, [], 0
        if cost > size:
            step = max(1, len(line) * size // cost)
            for i in range(0, len(line), step):
                out.append(CodeChunk(line[i:i + step], r + 1, r + 1, symbol, kind))
            start = r + 1
            continue
        buf.append(line)
        n += cost + sep
    if buf and "".join(buf).strip():
        out.append(CodeChunk("\n".join(buf), start + 1, b + 1, symbol, kind))
    return out


def _row(point) -> int:
    return point[0]


def _end_row(node) -> int:
    """The last row holding the node's text (a node ending with its newline ends at column 0 of the
    next row: `#include` lines in C)."""
    r, c = node.end_point[0], node.end_point[1]
    return r - 1 if c == 0 and r > node.start_point[0] else r


def _receiver(node) -> str:
    """Go: the receiver type of a method (`func (s *Server) Start()` -> 'Server')."""
    rec = node.child_by_field_name("receiver")
    stack = [rec] if rec is not None else []
    while stack:
        c = stack.pop(0)
        if c.type == "type_identifier":
            return c.text.decode("utf-8", "replace")
        stack.extend(c.children)
    return ""


def _definition(node):
    """(the node that names the unit, its kind) when `node` is a definition, else None."""
    if node.type in WRAPPERS:
        for c in node.named_children:
            found = _definition(c)
            if found:
                return found
        return None
    if node.type in DEFINITIONS:
        return node, DEFINITIONS[node.type]
    if node.type in ("lexical_declaration", "variable_declaration"):  # const f = () => ...
        for d in node.named_children:
            v = d.child_by_field_name("value")
            if v is not None and v.type in _FUNC_VALUE:
                return d, "function"
    return None


def name_of(node) -> str:
    """The declared name: the `name` field, the end of a C-style declarator chain, or the first
    identifier on the definition's first line."""
    n = node.child_by_field_name("name")
    if n is None:
        d = node.child_by_field_name("declarator")
        while d is not None and d.child_by_field_name("declarator") is not None:
            d = d.child_by_field_name("declarator")
        n = d if d is not None else node.child_by_field_name("type")
    if n is not None:
        return n.text.decode("utf-8", "replace").strip()
    queue = list(node.children)
    first_row = _row(node.start_point)
    while queue:
        c = queue.pop(0)
        if _row(c.start_point) > first_row:
            continue
        if c.type in _IDENT:
            return c.text.decode("utf-8", "replace")
        queue.extend(c.children)
    return ""


def _nested(node) -> list:
    """The nearest definitions below `node` (not inside other definitions)."""
    found, stack = [], list(reversed(node.named_children))
    while stack:
        c = stack.pop()
        if _definition(c):
            found.append(c)
        else:
            stack.extend(reversed(c.named_children))
    return found


def _text(lines, a, b) -> str:
    """Rows a..b (0-based, inclusive) of the source."""
    return "\n".join(lines[a:b + 1])


_TYPES = {"class", "struct", "impl", "trait", "interface", "object", "record", "enum"}


def _units(children, lines, size, prefix, out, glue_symbol: str = "", glue_kind: str = "module", measure=len) -> None:
    """Emit the chunks of a run of sibling nodes: definitions, and the glue between them."""
    glue: list = []

    def flush_glue():
        if glue:
            a, b = _row(glue[0].start_point), _end_row(glue[-1])
            if not _TRIVIAL.match(_text(lines, a, b)):
                out.extend(split_lines(lines, a, b, size, glue_symbol, glue_kind, measure))
            glue.clear()

    for child in children:
        found = _definition(child)
        if not found:
            glue.append(child)
            continue
        # comments directly above the definition belong to it
        lead = []
        while glue and "comment" in glue[-1].type and _end_row(glue[-1]) >= _row(
                (lead[0] if lead else child).start_point) - 1:
            lead.insert(0, glue.pop())
        flush_glue()
        named, kind = found
        if kind == "function" and glue_kind in _TYPES:
            kind = "method"
        owner = _receiver(named) if named.type == "method_declaration" and not prefix else ""
        symbol = prefix + (owner + "." if owner else "") + (name_of(named) or "?")
        a = _row((lead[0] if lead else child).start_point)
        b = _end_row(child)
        body = _text(lines, a, b)
        inner = _nested(named)
        room = size - measure(f"// {symbol}\n")  # what is left beside with_context's line naming it
        if measure(body) <= (room if prefix else size) and not inner:
            out.append(CodeChunk(body, a + 1, b + 1, symbol, kind))
            continue
        if not inner:
            out.extend(split_lines(lines, a, b, room, symbol, kind, measure))
            continue
        _container(named, inner, a, b, lines, size, symbol, kind, out, measure)
    flush_glue()


def _container(named, inner: list, a: int, b: int, lines, size, symbol: str, kind: str, out, measure) -> None:
    """Emit a definition holding others (rows a..b, `inner` its nearest nested definitions)."""
    # a container (even a small one: a class chunk holding several methods ranks below each of them
    # for a question about one): its header, then its members (methods, fields, nested types) as units
    block = named.child_by_field_name("body")
    members = list(block.named_children) if block is not None else []
    if not members or not all(any(m.start_byte <= d.start_byte < m.end_byte for m in members) for d in inner):
        members = inner
    # the header runs up to the member holding the first nested definition (fields, docstring
    # and statements before it stay with the signature)
    first = next(i for i, m in enumerate(members) if m.start_byte <= inner[0].start_byte < m.end_byte)
    while first > 0 and "comment" in members[first - 1].type:
        first -= 1
    members = members[first:]
    head_end = _row(members[0].start_point) - 1
    head = split_lines(lines, a, head_end, size, symbol, kind, measure) if head_end >= a else []
    out.extend(head)
    at = len(out)
    _units(members, lines, size, symbol + ".", out, symbol, kind, measure)
    if head and len(out) > at:  # the signature stays with the first member when both fit
        h, m = out[at - 1], out[at]
        joined = h.text + "\n" + m.text
        if m.line_start == h.line_end + 1 and measure(joined) <= size:
            out[at - 1:at + 1] = [CodeChunk(joined, h.line_start, m.line_end, m.symbol, m.kind)]
    tail_a = _end_row(members[-1]) + 1
    if tail_a <= b and not _TRIVIAL.match(_text(lines, tail_a, b)):
        out.extend(split_lines(lines, tail_a, b, size, symbol, kind, measure))

