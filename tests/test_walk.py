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

import dataclasses
import functools
import typing
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from distify import edits as edits_module
from distify import walk as walk_module
from distify.records import _Collector, positions
from distify.engine import migrate_source
from distify.rules.base import Options
from distify.walk import TRIVIA, children, preorder, walk

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
INPUTS = sorted(FIXTURES.rglob("*.in.py"))


@functools.lru_cache(maxsize=None)
def _modules():
    """Every input, parsed once for all the tests here (they only read the trees, which libcst
    never changes in place)."""
    return tuple((path, cst.parse_module(path.read_bytes())) for path in INPUTS)


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


def test_preorder_visits_what_walk_visits():
    for path, module in list(_modules())[1::4]:
        seen, pruned = [], []

        class V(cst.CSTVisitor):
            def on_visit(self, node):
                seen.append(node)
                return True

        class P(cst.CSTVisitor):
            def on_visit(self, node):
                pruned.append(node)
                return not isinstance(node, (cst.FunctionDef, cst.Call))

        walk(module, V())
        walk(module, P())
        assert [id(n) for n in preorder(module)] == [id(n) for n in seen], path
        got = preorder(module, lambda n: isinstance(n, (cst.FunctionDef, cst.Call)))
        assert [id(n) for n in got] == [id(n) for n in pruned], path


def test_positions_equal_the_metadata_wrapper():
    for path, module in list(_modules())[::3]:
        fast = positions(MetadataWrapper(module, unsafe_skip_copy=True))
        slow = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        assert dict(fast) == dict(slow), path



def _located_as_rendered(source: bytes) -> tuple:
    """(nodes checked, nodes not located) where the statement-by-statement start of every statement,
    call and attribute is the start rendering the whole module gives (asserted)."""
    from distify.anatomy import analyse
    from distify.engine import decode
    from distify.positions import Locator, ranges, statement_of

    module = cst.parse_module(source)
    a = analyse(module)
    where = Locator(module, decode(source)[0], statement_of(a.stmt_parent, a.calls, a.attr_uses))
    full = ranges(module)
    checked = unlocated = 0
    for node in list(a.stmt_parent) + [c.call for c in a.calls] + [u[0] for u in a.attr_uses]:
        start = where.start(node)
        checked += 1
        unlocated += start is None  # the caller then renders the module: slower, not wrong
        assert start is None or start == full.start(node), (type(node).__name__, start, full.start(node))
    return checked, unlocated


SHAPES = (
    "import torch\r\n"
    "@torch.no_grad()\r\n"
    "@decorate(\r\n"
    "    f(1))\r\n"
    "def g(x):\r\n"
    "\tif x:\r\n"
    "\t\ty = h(x,\r\n"
    "\t\t      k(2))\r\n"
    "\telif torch.cuda.is_available() and p(x):\r\n"
    "\t\tpass\r\n"
    "\telse: q(); r()\r\n"
    "\ttry:\r\n"
    "\t\ts(x)\r\n"
    "\texcept E as e:  # why\r\n"
    "\t\tt(e)\r\n"
    "\tfinally:\r\n"
    "\t\tu()\r\n"
    "\twith v(x) as w, z(): w.m(\r\n"
    "\t\t1)\r\n"
    "\tmatch x:\r\n"
    "\t\tcase 1:\r\n"
    "\t\t\tm.n(x)\r\n"
    "\tfor i in range(3):\r\n"
    "\t\tprint(i)\r\n"
    "\telse:\r\n"
    "\t\tprint(\"done\"); o.p()\r\n"
    "class C(B(1)):\r\n"
    "    def m(self): return torch.zeros(1).sum()\r\n"
    "x = 1; y = f(x)\r\n"
)


