"""The docs cannot drift from the code: the CLI reference equals --help, every setting the code reads is
documented, every relative link resolves, the README stays a front door, and the CLI keeps one meaning per
short flag and at most 30 options per command."""

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_cli_reference_equals_help():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_cli_reference.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr


def test_every_setting_the_code_reads_is_documented():
    """Every LLMKIT_* name in llmkit/ (and every entry of config.VARIABLES) appears in docs/configuration.md,
    and only llmkit/config.py reads the environment for them."""
    from llmkit.config import INSTALL_VARIABLES, VARIABLES

    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    used, readers = set(), set()
    for f in (ROOT / "llmkit").rglob("*.py"):
        text = f.read_text(encoding="utf-8")
        used |= set(re.findall(r"\bLLMKIT_[A-Z_]*[A-Z]\b", text))
        if re.search(r"os\.environ(\.get)?\s*[\[(]\s*['\"]LLMKIT_", text) or re.search(r"getenv\(\s*['\"]LLMKIT_", text):
            readers.add(f.relative_to(ROOT).as_posix())
    missing = sorted(n for n in used | set(VARIABLES) | set(INSTALL_VARIABLES) if f"`{n}`" not in page)
    assert not missing, f"docs/configuration.md does not document: {missing}"
    assert readers <= {"llmkit/config.py"}, f"only llmkit/config.py may read LLMKIT_* variables: {sorted(readers)}"
    unknown = sorted(n for n in used if n not in VARIABLES and n not in INSTALL_VARIABLES)
    assert not unknown, f"used but not declared in llmkit.config.VARIABLES: {unknown}"


def _links(path: Path):
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold commands, not links
    for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", text):
        yield m.group(1)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    bad = []
    for target in _links(doc):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(target)
        elif anchor and dest.suffix == ".md":
            body = dest.read_text(encoding="utf-8")
            slugs = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", body, re.M)} | set(re.findall(r'id="([^"]+)"', body))
            if anchor not in slugs:
                bad.append(target)
    assert not bad, f"{doc.relative_to(ROOT)}: links that do not resolve: {bad}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return s.replace(" ", "-")


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250: the rest belongs in docs/)"
    first = next(i for i, ln in enumerate(lines) if ln.lstrip().removeprefix("$ ").startswith("llmkit "))
    assert first < 80, f"the first llmkit command is on line {first + 1}"
    start = lines.index("## Install")
    block = lines[lines.index("```bash", start) + 1:]
    block = block[:block.index("```")]
    assert 1 <= len(block) <= 2 and all(len(ln) <= 160 for ln in block), block


def _leaves():
    from llmkit.cli import cli

    def walk(cmd, ctx):
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                yield from walk(sub, click.Context(sub, info_name=name, parent=ctx))
        else:
            yield ctx.command_path, cmd

    yield from walk(cli, click.Context(cli, info_name="llmkit"))


def test_no_command_has_more_than_30_options():
    big = {path: n for path, cmd in _leaves()
           if (n := sum(isinstance(p, click.Option) and not p.hidden for p in cmd.params)) > 30}
    assert not big, big


def test_each_short_flag_has_one_meaning():
    """A short flag (-x, -ngl) is the same long option wherever it appears (llama.cpp's meaning where it has one)."""
    meaning: dict[str, set[str]] = {}
    for path, cmd in _leaves():
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.hidden:
                continue
            longs = [o for o in p.opts if o.startswith("--")]
            for short in (o for o in p.opts if not o.startswith("--")):
                meaning.setdefault(short, set()).add(longs[0] if longs else short)
    assert {s: m for s, m in meaning.items() if len(m) > 1} == {}
    assert meaning["-t"] == {"--threads"} and meaning["-m"] == {"--model"} and meaning["-c"] == {"--ctx-size"}
    assert meaning["-n"] == {"--n-predict"}
