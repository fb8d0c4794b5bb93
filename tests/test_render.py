"""distify.render: the rewritten module's bytes, copying from the source the text of the statements no
edit touched, equal libcst's render of the whole new tree on every fixture, under every backend."""
from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from distify import render as render_module
from distify.engine import migrate_source
from distify.options import Options
from distify.positions import Locator

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
INPUTS = sorted(p for p in FIXTURES.rglob("*.in.py") if "projects" not in p.parts)


def _copied_and_rendered(inputs, backend, monkeypatch) -> int:
    """How many outputs took a statement's text from the source; asserts each equals the render."""
    real = render_module.render
    copied = []

    def checked(new, original, text, spans):
        out = real(new, original, text, spans)
        assert out == new.bytes, "the copied text differs from libcst's render"
        copied.append(spans is not None and any(s in original.body for s in new.body))
        return out

    monkeypatch.setattr(render_module, "render", checked)
    for path in inputs:
        migrate_source(path.read_bytes(), Options(backend=backend), str(path))
    return sum(copied)


def test_copying_the_unedited_statements_renders_what_libcst_renders(monkeypatch):
    assert _copied_and_rendered(INPUTS[::9], "ddp", monkeypatch) > 15


@pytest.mark.sweep  # every input, every backend: with --full (CI), see conftest.py
@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
def test_copying_the_unedited_statements_renders_what_libcst_renders_on_every_input(backend, monkeypatch):
    assert _copied_and_rendered(INPUTS, backend, monkeypatch) > 150


SHAPES = (
    "#!/usr/bin/env python\n# header comment\n\n\"\"\"doc\"\"\"\nimport torch  # why\n\n\n"
    "# above a decorator\n@torch.no_grad()\n# between decorators\n@decorate(\n    f(1))\n\ndef g(x):\n"
    "    if x:\n        y = h(x,\n              k(2))\n        # the block's last comment\n\n    # dedented once\n"
    "# at column 0 after a body\nclass C(B(1)):\n    def m(self): return torch.zeros(1).sum()\n"
    "x = 1; y = f(x)\nz = (\n    1\n)\nif z:\n    pass\nelse:\n    pass\n\n# footer\n\n"
)


def test_each_span_is_the_text_libcst_renders_for_its_statement():
    """Comments and blank lines between statements, decorators, a block's trailing comments, the
    module's header and footer: each statement's span is exactly its own rendering."""
    module = cst.parse_module(SHAPES)
    where = Locator(module, SHAPES, lambda node: None)
    where._lines = where._statement_lines()
    spans = where.top_spans()
    assert spans is not None and len(spans) == len(module.body) > 6
    for stmt, (a, b) in zip(module.body, spans):
        assert SHAPES[a:b] == module.code_for_node(stmt)


def test_a_shape_the_spans_do_not_handle_renders_the_whole_module():
    """No spans (a carriage return in the text, no final newline, a statement that does not pair):
    the whole module is rendered."""
    for text in ("import torch\r\nx = 1\r\n", "import torch\nx = 1", "x = (1,\n 2)\n@d\ndef f(): pass\n"):
        module = cst.parse_module(text)
        where = Locator(module, text, lambda node: None)
        where._lines = where._statement_lines()
        spans = where.top_spans()
        assert (spans is None) == (not text.endswith("\n") or "\r" in text), text
        if spans is not None:
            assert "".join(text[a:b] for a, b in spans) == text
        new = module.with_changes(body=[*module.body, cst.parse_statement("y = 2\n")])
        assert render_module.render(new, module, text, spans) == new.bytes