def test_nodes_found_statement_by_statement_start_where_rendering_the_module_says():
    """A finding's position comes from rendering only the statement around the node, placed on the
    line CPython's parser gives that statement (distify.positions.Locator): on the statement shapes
    it must pair (decorators, elif, a suite on the header's line, handlers, match, tabs, CRLF,
    continuation lines inside blocks) and on fixtures (inputs and expected outputs: the audit
    locates nodes of distify's output), the start is the one rendering the whole module gives."""
    checked, unlocated = _located_as_rendered(SHAPES.encode())
    assert checked > 40 and unlocated == 0
    checked = unlocated = 0
    for path in sorted(FIXTURES.rglob("*.py"))[::8]:
        try:
            c, u = _located_as_rendered(path.read_bytes())
        except AssertionError as e:
            raise AssertionError(f"{path}: {e}") from None
        checked, unlocated = checked + c, unlocated + u
    assert checked > 5000 and unlocated < checked / 100


def test_a_node_in_two_places_is_located_by_rendering_the_module():
    """One statement object at two places of a tree (a rewrite may insert one node twice): which
    occurrence a position means is the module rendering's answer, not a guess."""
    from distify.anatomy import analyse

    stmt = cst.parse_statement("x = f(1)\n")
    module = cst.Module(body=[stmt, cst.parse_statement("y = 2\n"), stmt])
    a = analyse(module, text=module.code)
    call = a.calls[0].call
    expected = ranges_start = positions(MetadataWrapper(module, unsafe_skip_copy=True))[call].start
    assert a.position(call) == (ranges_start.line, ranges_start.column + 1)
    assert a.position(stmt)[0] == positions(MetadataWrapper(module, unsafe_skip_copy=True))[stmt].start.line
    assert expected.line == 3


def _edits_applied_to_the_edited_paths_only_change_nothing(inputs, backend, monkeypatch):
    """How many of `inputs` change; fails where entering every node renders another output."""
    options = Options(backend=backend)
    sources = [p.read_bytes() for p in inputs]
    pruned = [migrate_source(s, options) for s in sources]
    monkeypatch.setattr(edits_module, "_holding_edits", lambda root, edits: None)  # enter every node
    for path, source, fast in zip(inputs, sources, pruned):
        full = migrate_source(source, options)
        assert fast.output == full.output, path
        assert fast.findings == full.findings, path
    return sum(r.changed for r in pruned)


@pytest.mark.sweep  # every input: with --full (CI), see conftest.py
@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_applying_edits_to_the_edited_paths_only_changes_nothing(backend, monkeypatch):
    assert _edits_applied_to_the_edited_paths_only_change_nothing(INPUTS, backend, monkeypatch) > 30


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_applying_edits_to_the_edited_paths_only_changes_nothing_in_each_folder(backend, monkeypatch):
    """The quick run's sample of the sweep above: the first input of every fixture folder."""
    first = {}
    for path in INPUTS:
        first.setdefault(path.parent, path)
    assert _edits_applied_to_the_edited_paths_only_change_nothing(list(first.values()), backend, monkeypatch) > 30


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


def _training_functions_by_walking(functions, methods):
    """The definition training_functions answers from the analysis pass's records: a function trains
    when its body trains or calls (by name, or through its instance within its class) one that does."""
    from distify.dataflow import _is_training_body
    from distify.syntax import dotted

    from distify.instance import instance_name, on

    all_fns = list(functions.values()) + [m for m in methods if m not in functions.values()]
    trains = {fn for fn in all_fns if _is_training_body(fn.body)}
    callees = {}
    for fn in all_fns:
        own = {m.name.value: m for m, k in methods.items() if k is methods.get(fn)} if fn in methods else {}
        instance = instance_name(fn) if fn in methods else None  # the method's own, however spelled
        found = set()

        class V(cst.CSTVisitor):
            def visit_Call(self, node):
                d = dotted(node.func)
                if d in functions:
                    found.add(functions[d])
                elif on(d, instance) in own:
                    found.add(own[on(d, instance)])

        walk(fn.body, V())
        callees[fn] = found
    while True:
        more = {fn for fn in all_fns if fn not in trains and callees[fn] & trains}
        if not more:
            return trains
        trains |= more


