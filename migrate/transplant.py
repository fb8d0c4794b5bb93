"""An expression read in one scope, spelled so that it reads the same value in another.

A rule that finds a value in one function and writes it where another statement lives must not copy
the text: ``accumulation_steps`` in ``train(model, loader, optimizer, accumulation_steps)`` is a
parameter, and in ``main``, where the optimizer is built and wrapped, the same value is
``args.accumulation_steps``, the argument ``main`` passes. ``spell_in`` follows each name the
expression reads to what it is where the new statement goes:

- a name of the same scope stays (``readable_after`` then says whether it is bound before the
  statement the rule writes);
- ``self`` stays ``self`` between two methods of one class (the target's own first parameter);
- a parameter of the function the expression is in becomes the argument the caller in the target
  scope passes (the one call there; the parameter's literal default when that call passes none);
- a module-level name stays when the target scope does not bind the same name itself;
- anything else (a local of another function, a call that passes it through ``*args``, several
  calls passing different values) gives None: the value is not readable there, and the rule must
  do something else than write it.
"""

from __future__ import annotations

import builtins
from typing import Dict, Optional

import libcst as cst

from distify.syntax import names


def spell_in(a, expr: cst.BaseExpression, where: cst.CSTNode, target) -> Optional[cst.BaseExpression]:
    """``expr``, read by the statement ``where``, spelled for the scope ``target`` (a function or
    the module), or None when some name it reads has no value there. ``a``: the anatomy."""
    home = a.stmt_scope.get(where)
    if home is None:
        return None
    reads = [name for name, how in names(expr) if how == "load"]
    values: Dict[str, cst.BaseExpression] = {}
    for name in reads:
        if name.value not in values:
            value = _value_at(a, name.value, home, target)
            if value is None:
                return None
            values[name.value] = value
    if all(isinstance(v, cst.Name) and v.value == k for k, v in values.items()):
        return expr
    return expr.visit(_Rename({id(n): values[n.value] for n in reads}))


def readable_after(a, expr: cst.BaseExpression, stmt: cst.CSTNode) -> bool:
    """Every name ``expr`` reads is bound for a statement inserted after ``stmt``: before it (or by
    it) in its scope, a parameter of its function, in an enclosing function, at module level, or a
    builtin."""
    scope = a.stmt_scope.get(stmt)
    return scope is not None and all(_readable(a, n.value, scope, stmt) for n, how in names(expr) if how == "load")


def _value_at(a, n: str, home, target) -> Optional[cst.BaseExpression]:
    if home is target:
        return cst.Name(n)
    cls = a.methods.get(home) if isinstance(home, cst.FunctionDef) else None
    if cls is not None and a.methods.get(target) is cls and home.params.params and target.params.params \
            and n == home.params.params[0].name.value:
        return cst.Name(target.params.params[0].name.value)  # `self` of two methods of one class
    if isinstance(home, cst.FunctionDef) and n in _params(home):
        spelled = set()
        found = None
        for call in a.facts.callers(home):
            if call.scope is not target:
                continue
            if any(x.star for x in call.call.args):
                return None
            value = a.facts.bound_value(call.call, home, n)
            if value is None:
                value = _literal_default(home, n)
            if value is None:
                return None
            spelled.add(a.module.code_for_node(value))
            found = value
        return found if len(spelled) == 1 else None
    if n in a.bindings(home):
        return None  # a local of the other function
    if isinstance(target, cst.FunctionDef) and (n in a.bindings(target) or n in _params(target)):
        return None  # the target scope has a name of its own spelled alike
    return cst.Name(n)


def _params(fn: cst.FunctionDef) -> list:
    return [p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)]


def _literal_default(fn: cst.FunctionDef, n: str) -> Optional[cst.BaseExpression]:
    for p in (*fn.params.params, *fn.params.kwonly_params):
        if p.name.value == n and isinstance(p.default, (cst.Integer, cst.Float)):
            return p.default
    return None


def _readable(a, n: str, scope, stmt) -> bool:
    if isinstance(scope, cst.FunctionDef) and n in _params(scope):
        return True
    if n in a.bindings(scope):
        # bound before the statement, or by it (the new statement goes after it)
        return a.reaching_binding(scope, n, stmt) is not None or any(b.stmt is stmt for b in a.bindings(scope)[n])
    here = a.stmt_scope.get(scope) if isinstance(scope, cst.FunctionDef) else None
    while isinstance(here, cst.FunctionDef):  # a closure reads its enclosing function's names
        if n in a.bindings(here) or n in _params(here):
            return True
        here = a.stmt_scope.get(here)
    return n in a.bindings(a.module) or hasattr(builtins, n)


class _Rename(cst.CSTTransformer):
    """The variable reads found by ``names`` (by identity) replaced by their values."""

    def __init__(self, values: Dict[int, cst.BaseExpression]) -> None:
        super().__init__()
        self.values = values

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        value = self.values.get(id(original))
        if value is None or isinstance(value, cst.Name) and value.value == original.value:
            return updated
        if isinstance(value, (cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.Call, cst.Subscript)):
            return value
        return value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


__all__ = ["readable_after", "spell_in"]
