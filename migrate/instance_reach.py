"""Where code outside a class reaches an attribute of its instances (``trainer.model``).

A class that builds its model itself (``self.model = nn.Sequential(...)`` in ``__init__``) is
reached from outside through its instances: ``trainer = Trainer(loader, lr=1e-3)`` and then
``torch.save(trainer.model.state_dict(), path)``. Inside the class every method spells the
attribute on its own instance parameter (``distify.instance``); outside, the attribute is spelled
on whatever name holds an instance: the name a construction of the class is bound to, a function's
parameter that name is handed to, an alias, an attribute of another class's instance it is kept
in (``self.trainer = trainer``), a global read by a function. The attribute's own value flows on
from there as any value does (``net = trainer.model``, ``evaluate(trainer.model)``).

Decided by what the names are (a call the module's class table resolves to the class, the
anatomy's data flow), never by how they are spelled. Read-only, over the anatomy; ``rules.base``'s
``reaching_scopes`` asks it, so every rule that follows the wrapped model follows it here too.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from distify.dataflow import return_slot
from distify.facts import keeps_object, same_object
from distify.instance import instance_name
from distify.records import assigned_name
from distify.syntax import Scope, dotted

# (scope, dotted name, the statement uses must follow or None, sure): `sure` when the name holds an
# instance of the class built by a construction of it on every path from that statement on
Reach = Tuple[Scope, str, Optional[cst.CSTNode], bool]

_BRANCHING = (cst.If, cst.For, cst.While, cst.Try)


def built_in_init(a, scope: Scope, stmt: cst.CSTNode, cls: cst.ClassDef) -> bool:
    """`stmt` runs on every construction of `cls`: it sits in the class's own ``__init__``, under
    no ``if``, loop or ``try`` there."""
    return (
        isinstance(scope, cst.FunctionDef)
        and a.methods.get(scope) is cls
        and scope.name.value == "__init__"
        and not any(isinstance(p, _BRANCHING) for p in a.stmt_parent.get(stmt, ()))
    )


def constructs(a, call: cst.Call, cls: cst.ClassDef) -> bool:
    """`call` builds an instance of `cls` (the module's own class the callee names)."""
    return a.classes.named(dotted(call.func)) is cls


def _holds_only(a, scope: Scope, name: str, cls: cst.ClassDef, attr: str) -> bool:
    """Every binding of `name` in `scope` builds an instance of `cls`, and `scope` never rebinds
    the attribute `name.attr` to another object."""
    for stmt in a.rebindings(scope, name):
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if not (
            isinstance(small, cst.Assign) and len(small.targets) == 1
            and isinstance(small.value, cst.Call) and constructs(a, small.value, cls)
        ):
            return False
    return all(keeps_object(s, f"{name}.{attr}") for s in a.rebindings(scope, f"{name}.{attr}"))


def holders(a, cls: cst.ClassDef, attr: str) -> List[Reach]:
    """The names outside `cls`'s own methods that may hold an instance of `cls`, with where they
    start to hold it (see ``Reach``; `attr` only decides `sure`)."""
    facts, flow = a.facts, getattr(a, "flow_from", None)
    out: List[Reach] = []
    seen = set()

    def add(scope, name, since, sure) -> None:
        if (id(scope), name) in seen:
            return
        seen.add((id(scope), name))
        inst = facts.instance(scope)
        if inst is not None and inst[1] is cls and name.split(".")[0] == inst[0]:
            return  # the class's own instance: its methods' spellings are the class's own facts
        out.append((scope, name, since, sure))

    for c in a.calls:
        if not constructs(a, c.call, cls):
            continue
        name = assigned_name(c.stmt, c.call)
        if name is None:
            continue
        if facts.instance_attr(c.scope, name) is not None:
            # `self.trainer = Trainer(...)` in a method of another class: every method of it
            for m in a.methods:
                there = facts.respell(name, c.scope, m)
                if there is not None:
                    add(m, there, c.stmt if m is c.scope else None, False)
            continue
        add(c.scope, name, c.stmt, _holds_only(a, c.scope, name, cls, attr))
        if isinstance(c.scope, cst.Module):  # a global: the functions that read it
            for fn in a.all_functions():
                if not facts.local_to(fn, name):
                    add(fn, name, None, False)
        if flow is not None:  # handed to a function, aliased, kept on another instance, returned
            for scope, there in flow(c.scope, name):
                add(scope, there, None, False)
    return out


def attribute_reach(a, cls: cst.ClassDef, attr: str) -> List[Reach]:
    """Where code outside `cls` reaches the attribute `attr` (dotted, on the instance: ``model``)
    of an instance of `cls`: ``<holder>.<attr>`` for every holder (see `holders`), and the names
    that value flows to from there (an alias ``net = trainer.model``, a parameter it is handed to),
    which are never `sure`."""
    flow = getattr(a, "flow_from", None)
    out: List[Reach] = []
    seen = set()
    found = holders(a, cls, attr)
    reached = [(scope, f"{holder}.{attr}", since, sure) for scope, holder, since, sure in found]
    reached += _got_from_methods(a, cls, attr, found)
    for scope, name, since, sure in reached:
        for s, n, at, ok in [(scope, name, since, sure)] + [
            (s, n, None, False) for s, n in (flow(scope, name) if flow is not None else ())
        ]:
            if (id(s), n) not in seen:
                seen.add((id(s), n))
                out.append((s, n, at, ok))
    return out


def _got_from_methods(a, cls: cst.ClassDef, attr: str, found: List[Reach]) -> List[Reach]:
    """What a method of `cls` that returns the attribute itself (``return self.model``, whatever
    the instance is called) hands its callers: called on a holder of an instance (`found`) or, in a
    method of the class, on its own instance, the name the caller binds (``m =
    trainer.get_model()``) and the call itself, read in place (``trainer.get_model().state_dict()``,
    named ``trainer.get_model()``: ``syntax.held_name``); for a ``@property``, the attribute it
    reads as (``trainer.model``)."""
    getters, properties = set(), set()
    for m, k in a.methods.items():
        inst = instance_name(m) if k is cls else None
        if inst is not None and return_slot(m, lambda e, want=f"{inst}.{attr}": dotted(e) == want) == ("whole",):
            if any(dotted(d.decorator) in ("property", "functools.cached_property", "cached_property") for d in m.decorators):
                properties.add(m.name.value)
            else:
                getters.add(m.name.value)
    if not getters and not properties:
        return []
    held = {(id(s), h) for s, h, _since, _sure in found}
    out: List[Reach] = []
    for scope, holder, since, _sure in found:
        out += [(scope, f"{holder}.{p}", since, False) for p in sorted(properties)]
    for m, k in a.methods.items():
        inst = instance_name(m) if k is cls else None
        if inst is not None:
            out += [(m, f"{inst}.{p}", None, False) for p in sorted(properties)]
    for c in a.calls:
        func = c.call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in getters):
            continue
        recv = dotted(func.value)
        inst = a.facts.instance(c.scope)
        mine = inst is not None and inst[1] is cls and recv == inst[0]
        if not (mine or (id(c.scope), recv) in held):
            continue
        name = assigned_name(c.stmt, c.call)
        if name is not None:
            out.append((c.scope, name, c.stmt, False))
        if not c.call.args:  # read in place: ``held_name``'s spelling of the call
            out.append((c.scope, f"{recv}.{func.attr.value}()", None, False))
    return out