_NESTED_TRAINING = """
import torch

def step(model, opt, x):
    model(x).sum().backward()
    opt.step()

def deco(f):
    return f

@deco(step(None, None, None))
def decorated_only(model):
    pass

def through_inner(model, opt, data):
    def inner(x):
        step(model, opt, x)
    for x in data:
        inner(x)

def through_lambda(model, opt, data):
    run = lambda x: step(model, opt, x)

class Trainer:
    def one(self, x):
        self.model(x).sum().backward()

    def epoch(self, data):
        class Local:
            def go(inner_self, x):
                self.one(x)

    def idle(self):
        def later(f=self.one(1)):
            pass
"""


def test_training_functions_from_the_records_equal_walking_each_body():
    from distify.training import training_functions

    def run(module):
        col = _Collector()
        walk(module, col)
        got = training_functions(col.functions, col.methods, col.calls, col.stmt_scope)
        assert got == _training_functions_by_walking(col.functions, col.methods)
        return {fn.name.value for fn in got}

    names = run(cst.parse_module(_NESTED_TRAINING))
    # nested functions, lambdas and classes count for the function around them; a decorator of the
    # function itself does not, a default of a nested function does
    assert names == {"step", "through_inner", "through_lambda", "one", "epoch", "idle"}
    trained = 0
    for path, module in list(_modules())[::2]:
        trained += bool(run(module))
    assert trained > 50


def test_generator_passes_are_found_only_where_something_yields():
    from distify.training import generator_passes

    def passes(module):
        col = _Collector()
        walk(module, col)
        found = 0
        for fn in col.functions.values():
            slow = generator_passes(fn, col.qualname)
            assert generator_passes(fn, col.qualname, col.yielding) == slow
            found += len(slow)
        return found

    assert passes(cst.parse_module(
        "import itertools\n"
        "def a(loader):\n    for b in loader:\n        def g():\n            yield 1\n"
        "def b(loader):\n    yield from loader\n"
        "def c(loader):\n    for l in itertools.repeat(loader):\n        yield from l\n"
        "def d(loader):\n    for b in loader:\n        print(b)\n"
    )) == 3
    # every input, not a sample: which inputs a sample holds moves whenever a fixture is added
    assert sum(passes(module) for path, module in _modules()) >= 2


def test_a_file_with_no_edit_is_not_rendered_again(monkeypatch):
    """distify's own output, checked again (pre-commit's case): no rule edits it, and the engine
    hands back the bytes it read instead of rendering the parsed tree once more (libcst renders a
    parsed tree byte for byte). With positions off nothing generates code at all."""
    source = (FIXTURES / "DST101" / "frozen_teacher.ddp.py").read_bytes()
    renders = []
    real = cst.Module._codegen_impl
    monkeypatch.setattr(cst.Module, "_codegen_impl", lambda self, state, *a: renders.append(self) or real(self, state, *a))
    result = migrate_source(source, Options(positions=False))
    assert not result.changed and result.output is source
    assert renders == []


def _uses_by_walking(scope, name):
    """What facts.uses answers, one search per question (its definition before the per-scope index),
    written as a search with an explicit stack: (node, ancestors, nested) entries, children pushed in
    reverse so that they come out in source order."""
    from distify.syntax import dotted

    out, todo = [], [(scope, (), False)]
    while todo:
        node, above, nested = todo.pop()
        below, inner = [], nested
        if isinstance(node, cst.Attribute) and dotted(node) == name:
            out.append((node, above, nested))
        elif isinstance(node, cst.Attribute):
            below = [node.value]
        elif isinstance(node, cst.Name):
            out += [(node, above, nested)] * ("." not in name and node.value == name)
        elif isinstance(node, (cst.Arg, cst.Param)):
            below = [v for v in [node.value if isinstance(node, cst.Arg) else node.default] if v is not None]
        elif isinstance(node, (cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal)):
            pass
        elif node is not scope and isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            lam = isinstance(node, cst.Lambda)
            if lam or not isinstance(scope, cst.Module):
                below, inner = [c for c in children(node) if lam or not isinstance(c, cst.Name)], True
        elif isinstance(node, cst.FunctionDef):
            below = [node.body]
        else:
            below = children(node)
        todo += [(c, above + (node,), inner) for c in reversed(below)]
    return out


