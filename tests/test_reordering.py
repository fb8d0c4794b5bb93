"""The reordering transformation of the metamorphic tests (tests/reordering.py): it moves only what is
free to move, what it moves changes nothing a program computes, and the normal form the migrations are
compared in undoes exactly such moves, not others."""

from __future__ import annotations

import textwrap

import pytest

from metamorphic import canonical, names_of
from reordering import normal_form, reorder


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip()


def _same_normal_form(a: str, b: str) -> bool:
    known = names_of(a) | names_of(b)
    return canonical(normal_form(a, known), known) == canonical(normal_form(b, known), known)


MOVES = [
    ("import os\nimport sys\n", "import sys\nimport os\n"),
    ("from torch import nn\nimport numpy as np\n", "import numpy as np\nfrom torch import nn\n"),
    ("lr = 0.1\nepochs = 3\n", "epochs = 3\nlr = 0.1\n"),
    ("a, b = x.y, 2\nc = -x.z * 2\n", "c = -x.z * 2\na, b = x.y, 2\n"),
    ("def f(x=1):\n    return g()\ndef g():\n    return f()\n", "def g():\n    return f()\ndef f(x=1):\n    return g()\n"),
    ("class A:\n    x = 1\nclass B:\n    y = 2\n", "class B:\n    y = 2\nclass A:\n    x = 1\n"),
    ("import torch\ndevice = torch.device(\"cpu\")\ndef f():\n    pass\n",
     "import torch\ndef f():\n    pass\ndevice = torch.device(\"cpu\")\n"),
    ("f(a, b=1, c=x.y, d=2)\n", "f(a, d=2, c=x.y, b=1)\n"),
    ("f(a=1, b=2, *rest, c=3, d=4)\n", "f(b=2, a=1, *rest, d=4, c=3)\n"),
]


KEEPS = [
    ("a read of what the other binds", "a = 1\nb = a\n"),
    ("the same name bound twice", "a = 1\na = 2\n"),
    ("a call", "a = f()\nb = 2\n"),
    ("a subscript (a __getitem__ may run code)", "a = x[0]\nb = 2\n"),
    ("a decorated def", "@register\ndef f():\n    pass\ndef g():\n    pass\n"),
    ("a method's decorator runs with its class", "class A:\n    @property\n    def p(self):\n        return 1\nclass B:\n    pass\n"),
    ("a base class", "class A:\n    pass\nclass B(A):\n    pass\n"),
    ("a class body read", "class A:\n    x = 1\nclass B:\n    y = A\n"),
    ("a default value", "class A:\n    pass\ndef f(x=A):\n    pass\n"),
    ("a class body that calls", "class A:\n    n = len(x)\nclass B:\n    pass\n"),
    ("__future__", "from __future__ import annotations\nimport os\n"),
    ("a star import", "from os import *\nimport sys\n"),
    ("imports binding one name", "import torch.nn\nimport torch.optim\n"),
    ("an import next to an assignment", "import os\nlr = 0.1\n"),
    ("a keyword with an effect", "f(a=g(), b=1)\n"),
    ("keywords around **", "f(a=1, **kw)\nf(**kw, b=2)\n"),
    ("the builtin dict's order", "d = dict(a=1, b=2)\n"),
    ("a subscript target", "x[0] = 1\nb = 2\n"),
    ("a bare library call", "import torch\ntorch.manual_seed(0)\ndef f():\n    pass\n"),
    ("two library calls", "import torch\na = torch.randn(2)\nb = torch.randn(2)\n"),
    ("a call into the script", "a = helper()\ndef f():\n    pass\n"),
    ("a library call given the def", "import torch\ndef f():\n    pass\ng = torch.compile(f)\n"),
    ("a read of library state next to a library call",
     "import torch\nflag = torch.backends.cudnn.benchmark\nb = torch.zeros(1)\n"),
    ("a library call's assignment next to an assignment", "import torch.nn as nn\nc = nn.MSELoss()\nk = args.k\n"),
    ("a library name rebound", "import torch\na = torch.zeros(1)\ndef torch():\n    pass\n"),
]


@pytest.mark.parametrize("before,after", MOVES)
def test_reorder_moves_what_is_free(before: str, after: str) -> None:
    assert reorder(before) == after
    assert _same_normal_form(before, after)


@pytest.mark.parametrize("why,source", KEEPS, ids=[k[0] for k in KEEPS])
def test_reorder_keeps_what_is_not_free(why: str, source: str) -> None:
    assert reorder(source) == source, why


SCRIPT = _src('''
    import math
    import collections
    SCALE = 3
    OFFSET = 0.5
    log = []
    start = math.floor(OFFSET * 10)

    def combine(*, a, b, c=0.0):
        log.append((a, b, c))
        return a * SCALE + b - c

    def twice(v):
        return 2 * combine(a=v, b=OFFSET, c=math.pi)

    class Box:
        size = SCALE * 2
        def area(self, k=OFFSET):
            return self.size * k

    class Pair:
        first = OFFSET
        def total(self):
            return self.first + Box().area()

    def main():
        base = SCALE + 1
        step = OFFSET * 2
        out = [combine(c=step, a=base, b=SCALE), twice(base), Pair().total()]
        counts = collections.Counter(x > 1 for x in out)
        return out, sorted(counts.items()), list(log), start

    result = main()
''')


