"""What a checkpoint pickles whole: the values ``torch.save`` is handed inside a container, followed by
data flow (the image-captioning tutorial's ``state = {'encoder': encoder, ...}; torch.save(state, path)``).

``torch.save(obj, path)`` pickles every object reachable from `obj`; a module among the values of a
dict, list or tuple is pickled as the object itself (a DDP wrapper with its process group, an FSDP
module with this rank's shards, Horovod's ``DistributedOptimizer`` whose class cannot be pickled).
The values are found where the container is written:

- a display handed to ``torch.save`` itself, ``torch.save({'encoder': encoder}, path)``;
- a name bound to a display (``dict(...)`` too), followed to its bindings in the scope before the
  save, and the items written into it: ``state['model'] = model``, ``state.update(model=model)``;
- a parameter of the script's own function that pickles it (``save_checkpoint(state, path)``), the
  container or value its caller passes, through as many calls as the script makes (``pickled_params``).

Each answer is a ``Pickled``: the expression (as written, where an edit may replace it), the
statement that evaluates it, and the container's name when the container is also read back in the
scope (``state['encoder'](x)``, ``for m in state.values()``), where the value is more than saved.

Read-only, over the anatomy and its ``Facts``; DST102 (unwrap), DST925 (FSDP) and DST111 (Horovod)
ask it.
"""

from __future__ import annotations

from typing import FrozenSet, List, Optional, Tuple

import libcst as cst

from distify.names import qualified
from distify.syntax import dotted
from distify.values import Value

_DEPTH = 4  # containers inside containers, names bound to names


class Pickled(Value):
    """One value a save pickles whole."""

    __slots__ = ("stmt", "expr", "read_back", "into")
    stmt: cst.CSTNode  # the statement evaluating `expr`
    expr: cst.BaseExpression  # the value as written (a display's member, an argument of a helper)
    read_back: Optional[cst.CSTNode]  # a read of its container that gets the value out again
    into: Optional[Tuple[cst.FunctionDef, str]]  # an argument: the script's function and parameter it binds

    def __init__(self, stmt: cst.CSTNode, expr: cst.BaseExpression, read_back: Optional[cst.CSTNode] = None,
                 into: Optional[Tuple[cst.FunctionDef, str]] = None) -> None:
        self._set(stmt, expr, read_back, into)


def pickled(a, site) -> List[Pickled]:
    """The values the call `site` pickles whole inside a container, or, for a call of the script's
    own function, the arguments it pickles (whole or inside a container); a bare ``torch.save(model,
    path)`` is not listed (``meaning.copies_argument`` says that one)."""
    return a.facts.memo(("pickled", id(site.call)), lambda: _pickled(a, site))


def _pickled(a, site) -> List[Pickled]:
    if site.qualname == "torch.save":
        value = _saved(site.call)
        return _inside(a, site.scope, site.stmt, value, _DEPTH) if value is not None else []
    fn = a.callee(site.call, site.scope)
    if fn is None:
        return []
    return passed(a, site, fn, pickled_params(a, fn))


def passed(a, site, fn, params) -> List[Pickled]:
    """The arguments `site` passes for `params` of `fn` (each pickled there whole), and what they
    hold when they are containers."""
    out: List[Pickled] = []
    for p in params:
        v = a.bound_value(site.call, fn, p)
        if v is None:
            continue
        out.append(Pickled(site.stmt, v, into=(fn, p)))
        out.extend(_inside(a, site.scope, site.stmt, v, _DEPTH))
    return out


def pickled_params(a, fn: cst.FunctionDef) -> FrozenSet[str]:
    """The parameters of `fn` whose value a save in its body (or in a function of the module it
    calls) pickles whole: ``torch.save(state, path)`` with `state` a parameter, or a parameter put in
    the container saved (``state = {'encoder': encoder}``)."""
    return a.facts.memo(("pickled_params", id(fn)), lambda: _pickled_params(a, fn))