_USES = """
import torch.nn as nn
from os import path as p

cfg.model.lr = 1
def train(model, lr=cfg.model.lr, k=lambda v: v + model.w):
    global step
    f = lambda x: model(x) + cfg.model.lr
    def inner(y=model):
        return model.layer(y), cfg.model
    class Box:
        model = model
    for model.x in range(3):
        g(model=model, lr=lr)
    return f(model)[model.i].t.model
"""


def test_uses_from_the_per_scope_index_equal_walking_for_each_name():
    from distify.facts import uses
    from distify.syntax import dotted

    asked = 0
    made = cst.parse_module(_USES)
    for path, module in [("_USES", made)] + list(_modules())[::40]:
        scopes = [module] + [n for n in preorder(module) if isinstance(n, cst.FunctionDef)]
        spelled = {dotted(n) for n in preorder(module) if isinstance(n, (cst.Name, cst.Attribute))} - {None}
        for scope in scopes:
            for name in sorted(spelled) + ["never_spelled", "a.never"]:
                assert list(uses(scope, name)) == _uses_by_walking(scope, name), (path, name)
                asked += 1
    assert asked > 1000


def test_data_parallel_references_are_walked_for_only_where_one_can_be(monkeypatch):
    """DST902 looks for uses of the DataParallel class (isinstance, type tests) by walking the module,
    and skips the walk when no import binds the class and no attribute resolves to it: the answer is
    the same as walking every module, and a script without the class is not walked."""
    from distify.anatomy import analyse
    from distify.rules import dst902_data_parallel as dst902

    class Walked:  # the same anatomy, with the shortcut off (as for an inline runtime class)
        standalone_runtime = "forced"

        def __init__(self, anatomy):
            self._anatomy = anatomy

        def __getattr__(self, name):
            return getattr(self._anatomy, name)

    paths = sorted((FIXTURES / "DST902").glob("*.in.py")) + INPUTS[::25]
    with_refs = 0
    for path in paths:
        anatomy = analyse(cst.parse_module(path.read_bytes()))
        fast = dst902._class_references(anatomy)
        assert fast == dst902._class_references(Walked(anatomy)), path
        with_refs += bool(fast)
    assert with_refs >= 3
    walked = []
    monkeypatch.setattr(dst902, "children", lambda node: walked.append(node) or children(node))
    dst902._class_references(analyse(cst.parse_module("import torch\nmodel = torch.nn.Linear(2, 2)\nprint(model)\n")))
    assert walked == []


def _node_classes():
    seen, todo = set(), [cst.CSTNode]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return sorted((c for c in seen if dataclasses.is_dataclass(c)), key=lambda c: c.__qualname__)


def _holds_code_by_resolved_hints(annotation) -> bool:
    """The field filter as first written: annotations resolved by typing, classes tested by issubclass."""
    if annotation is None or annotation is type(None):
        return False
    origin = typing.get_origin(annotation)
    if origin is typing.Literal or origin is typing.ClassVar:
        return False
    if origin is not None:
        return any(_holds_code_by_resolved_hints(a) for a in typing.get_args(annotation))
    if not isinstance(annotation, type) or not issubclass(annotation, cst.CSTNode):
        return not isinstance(annotation, type)
    return not (annotation in TRIVIA or issubclass(annotation, walk_module._TRIVIA_BASES))


def test_fields_that_may_hold_code_are_those_the_resolved_annotations_say():
    """walk reads the dataclass fields' own annotations and tests classes by their MRO (cheap at
    start-up); for every libcst node type it keeps the fields that the annotations resolved by
    typing.get_type_hints and tested with issubclass keep."""
    classes = _node_classes()
    assert len(classes) > 200
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            assert walk_module._may_hold_code(f.type) == _holds_code_by_resolved_hints(hints[f.name]), (cls, f.name)