def handed_in(a, init: Scope, value: Optional[cst.BaseExpression], cls: cst.ClassDef) -> List[Reach]:
    """The callers' names for the module `cls`'s ``__init__`` is handed and keeps as the model
    (``self.model = model``, also ``model.to(device)``): the same object, so a wrap in place there
    (``fully_shard(self.model)``) shards what ``model`` names in ``main()`` too, from the
    construction on (``trainer = Trainer(model, loader)``). `value`: what ``__init__`` (`init`)
    binds the attribute to. A wrapper that returns a new module (DDP) leaves the caller's name the
    plain module: only an in-place wrap asks this."""
    if not (isinstance(init, cst.FunctionDef) and a.methods.get(init) is cls and init.name.value == "__init__"):
        return []
    v = same_object(value)
    param = v.value if isinstance(v, cst.Name) else None
    if param is None or param not in a.facts.params(init) or a.rebindings(init, param):
        return []
    out: List[Reach] = []
    for c in a.calls:
        if constructs(a, c.call, cls):
            name = dotted(a.facts.bound_value(c.call, init, param))
            if name is not None:
                out.append((c.scope, name, c.stmt, False))
    return out


def bound_to(a, scope: Scope, name: str) -> Optional[cst.BaseExpression]:
    """The value of the one assignment ``name = <value>`` in `scope` (None for none or several)."""
    found = [small.value for stmt in a.rebindings(scope, name) if isinstance(stmt, cst.SimpleStatementLine)
             for small in stmt.body if isinstance(small, cst.Assign) and len(small.targets) == 1
             and dotted(small.targets[0].target) == name]
    return found[0] if len(found) == 1 else None