def test_reordered_script_computes_the_same() -> None:
    """What the transformation moves is free to move: a script that uses every kind of move computes
    the same values, and it did move something of each kind."""
    moved = reorder(SCRIPT)
    for first, second in (("import math", "import collections"), ("SCALE = 3", "OFFSET = 0.5"),
                          ("class Box", "class Pair"), ("def combine", "def twice"),
                          ("start = math.floor", "def combine"),
                          ("    base = SCALE + 1", "    step = OFFSET * 2")):
        assert SCRIPT.index(first) < SCRIPT.index(second) and moved.index(first) > moved.index(second)
    assert "combine(c=step, a=base, b=SCALE)" in SCRIPT and "combine(b=SCALE, a=base, c=step)" in moved
    ran, ran_moved = {}, {}
    exec(compile(SCRIPT, "<script>", "exec"), ran)
    exec(compile(moved, "<moved>", "exec"), ran_moved)
    assert ran["result"] == ran_moved["result"]


DIFFERENT = [
    ("dependent assignments", "a = 1\nb = a\n", "b = a\na = 1\n"),
    ("two calls", "print(1)\nprint(2)\n", "print(2)\nprint(1)\n"),
    ("a call and an assignment it reads", "x = 1\nprint(x)\n", "print(x)\nx = 1\n"),
    ("a script function's call and a def", "def f():\n    pass\nrun()\n", "run()\ndef f():\n    pass\n"),
    ("two keywords with effects", "f(a=g(), b=h())\n", "f(b=h(), a=g())\n"),
    ("dict's keywords", "d = dict(a=1, b=2)\n", "d = dict(b=2, a=1)\n"),
    ("an import and an assignment", "import os\nlr = 0.1\n", "lr = 0.1\nimport os\n"),
]


@pytest.mark.parametrize("why,a,b", DIFFERENT, ids=[d[0] for d in DIFFERENT])
def test_normal_form_keeps_orders_that_mean_something(why: str, a: str, b: str) -> None:
    """The normal form is no blanket sort: orders that change what runs stay different."""
    assert not _same_normal_form(a, b), why


SAME = [
    ("a library call and a def", "import torch\ntorch.manual_seed(0)\ndef f():\n    pass\n",
     "import torch\ndef f():\n    pass\ntorch.manual_seed(0)\n"),
    ("an effect-free keyword passes a call", "f(a=g(), b=1)\n", "f(b=1, a=g())\n"),
]


@pytest.mark.parametrize("why,a,b", SAME, ids=[s[0] for s in SAME])
def test_normal_form_lets_library_effects_pass_definitions(why: str, a: str, b: str) -> None:
    """distify places its own calls among the script's definitions by position (the process group is
    initialised before the first statement that runs): a library call cannot see the script's
    globals, so it commutes with a definition or assignment it does not mention."""
    assert _same_normal_form(a, b), why


# Every way a name is bound, and imports beside them: reordering._bound_names asks Python's symtable
# which names are bound by anything but an import (the sweep's hot spot with libcst's scope metadata).
BINDINGS = _src('''
    import os, os.path as c
    from math import y, z as w
    def f(p, /, q=1, *r, s, **t):
        global g
        g = 1
        h: int
        def inner():
            nonlocal h
            h = 2
        return [i for i in r if (j := i)], lambda u: u, {k: v for k, v in t.items()}
    class C(B, metaclass=M):
        attr = 1
        def m(self):
            return super().m()
    try:
        pass
    except E as e:
        pass
    with open(f) as (fh, gh):
        pass
    for a1, *a2 in x:
        pass
    x[0] = 1
    x.attr2 = 2
    aug += 1
    import os
    os = 3
''')


def _scope_metadata_bound_names(source: str) -> set:
    """The reference: what libcst's scope metadata calls an assignment other than an import."""
    import libcst as cst
    from libcst.metadata import Assignment, MetadataWrapper, ScopeProvider

    wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    out = set()
    for scope in set(wrapper.resolve(ScopeProvider).values()):
        if scope is not None:
            out |= {a.name for a in scope.assignments
                    if not (isinstance(a, Assignment) and isinstance(a.node, (cst.Import, cst.ImportFrom)))}
    return out


@pytest.mark.parametrize("case", ["bindings", "DST305/logging_basic_config", "scenarios/trainer_class",
                                  "corpus/hf_style_local"])
def test_bound_names_are_the_scope_metadatas(case: str) -> None:
    """symtable and libcst's scope metadata agree on the names bound other than by import (the
    comprehension's own `.0` argument aside), on every kind of binding and on fixtures; imports
    alone bind none (`c`, `w`, `y` above), an assignment of an imported name binds it (`os`)."""
    from reordering import _bound_names

    from test_fixtures import FIXTURES

    source = BINDINGS if case == "bindings" else (FIXTURES / f"{case}.in.py").read_text()
    got = {n for n in _bound_names(source) if n.isidentifier()}
    assert got == _scope_metadata_bound_names(source)
    if case == "bindings":
        assert {"c", "w", "y"}.isdisjoint(got) and {"os", "g", "h", "j", "u", "e", "fh", "a2", "aug", "attr"} <= got


def test_match_captures_and_del_are_bindings() -> None:
    """Where the two differ, symtable is Python's answer: a `match` capture binds its name, and `del`
    unbinds one, which makes it the script's own (libcst's scope metadata records neither; no fixture
    has either, so the sweep's cases are the same)."""
    from reordering import _bound_names

    source = "import os\ndel os\nmatch q:\n    case {'k': print, **rest} as whole:\n        pass\n"
    assert {"os", "print", "rest", "whole"} <= _bound_names(source)
    assert not {"os", "print", "rest", "whole"} & _scope_metadata_bound_names(source)