def test_the_collector_has_a_hook_for_each_statement_type_and_no_other():
    """The collector's generated statement hooks pick libcst's statement types by their MRO (cheap
    at start-up); they are the types issubclass names."""
    kinds = {t.__name__ for t in vars(cst).values()
             if isinstance(t, type) and issubclass(t, (cst.SimpleStatementLine, cst.BaseCompoundStatement))}
    generated = {name.split("_", 1)[1] for prefix in ("visit_", "leave_") for name, fn in vars(_Collector).items()
                 if name.startswith(prefix) and "_statement_hooks" in getattr(fn, "__qualname__", "")}
    assert len(kinds) > 10
    assert generated == kinds



def test_a_fact_two_rules_ask_is_found_once_per_analysis(monkeypatch):
    """DST101 and DST104 both ask which ``requires_grad`` changes a training loop makes
    (``model_contract.training_freezes``): the answer is kept with the analysis (``Facts.memo``),
    found once per migration, and found again by the next migration (nothing kept between files)."""
    import distify.model_state as model_state

    source = (FIXTURES / "DST101" / "freeze_in_loop.in.py").read_bytes()
    options = Options(backend="ddp", select=("DST101", "DST104"))
    asked = []
    real = model_state.changes_in
    loops = (cst.For, cst.While)  # the training loops' reading (other facts read other statements)
    monkeypatch.setattr(model_state, "changes_in",
                        lambda *a, **k: (isinstance(a[2], loops) and asked.append(a[2])) or real(*a, **k))
    first = migrate_source(source, options)
    once = list(asked)
    assert once and len(once) == len(set(map(id, once)))  # each training loop read once
    assert any("stop requiring a gradient" in f.message for f in first.findings)
    asked.clear()
    second = migrate_source(source, options)
    assert len(asked) == len(once) and second.findings == first.findings


def test_the_node_classes_tested_by_identity_have_no_subclasses():
    """distify.syntax and facts.uses test a node's class by identity (``type(n) is cst.Name``)
    where ``isinstance`` would run ABCMeta's check: the same answer only while libcst's classes
    have no subclasses. A libcst that adds one fails here, not in a silent miss."""
    from distify.syntax import EXACT, NESTED

    def every_subclass(cls):
        return [s for c in cls.__subclasses__() for s in [c, *every_subclass(c)]]

    from distify.dataflow import _STATEMENT_LEVEL

    assert {cst.FunctionDef, cst.Lambda, cst.ClassDef} == NESTED <= set(EXACT)
    assert {c.__name__: every_subclass(c) for c in EXACT if every_subclass(c)} == {}
    assert {c.__name__: every_subclass(c) for c in _STATEMENT_LEVEL if every_subclass(c)} == {}


def test_any_node_of_a_statement_is_located_without_rendering_the_module():
    """A finding may name any node (an argument, a small statement, a name), not only a statement,
    call or attribute of the analysis' records: the innermost statement around it comes from one
    walk of the module (distify.positions.statement_of), its start from rendering that statement,
    and it equals the start the whole module's rendering gives."""
    from distify.anatomy import analyse
    from distify.engine import decode
    from distify.positions import Locator, ranges, statement_of
    from distify.walk import preorder

    checked = unlocated = 0
    for source in [SHAPES.encode()] + [p.read_bytes() for p in sorted(FIXTURES.rglob("*.py"))[::16]]:
        module = cst.parse_module(source)
        a = analyse(module)
        where = Locator(module, decode(source)[0], statement_of(a.stmt_parent, a.calls, a.attr_uses, module))
        full = ranges(module)
        for node in list(preorder(module))[1::7]:
            start = where.start(node)
            checked += 1
            unlocated += start is None
            assert start is None or start == full.start(node), (type(node).__name__, start, full.start(node))
    assert checked > 3000 and unlocated < checked / 20, (checked, unlocated)
