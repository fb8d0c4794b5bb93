"""Deterministic corpus of training scripts for the throughput benchmark (P1).

Every ``fixtures/**/*.in.py`` is turned into several variants, each a combination of:

* consistent renaming of assigned variables (``model`` -> ``model_v2`` everywhere it is a Name,
  never an attribute, keyword or import);
* extra comment lines and blank lines before statements;
* the module-level script body wrapped into ``def main()`` + ``if __name__ == "__main__"``;
* duplicated helper functions (``def train`` -> an extra ``def train_copy1`` ...);
* changed integer constants.

Variants that do not compile fall back to a simpler one, so the corpus is always valid Python.
``python bench/corpus.py OUTDIR [--count N]`` writes it; the benchmarks call ``build()``.
"""

from __future__ import annotations

import glob
import keyword
import os
import random
import sys
from typing import Dict, List, Set

import libcst as cst

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import FIXTURES  # noqa: E402


def inputs() -> List[str]:
    return sorted(glob.glob(os.path.join(FIXTURES, "**", "*.in.py"), recursive=True))


class _Names(cst.CSTVisitor):
    """Names bound by assignments / for targets, and names that must not change."""

    def __init__(self) -> None:
        self.assigned: Set[str] = set()
        self.protected: Set[str] = set()

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._targets(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._targets(node.target)

    def _targets(self, t: cst.BaseExpression) -> None:
        if isinstance(t, cst.Name):
            self.assigned.add(t.value)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for el in t.elements:
                self._targets(el.value)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:  # f(model=...) : the callee's parameter name
            self.protected.add(node.keyword.value)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        for n in (node.asname.name if node.asname else None, node.name):
            if isinstance(n, cst.Name):
                self.protected.add(n.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.protected.add(node.attr.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.protected.add(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.protected.add(node.name.value)


class _Rename(cst.CSTTransformer):
    def __init__(self, mapping: Dict[str, str]) -> None:
        self.mapping = mapping

    def leave_Attribute(self, original, updated):  # keep .attr as it was
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original, updated):  # keep keyword= as it was
        return updated.with_changes(keyword=original.keyword)

    def leave_ImportAlias(self, original, updated):
        return original

    def leave_Name(self, original, updated):
        new = self.mapping.get(original.value)
        return updated.with_changes(value=new) if new else updated


class _Comments(cst.CSTTransformer):
    def __init__(self, rng: random.Random, k: int) -> None:
        self.rng, self.k = rng, k

    def _decorate(self, node):
        if self.rng.random() < 0.35:
            lines = list(node.leading_lines)
            if self.rng.random() < 0.5:
                lines.append(cst.EmptyLine(indent=False))
            lines.append(cst.EmptyLine(comment=cst.Comment(f"# bench variant {self.k}: note {self.rng.randrange(1000)}")))
            return node.with_changes(leading_lines=lines)
        return node

    def leave_SimpleStatementLine(self, original, updated):
        return self._decorate(updated)

    def leave_For(self, original, updated):
        return self._decorate(updated)

    def leave_If(self, original, updated):
        return self._decorate(updated)


class _Constants(cst.CSTTransformer):
    def __init__(self, k: int) -> None:
        self.k = k

    def leave_Integer(self, original, updated):
        v = original.value
        if v.isdigit() and int(v) >= 2:
            return updated.with_changes(value=str(int(v) + self.k))
        return updated


def _is_main_guard(stmt) -> bool:
    return isinstance(stmt, cst.If) and "__name__" in cst.Module([]).code_for_node(stmt.test)


def _wrap_in_main(module: cst.Module, k: int) -> cst.Module:
    """Module-level script body -> def main(); leave imports, defs, classes and docstrings."""
    if any(isinstance(s, cst.FunctionDef) and s.name.value == "main" for s in module.body):
        return module
    if any(_is_main_guard(s) for s in module.body):
        return module
    head, body, defs = [], [], []
    for i, s in enumerate(module.body):
        is_import = isinstance(s, cst.SimpleStatementLine) and all(
            isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)
        is_doc = i == 0 and isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Expr) \
            and isinstance(s.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
        if is_import or is_doc:
            (head if not body else body).append(s)
        elif isinstance(s, (cst.FunctionDef, cst.ClassDef)):
            defs.append(s)
        else:
            body.append(s)
    if len(body) < 3:
        return module
    main = cst.FunctionDef(
        name=cst.Name("main"), params=cst.Parameters(),
        body=cst.IndentedBlock(body=body),
        leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
    )
    guard = cst.parse_statement('if __name__ == "__main__":\n    main()\n')
    guard = guard.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    return module.with_changes(body=head + defs + [main, guard])


def _duplicate_helpers(module: cst.Module, k: int) -> cst.Module:
    helpers = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value != "main"]
    if not helpers:
        return module
    copies = [h.with_changes(name=cst.Name(f"{h.name.value}_copy{k}"),
                             leading_lines=[cst.EmptyLine(), cst.EmptyLine()]) for h in helpers]
    body = list(module.body)
    at = next((i for i, s in enumerate(body) if _is_main_guard(s)), len(body))
    return module.with_changes(body=body[:at] + copies + body[at:])


def variant(src: str, k: int, seed: int = 0) -> str:
    """Variant k of one script (k = 0 is the script itself, unchanged)."""
    if k == 0:
        return src
    rng = random.Random(f"{seed}:{k}:{len(src)}")
    module = cst.parse_module(src)
    steps = []
    names = _Names()
    module.visit(names)
    candidates = sorted(n for n in names.assigned - names.protected
                        if not n.startswith("_") and not keyword.iskeyword(n) and n not in dir(__builtins__))
    if candidates:
        picked = rng.sample(candidates, max(1, len(candidates) // 2))
        steps.append(_Rename({n: f"{n}_v{k}" for n in picked}))
    steps.append(_Comments(rng, k))
    if k % 2 == 0:
        steps.append(_Constants(k))
    for step in steps:
        module = module.visit(step)
    if k % 3 == 1:
        module = _wrap_in_main(module, k)
    if k % 3 != 0:
        module = _duplicate_helpers(module, k)
    out = module.code
    try:
        compile(out, "<variant>", "exec", dont_inherit=True)
    except SyntaxError:
        return variant(src, k - 1, seed) if k > 1 else src
    return out


def build(outdir: str, count: int = 240, max_inputs: int = 0) -> List[str]:
    """Write >= `count` variants into `outdir`; returns their paths."""
    srcs = inputs()
    if max_inputs:
        srcs = srcs[:max_inputs]
    os.makedirs(outdir, exist_ok=True)
    per = -(-count // len(srcs))  # ceil
    paths = []
    for i, path in enumerate(srcs):
        with open(path, encoding="utf-8") as f:
            src = f.read()
        stem = os.path.basename(path)[: -len(".in.py")]
        group = os.path.basename(os.path.dirname(path))
        for k in range(1, per + 1):
            out = os.path.join(outdir, f"f{i:03d}_{group}_{stem}_v{k}.py")
            with open(out, "w", encoding="utf-8") as f:
                f.write(variant(src, k))
            paths.append(out)
    return paths


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--count", type=int, default=240)
    a = ap.parse_args()
    ps = build(a.outdir, a.count)
    print(f"{len(ps)} files, {sum(os.path.getsize(p) for p in ps)} bytes -> {a.outdir}")