def _pickled_params(a, fn) -> FrozenSet[str]:
    a.facts._memo[("pickled_params", id(fn))] = frozenset()  # a function calling itself
    params = set(a.facts.params(fn)) | {p.name.value for p in fn.params.kwonly_params}
    found = set()
    for site in a.calls:
        if site.scope is not fn:
            continue
        values = [p.expr for p in pickled(a, site)]
        if site.qualname == "torch.save":
            saved = _saved(site.call)
            if saved is not None:
                values.append(saved)
        for v in values:
            d = dotted(v)
            if d in params and a.reaching_binding(fn, d, site.stmt) is None:  # still the argument
                found.add(d)
    return frozenset(found)


def _saved(call: cst.Call) -> Optional[cst.BaseExpression]:
    for i, x in enumerate(call.args):
        if (x.keyword is None and i == 0 and not x.star) or (x.keyword is not None and x.keyword.value == "obj"):
            return x.value
    return None


def _inside(a, scope, stmt, value, depth: int, read_back=None) -> List[Pickled]:
    """The values the container `value` (evaluated at `stmt`) holds, each pickled with it."""
    if depth <= 0 or value is None:
        return []
    out: List[Pickled] = []

    def member(v):
        out.append(Pickled(stmt, v, read_back))
        out.extend(_inside(a, scope, stmt, v, depth - 1, read_back))

    if isinstance(value, cst.Dict):
        for el in value.elements:
            if isinstance(el, cst.DictElement):
                member(el.value)
            else:  # {**other}
                out.extend(_inside(a, scope, stmt, el.value, depth - 1, read_back))
    elif isinstance(value, (cst.List, cst.Tuple, cst.Set)):
        for el in value.elements:
            if isinstance(el, cst.StarredElement):
                out.extend(_inside(a, scope, stmt, el.value, depth - 1, read_back))
            else:
                member(el.value)
    elif isinstance(value, cst.Call) and qualified(a.aliases, value.func, a.name_bindings) == "builtins.dict":
        for x in value.args:
            if x.keyword is not None:
                member(x.value)
            else:
                out.extend(_inside(a, scope, stmt, x.value, depth - 1, read_back))
    elif isinstance(value, cst.Name):
        out.extend(_named(a, scope, stmt, value.value, depth))
    return out


def _named(a, scope, stmt, name: str, depth: int) -> List[Pickled]:
    """What the container bound to `name` in `scope` holds when `stmt` saves it: the displays it is
    bound to before `stmt`, the items written into it, the arguments of its ``update``."""
    at = a.facts.order(stmt)
    writes = [w for w in _container_writes(a).get((id(scope), name), ()) if a.facts.order(w[1]) < at]
    if all(kind == "bound" and not _may_hold(a, value) for kind, _s, value in writes):
        return []  # bound only to values that hold nothing _inside follows: no read to look for
    back = read_back(a, scope, name)
    out: List[Pickled] = []
    for kind, s, value in writes:
        if kind == "bound":
            out.extend(_inside(a, scope, s, value, depth - 1, back))
        elif kind == "item":
            out.append(Pickled(s, value, back))
            out.extend(_inside(a, scope, s, value, depth - 1, back))
        else:  # the arguments of name.update(...)
            for x in value:
                if x.keyword is not None:
                    out.append(Pickled(s, x.value, back))
                out.extend(_inside(a, scope, s, x.value, depth - 1, back))
    return out


def _may_hold(a, value) -> bool:
    """`value` is a shape `_inside` looks into (a display, ``dict(...)``, another name)."""
    return isinstance(value, (cst.Dict, cst.List, cst.Tuple, cst.Set, cst.Name)) or (
        isinstance(value, cst.Call) and qualified(a.aliases, value.func, a.name_bindings) == "builtins.dict")


def _container_writes(a):
    """(id(scope), name) -> [(kind, statement, value)] in source order, for every name of the module:
    "bound" (``name = value``), "item" (``name[k] = value``), "update" (``name.update(args)``, the
    value its arguments); once per analysis, so that asking what a container holds is not a scan
    of every assignment and call of the module each time."""

    def index():
        out = {}
        for assign, s, sc, _cls in a.facts.assigns:
            for t in assign.targets:
                target = t.target
                if isinstance(target, cst.Name):
                    out.setdefault((id(sc), target.value), []).append(("bound", s, assign.value))
                elif isinstance(target, cst.Subscript):
                    base = dotted(target.value)
                    if base is not None:
                        out.setdefault((id(sc), base), []).append(("item", s, assign.value))
        for site in a.calls:
            f = site.call.func
            if isinstance(f, cst.Attribute) and f.attr.value == "update":
                base = dotted(f.value)
                if base is not None:
                    out.setdefault((id(site.scope), base), []).append(("update", site.stmt, site.call.args))
        return out

    return a.facts.memo(("container_writes",), index)


