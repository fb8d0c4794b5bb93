"""Which names of a scope may hold a given module: the data flow the model-state facts follow.

A script hands its model to an initialiser, a load or a freeze under names of its own:

- an alias, ``g = gen`` then ``g.apply(init)`` (also ``a, b = gen, disc``);
- a loop over a container that holds it, ``for n in [gen, disc]: n.apply(init)``, also through a
  name bound to the container (``nets = [gen, disc]``), a dict's ``.values()`` / ``.items()`` and
  ``enumerate``;
- a parameter of the script's own function, bound to the module or to a container of it
  (``init_all([gen, disc])`` with ``for m in models: m.apply(init)``), also a ``*models``
  parameter (``init_all(gen, disc)``) and a container spread into the call (``init_all(*nets)``);
- a module container of the library (``nn.ModuleList([gen, disc])``, ``nn.ModuleDict``: a row of
  ``distify.library`` of kind ``container``), which holds the modules themselves, so that a change of
  the container (``nets.apply(init)``) changes them; items added to a container by name
  (``nets.append(gen)``, ``extend``, ``nets += [gen]``, ``nets['g'] = gen``).

``Refs`` answers, for one scope, which of the *labels* (the names the caller asked about, as the
caller's scope spells them) an expression may hold. It over-approximates on purpose: a binding of
an alias counts from where it is written on (a later rebinding to something else is not subtracted),
so a change seen through an alias moves the wrap or the broadcast later, never earlier – a wrap
later than needed is harmless, one before a change trains a different model on every rank.

Read-only, over ``distify.facts.Facts``; ``distify.model_state`` asks it.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Mapping, Optional, Tuple

import libcst as cst

from distify.facts import same_object  # `g = gen.to(device)` is an alias of gen
from distify.syntax import Scope, dotted


Labels = FrozenSet[str]
# name -> [(order of the binding, labels)]: what the name may hold from that statement on
_Flow = Dict[str, List[Tuple[int, Labels]]]


class Refs:
    """The names of `scope` that may hold the modules `named` gives (name -> labels) or a container
    of them (`held`, name -> labels), followed through the scope's aliases and loops."""

    def __init__(self, facts, scope: Scope, named: Mapping[str, Labels], held: Mapping[str, Labels] = {}, qualname=None) -> None:
        self.facts = facts
        self._container = _containers(qualname)
        key = ("model_refs", id(scope), tuple(sorted(named.items())), tuple(sorted(held.items())))
        self._named, self._held = facts.memo(key, lambda: _flow(facts, scope, named, held, self._container))

    def roots_of(self, expr: Optional[cst.CSTNode], upto: int) -> Labels:
        """The labels `expr` may hold (also as a submodule of them, `g.fc`; a library container of
        them, ``nn.ModuleList([g, d])``), reading the bindings written up to statement order `upto`."""
        return _roots(self._named, expr, upto, self._held, self._container)

    def held_by(self, expr: Optional[cst.CSTNode], upto: int) -> Labels:
        """The labels a container `expr` may hold as items: a list, tuple or set display of them, a
        dict display's values, a library container of them, a name bound to one, and ``.values()``
        of a dict."""
        return _held(self._named, self._held, expr, upto, self._container)

    def attributes(self, instance: str, upto: int, held: bool) -> Dict[str, Labels]:
        """The attributes of `instance` (``self.gen``, ``self.nets``) that may hold the labels
        (`held`: as items of a container) from the bindings up to statement order `upto`."""
        flow = self._held if held else self._named
        out = {}
        for name in flow:
            if name.startswith(instance + "."):
                got = _at(flow, name, upto)
                if got:
                    out[name] = got
        return out


def _at(flow: _Flow, name: str, upto: int) -> Labels:
    out: set = set()
    for order, labels in flow.get(name, ()):
        if order <= upto:
            out |= labels
    return frozenset(out)


def _containers(qualname):
    """Whether a call builds a library container of modules (``nn.ModuleList(...)``), by its row."""
    if qualname is None:
        return lambda call: False
    from distify.library import known

    def container(call) -> bool:
        row = known(qualname(call.func))
        return row is not None and row.kind == "container"

    return container


def _roots(named: _Flow, expr, upto: int, held: _Flow = {}, container=None) -> Labels:
    expr = same_object(expr)
    if isinstance(expr, cst.Call) and container is not None and container(expr) and expr.args:
        # nn.ModuleList([gen, disc]) holds the modules themselves: changing it changes them
        return _held(named, held, expr.args[0].value, upto, container)
    d = dotted(expr) if expr is not None else None
    if d is None:
        return frozenset()
    out: set = set()
    parts = d.split(".")
    for i in range(1, len(parts) + 1):
        out |= _at(named, ".".join(parts[:i]), upto)
    return frozenset(out)


