"""Every option any command shows in --help is passed to that command by at least one test (a flag no
test passes can break silently).

A flag counts when it appears in an argument list a test builds for the command: a list or tuple
literal that starts with the command's words (`["quant", "imatrix", "-m", ...]`), or, for lists spliced
into such a call (parametrized extras), an argument of a test's helper call, or a key of an options
dict, it counts for every command. A flag only mentioned in a docstring, a comment or an assertion's
text does not count. The allow-list says why each exception
cannot be tested here."""

import ast
from pathlib import Path

import click

from llmkit.cli import cli

TESTS = Path(__file__).parent

ALLOWED: dict[str, str] = {
    # "command path flag" -> why no test here can pass it (each entry is a feature shipped untested: keep
    # this empty unless a flag needs hardware or services a test runner cannot have)
}


def walk(command: click.Command, path=("llmkit",)):
    """(command path, click.Option) for every option of every command under `command`."""
    ctx = click.Context(command, info_name=path[-1])
    for p in command.params:
        if isinstance(p, click.Option) and not p.hidden:
            yield " ".join(path), p
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from walk(sub, path + (name,))


def _command_paths() -> set[str]:
    return {where for where, _ in walk(cli)} | {"llmkit"}


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _flag(s: str) -> str | None:
    s = s.split("=", 1)[0]
    return s if s.startswith("-") and len(s) > 1 and s[1:2] != " " else None


def passed_flags() -> tuple[dict[str, set[str]], set[str]]:
    """Flags by the command they are passed to, and flags passed where the command is not in sight
    (in argument lists spliced into a call, as arguments of a test's helper, or as keys of an options dict)."""
    paths = _command_paths()
    by_command: dict[str, set[str]] = {}
    spliced: set[str] = set()
    files = [p for p in TESTS.rglob("*.py") if p.name != Path(__file__).name and "fixtures" not in p.parts]
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                spliced |= {fl for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                            if (fl := _flag(a.value))}
            elif isinstance(node, ast.Dict):
                spliced |= {fl for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
                            if (fl := _flag(k.value))}
            if not isinstance(node, (ast.List, ast.Tuple)) or not node.elts:
                continue
            words, globals_ = [], set()
            for e in node.elts:  # the leading string constants: the command's words (after global options)
                if not (isinstance(e, ast.Constant) and isinstance(e.value, str)):
                    break
                if e.value in ("-q", "--quiet", "--debug") and not words:
                    globals_.add(e.value)
                    continue
                words.append(e.value)
            by_command.setdefault("llmkit", set()).update(globals_)
            path = None
            for n in range(len(words), 0, -1):
                candidate = " ".join(["llmkit", *words[:n]])
                if candidate in paths:
                    path = candidate
                    break
            if path == "llmkit quant" or (path is None and words[:1] == ["quant"]):
                path = "llmkit quant quantize"  # `llmkit quant IN ...` runs quantize
            flags = {fl for s in _strings(node) if (fl := _flag(s))}
            if path is not None:
                by_command.setdefault(path, set()).update(flags)
            else:
                spliced |= flags
    return by_command, spliced


def test_every_help_option_is_passed_by_a_test():
    by_command, spliced = passed_flags()
    options = list(walk(cli))
    assert len(options) > 100  # the walk reached every group (lazy groups included)
    missing = []
    for where, opt in options:
        names = [n for n in opt.opts + opt.secondary_opts if n not in ("-h", "--help")]
        given = by_command.get(where, set()) | spliced
        if names and not any(n in given or f"{where} {n}" in ALLOWED for n in names):
            missing.append(f"{where} {'/'.join(names)}")
    assert not missing, "options no test passes (add a test, or an ALLOWED entry saying why not):\n" + "\n".join(
        sorted(set(missing)))
    stale = [k for k in ALLOWED if k.rsplit(" ", 1)[1] in by_command.get(k.rsplit(" ", 1)[0], set())]
    assert not stale, f"allow-listed flags that a test does pass now (drop them from ALLOWED): {stale}"


def test_a_mentioned_flag_does_not_count():
    """The rule itself: a flag in a docstring or an assertion message is not a flag passed to a command."""
    import tempfile

    src = ('"""uses --mentioned-only"""\n'
           'def test_x():\n'
           '    run_cli(["kv", "plan", "--passed-here", "-m", "m.gguf"])\n'
           '    assert "--also-only-text" in "x"\n')
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.py"
        p.write_text(src)
        global TESTS
        saved, TESTS = TESTS, Path(d)
        try:
            by_command, spliced = passed_flags()
        finally:
            TESTS = saved
    assert by_command == {"llmkit": set(), "llmkit kv plan": {"--passed-here", "-m"}} and spliced == set()