def read_back(a, scope, name: str) -> Optional[cst.CSTNode]:
    """The first read of the container `name` in `scope` that takes a value out of it again: a
    subscript that is no assignment target, ``.values()`` / ``.items()`` / ``.get()`` / ``.pop()``,
    a loop or an unpacking over it. Handing it whole to a call (a save, a helper) is no such read."""
    return a.facts.memo(("read_back", id(scope), name), lambda: _read_back(a, scope, name))


def _read_back(a, scope, name: str) -> Optional[cst.CSTNode]:
    for node, parents, _nested in a.facts.uses(scope, name):
        if not isinstance(node, cst.Name) or not parents:
            continue
        parent = parents[-1]
        if isinstance(parent, cst.Subscript) and parent.value is node:
            if not (len(parents) > 1 and isinstance(parents[-2], cst.AssignTarget)):
                return parent
        elif isinstance(parent, cst.Attribute) and parent.value is node:
            if parent.attr.value in ("values", "items", "get", "pop", "popitem", "setdefault", "__getitem__"):
                return parent
        elif isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is node:
            return parent
        elif isinstance(parent, cst.Assign) and parent.value is node:
            return parent  # an alias of the container, or an unpacking of it
        elif isinstance(parent, (cst.StarredElement, cst.StarredDictElement)):
            return parent
    return None


def pickled_elsewhere(a, site, path: Optional[str], options) -> List[Pickled]:
    """For a call of a function in another module of the project (sgrvinod's ``save_checkpoint``
    in ``utils.py``): the arguments it pickles whole there, and what they hold. The program model is
    asked only for a call no function of this module answers: the caller asks only for a call
    handed a value it cares about."""
    if not path or site.qualname == "torch.save" or a.callee(site.call, site.scope) is not None:
        return []
    from distify.program import program_of, reached  # here: most files never ask

    t = reached(a, path, options, site).target
    if t is None:
        return []
    params = pickled_params(t.unit.anatomy, t.fn)
    if not params:
        return []
    bound = program_of(a).bind(t, site.call)
    out: List[Pickled] = []
    for p in sorted(params):
        v = bound.get(p)
        if v is not None:
            out.append(Pickled(site.stmt, v))
            out.extend(_inside(a, site.scope, site.stmt, v, _DEPTH))
    return out


def handed(a, site) -> List[cst.BaseExpression]:
    """The values `site` is handed: its arguments and, for a container, what it holds (the values a
    helper may pickle; ``pickled_elsewhere`` is asked only when one of them matters)."""
    return a.facts.memo(("handed", id(site.call)), lambda: _handed(a, site))


def _handed(a, site) -> List[cst.BaseExpression]:
    out: List[cst.BaseExpression] = []
    for x in site.call.args:
        out.append(x.value)
        out.extend(p.expr for p in _inside(a, site.scope, site.stmt, x.value, _DEPTH))
    return out


def saved_whole(a, names, path: Optional[str], options):
    """(call site, expression, key) for each value a save pickles whole (``torch.save(x, ...)``
    itself too) that is one of `names`, keyed as ``(id(scope), dotted name)``: optimizers in the
    checkpoint dict, through names and helpers as ``pickled`` follows them."""
    for site in a.calls:
        found = [p.expr for p in pickled(a, site)]
        if site.qualname == "torch.save":
            saved = _saved(site.call)
            if saved is not None:
                found.append(saved)
        elif not found and any((id(site.scope), dotted(v)) in names for v in handed(a, site)):
            found = [p.expr for p in pickled_elsewhere(a, site, path, options)]
        for expr in found:
            key = (id(site.scope), dotted(expr))
            if key in names:
                yield site, expr, key