def _held(named: _Flow, held: _Flow, expr, upto: int, container=None) -> Labels:
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        out: set = set()
        for el in expr.elements:
            out |= (
                _held(named, held, el.value, upto, container) if isinstance(el, cst.StarredElement)
                else _roots(named, el.value, upto, held, container)
            )
        return frozenset(out)
    if isinstance(expr, cst.Dict):
        out = set()
        for el in expr.elements:
            if isinstance(el, cst.DictElement):
                out |= _roots(named, el.value, upto, held, container)
            else:
                out |= _held(named, held, el.value, upto, container)
        return frozenset(out)
    if isinstance(expr, cst.Call) and container is not None and container(expr):
        return _held(named, held, expr.args[0].value, upto, container) if expr.args else frozenset()
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "values"
        and not expr.args
    ):
        return _held(named, held, expr.func.value, upto, container)
    d = dotted(expr) if expr is not None else None
    return _at(held, d, upto) if d is not None else frozenset()


def _flow(facts, scope: Scope, named: Mapping[str, Labels], held: Mapping[str, Labels], container=None) -> Tuple[_Flow, _Flow]:
    """Walk the scope's statements in source order: each alias and loop variable gets the labels
    its value may hold, from its binding on."""
    n: _Flow = {k: [(-1, frozenset(v))] for k, v in named.items()}
    h: _Flow = {k: [(-1, frozenset(v))] for k, v in held.items()}

    def bind(flow: _Flow, target: cst.CSTNode, labels: Labels, order: int) -> None:
        name = dotted(target)
        if name is not None and labels:
            flow.setdefault(name, []).append((order, labels))

    for stmt in facts.statements(scope):
        at = facts.order(stmt)
        if type(stmt) is cst.SimpleStatementLine:
            for small in stmt.body:
                if type(small) is cst.Expr and type(small.value) is cst.Call:
                    _added(n, h, small.value, at, container, bind)
                elif isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.AddAssign):
                    bind(h, small.target, _held(n, h, small.value, at, container), at)  # nets += [gen]
                if type(small) is not cst.Assign:
                    continue
                for t in small.targets:
                    if isinstance(t.target, cst.Subscript):  # nets["gen"] = gen
                        bind(h, t.target.value, _roots(n, small.value, at, h, container), at)
                        continue
                    for target, value in _pairs(t.target, small.value):
                        bind(n, target, _roots(n, value, at, h, container), at)
                        bind(h, target, _held(n, h, value, at, container), at)
        elif type(stmt) is cst.For:
            target, it = stmt.target, stmt.iter
            if isinstance(it, cst.Call) and dotted(it.func) == "enumerate" and it.args and isinstance(target, cst.Tuple):
                # for i, net in enumerate(nets)
                if len(target.elements) == 2:
                    target, it = target.elements[1].value, it.args[0].value
            elif (
                isinstance(it, cst.Call)
                and isinstance(it.func, cst.Attribute)
                and it.func.attr.value == "items"
                and isinstance(target, cst.Tuple)
                and len(target.elements) == 2
            ):
                # for name, net in nets.items()
                target, it = target.elements[1].value, it.func.value
            bind(n, target, _held(n, h, it, at, container), at)
    return n, h


def _added(n: _Flow, h: _Flow, call: cst.Call, at: int, container, bind) -> None:
    """``nets.append(gen)`` / ``nets.insert(0, gen)`` / ``nets.add(gen)`` / ``nets.extend([gen])``:
    the container named `nets` holds what is added, from this statement on."""
    f = call.func
    if not isinstance(f, cst.Attribute) or not call.args:
        return
    verb = f.attr.value
    if verb in ("append", "add"):
        bind(h, f.value, _roots(n, call.args[0].value, at, h, container), at)
    elif verb == "insert" and len(call.args) == 2:
        bind(h, f.value, _roots(n, call.args[1].value, at, h, container), at)
    elif verb in ("extend", "update"):
        bind(h, f.value, _held(n, h, call.args[0].value, at, container), at)


def _pairs(target: cst.BaseExpression, value: cst.BaseExpression):
    """(target, value) of an assignment, element-wise for `a, b = x, y`."""
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        if len(target.elements) == len(value.elements) and not any(
            isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements)
        ):
            for t, v in zip(target.elements, value.elements):
                yield from _pairs(t.value, v.value)
        return
    yield target, value
