"""No golden output reads a module-level name before the import that binds it (#14.2).

A rewrite that adds `dist.init_process_group(...)` above the import it needs fails with NameError
under plain python; every golden (fixtures/**/<case>.<backend>.py) is checked statically here: a
statement that runs at module level (function and class bodies run later and are not counted)
must not read a name whose first binding is an import further down. What the input already does
is not distify's doing and is not counted.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import List, Set, Tuple

import libcst as cst
import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _executed_reads(stmt: cst.CSTNode) -> Set[str]:
    """Names a top-level statement reads when it runs (not inside defs, classes or lambdas)."""
    found: Set[str] = set()

    class V(cst.CSTVisitor):
        def visit_FunctionDef(self, node):
            for d in node.decorators:
                d.visit(self)
            return False

        def visit_ClassDef(self, node):
            return False

        def visit_Lambda(self, node):
            return False

        def visit_Attribute(self, node):
            node.value.visit(self)
            return False

        def visit_Name(self, node):
            found.add(node.value)

        def visit_Import(self, node):
            return False

        def visit_ImportFrom(self, node):
            return False

    stmt.visit(V())
    return found


def _imported(stmt: cst.CSTNode) -> Set[str]:
    out: Set[str] = set()
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    if alias.asname is not None:
                        out.add(alias.asname.name.value)
                    elif isinstance(small, cst.Import):
                        out.add(cst.Module([]).code_for_node(alias.name).split(".")[0])
                    else:
                        out.add(cst.Module([]).code_for_node(alias.name))
    return out


def _bound(stmt: cst.CSTNode) -> Set[str]:
    """Names a top-level statement binds other than by import (assignments, defs, classes...)."""
    out: Set[str] = set()
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return {stmt.name.value}

    class V(cst.CSTVisitor):
        def visit_FunctionDef(self, node):
            return False

        def visit_ClassDef(self, node):
            return False

        def visit_AssignTarget(self, node):
            _names(node.target, out)

        def visit_AnnAssign(self, node):
            _names(node.target, out)

        def visit_For(self, node):
            _names(node.target, out)

        def visit_AsName(self, node):
            _names(node.name, out)

    stmt.visit(V())
    return out


def _names(target, out: Set[str]) -> None:
    if isinstance(target, cst.Name):
        out.add(target.value)
    elif isinstance(target, (cst.Tuple, cst.List)):
        for el in target.elements:
            _names(el.value, out)


def late_imports(source: str) -> List[Tuple[str, int]]:
    """(name, index of the statement reading it) for every module-level read of a name that is
    first bound by an import below that statement."""
    body = cst.parse_module(source).body
    first_import = {}
    bound_before: Set[str] = set()
    for i, stmt in enumerate(body):
        for name in _imported(stmt):
            if name not in bound_before and name not in first_import:
                first_import[name] = i
        bound_before |= _imported(stmt) | _bound(stmt)
    out = []
    for i, stmt in enumerate(body):
        for name in sorted(_executed_reads(stmt)):
            if first_import.get(name, -1) > i:
                out.append((name, i))
    return out


def goldens():
    for path in sorted(FIXTURES.rglob("*.py")):
        if path.name.endswith((".ddp.py", ".horovod.py", ".fsdp.py")):
            yield pytest.param(path, id=f"{path.parent.name}/{path.name}")


@functools.lru_cache(maxsize=None)
def _late_in(original: Path) -> frozenset:
    """The names `original` itself reads before their import: one parse for its three goldens."""
    return frozenset(name for name, _ in late_imports(original.read_text())) if original.exists() else frozenset()


@pytest.mark.parametrize("golden", list(goldens()))
def test_golden_binds_imports_before_use(golden: Path) -> None:
    stem = golden.name.rsplit(".", 2)[0]
    already = _late_in(golden.with_name(f"{stem}.in.py"))
    late = [(n, i) for n, i in late_imports(golden.read_text()) if n not in already]
    assert not late, f"{golden.name}: read before their import: {late}"


def test_the_check_sees_a_late_import() -> None:
    """Control: the shape #14.2 reported (setup above a mid-file import block) is caught."""
    source = (
        "import torch\n"
        "dist.init_process_group(**runtime.init_kwargs())\n"
        "x = 1\n"
        "import json\n"
        "import torch.distributed as dist\n"
        "from distify import runtime\n"
        "def f():\n    return textwrap\n"
        "import textwrap\n"
    )
    assert sorted(n for n, _ in late_imports(source)) == ["dist", "runtime"]
