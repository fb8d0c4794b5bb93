"""Names the project's own code reads but never binds. A NameError on a path the quick suite does
not take lands silently and surfaces later: a `--full`-only test read a variable of another test
(CI failed on it), and a counter rule read a local moved into a helper, which crashed distify on a
counter added to again in a later loop. pyflakes finds both without running anything."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The project's code; fixtures are users' scripts, written as users write them.
FOLDERS = ("migrate", "rules", "runtime", "tests", "bench", "examples")


def undefined_names(source: str, filename: str) -> list:
    """`file:line: message` for every name pyflakes finds read and never bound."""
    from pyflakes import checker, messages

    kinds = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)
    found = checker.Checker(ast.parse(source, filename), filename=filename).messages
    return [f"{filename}:{m.lineno}: {m.message % m.message_args}" for m in found if isinstance(m, kinds)]


def test_the_projects_code_reads_no_unbound_name():
    files = sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))
    assert len(files) > 100
    found = [line for p in files for line in undefined_names(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize("source,expected", [
    ("def f(a):\n    if a:\n        return fsdp\n", 1),  # control: the CI failure's shape
    ("def f():\n    around = 1\n    return around\n\ndef g():\n    return around\n", 1),  # moved into a helper
    ("from __future__ import annotations\ndef f(x: Optional[int]):\n    return x\n", 1),  # annotations too
    ("def f(a):\n    fsdp = a == 'fsdp'\n    return fsdp\n", 0),
])
def test_the_check_finds_a_name_read_and_never_bound(source, expected):
    assert len(undefined_names(source, "x.py")) == expected
