"""The fast paths of the engine give exactly what libcst's own machinery gives.

* ``distify.walk.walk`` calls a visitor's hooks on the same nodes, in the same order, as
  ``node.visit(visitor)`` (trivia excepted, unless the visitor hooks a trivia type);
* ``anatomy.positions`` equals ``MetadataWrapper.resolve(PositionProvider)``;
* ``ApplyEdits`` entering only the nodes that hold or contain an edit renders the same output as
  entering every node;
* what is kept between calls (a visitor class made per call, parsed templates) never leaks from one
  call or one file into another.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from distify import edits as edits_module
from distify.anatomy import _Collector, positions
from distify.engine import migrate_source
from distify.rules.base import Options
from distify.walk import TRIVIA, children, walk

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
INPUTS = sorted(FIXTURES.rglob("*.in.py"))


def _modules():
    for path in INPUTS:
        yield path, cst.parse_module(path.read_bytes())


class _Everything(cst.CSTVisitor):
    """Logs every callback libcst makes, except on trivia (which `walk` skips)."""

    def __init__(self) -> None:
        super().__init__()
        self.log = []

    def on_visit(self, node):
        if type(node) not in TRIVIA:
            self.log.append(("visit", id(node)))
        return not isinstance(node, cst.Lambda)  # and a pruned subtree

    def on_leave(self, original_node):
        if type(original_node) not in TRIVIA:
            self.log.append(("leave", id(original_node)))

    def on_visit_attribute(self, node, attribute):
        if type(node) not in TRIVIA:
            self.log.append(("attr", id(node), attribute))

    def on_leave_attribute(self, original_node, attribute):
        if type(original_node) not in TRIVIA:
            self.log.append(("/attr", id(original_node), attribute))


class _Hooks(cst.CSTVisitor):
    """Typed hooks only: the cached dispatch path of `walk`."""

    def __init__(self) -> None:
        super().__init__()
        self.log = []

    def visit_Call(self, node):
        self.log.append(("call", id(node)))

    def leave_Call(self, node):
        self.log.append(("/call", id(node)))

    def visit_For_body(self, node):
        self.log.append(("for.body", id(node)))

    def leave_For_body(self, node):
        self.log.append(("/for.body", id(node)))

    def visit_Arg_value(self, node):
        self.log.append(("arg.value", id(node)))

    def visit_Name(self, node):
        self.log.append(("name", id(node), node.value))

    def visit_FunctionDef(self, node):
        self.log.append(("def", id(node)))
        return node.name.value != "main"  # a pruned subtree


class _WithTrivia(_Hooks):
    """A hook on a trivia type: then `walk` must walk everything."""

    def visit_Comment(self, node):
        self.log.append(("comment", id(node), node.value))

    def visit_Comma(self, node):
        self.log.append(("comma", id(node)))


@pytest.mark.parametrize("visitor", [_Everything, _Hooks, _WithTrivia])
def test_walk_calls_the_hooks_libcst_calls(visitor):
    checked = 0
    for path, module in _modules():
        expected, got = visitor(), visitor()
        module.visit(expected)
        walk(module, got)
        assert got.log == expected.log, path
        checked += bool(expected.log)
    assert checked > 50


def test_walk_sees_comments_when_a_visitor_asks_for_them():
    module = cst.parse_module("x = f(a, b)  # note\n")
    v = _WithTrivia()
    walk(module, v)
    assert ("comment", id(module.body[0].trailing_whitespace.comment), "# note") in v.log
    assert sum(1 for e in v.log if e[0] == "comma") == 1


def test_collector_records_the_same_facts():
    def facts(c):
        return (
            [(id(x.call), x.qualname, id(x.scope), id(x.stmt), [id(l) for l in x.loops], [id(p) for p in x.parents])
             for x in c.calls],
            [(id(k), [id(p) for p in v]) for k, v in c.stmt_parent.items()],
            [(id(a), id(s)) for a, s, *_ in c.assigns],
            [id(f[0]) for f in c.fors],
            [id(a[0]) for a in c.attr_uses],
            dict(c.aliases), sorted(c.name_bindings), c.has_backward,
        )

    for path, module in _modules():
        expected, got = _Collector(), _Collector()
        module.visit(expected)
        walk(module, got)
        assert facts(got) == facts(expected), path


def test_children_are_libcsts_children_without_trivia():
    checked = 0
    for path, module in list(_modules())[::2]:
        class V(cst.CSTVisitor):
            def on_visit(self, node):
                nonlocal checked
                want = [c for c in node.children if type(c) not in TRIVIA]
                assert [id(c) for c in children(node)] == [id(c) for c in want], (path, type(node).__name__)
                checked += 1
                return True

        walk(module, V())
    assert checked > 10000


def test_positions_equal_the_metadata_wrapper():
    for path, module in list(_modules())[::3]:
        fast = positions(MetadataWrapper(module, unsafe_skip_copy=True))
        slow = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        assert dict(fast) == dict(slow), path


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_applying_edits_to_the_edited_paths_only_changes_nothing(backend, monkeypatch):
    options = Options(backend=backend)
    sources = [p.read_bytes() for p in INPUTS]
    pruned = [migrate_source(s, options) for s in sources]
    monkeypatch.setattr(edits_module, "_holding_edits", lambda root, edits: None)  # enter every node
    for path, source, fast in zip(INPUTS, sources, pruned):
        full = migrate_source(source, options)
        assert fast.output == full.output, path
        assert fast.findings == full.findings, path
    assert sum(r.changed for r in pruned) > 30


def _tagged_names(module, tag):
    seen = []

    class PerCall(cst.CSTVisitor):  # a new class on each call, with this call's closure
        def visit_Name(self, node):
            seen.append((tag, node.value))

    walk(module, PerCall())
    return seen


def test_a_visitor_class_made_per_call_runs_its_own_hooks():
    """walk keeps the plan of a class defined in a function across calls; the hooks it runs must
    still be the calling class's own (its closure), not the first call's."""
    module = cst.parse_module("a = b\nc(d)\n")
    first, second = _tagged_names(module, "first"), _tagged_names(module, "second")
    assert first == [("first", n) for n in "abcd"]
    assert second == [("second", n) for n in "abcd"]


def test_templates_are_parsed_once_but_never_shared_within_a_file():
    """Context.stmts reuses the nodes parsed for an earlier file, but hands out fresh ones when one
    file asks for the same code twice (facts keyed by node would confuse the two places)."""
    from distify.anatomy import analyse
    from distify.rules.base import Context

    code = "print('a template only this test writes')\nx = 1"

    def context():
        return Context(analyse(cst.parse_module("import torch\n")), Options())

    one = context()
    a, b = one.stmts(code), one.stmts(code)
    assert [cst.Module(body=a).code, cst.Module(body=b).code] == [code + "\n"] * 2
    assert all(x is not y for x, y in zip(a, b))
    c = context().stmts(code)  # the next file: the cached nodes again
    assert all(x is y for x, y in zip(a, c))
