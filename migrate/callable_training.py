"""Training handed over as a value: which calls of a parameter or a local name train.

The Annotated Transformer's ``run_epoch(data_iter, model, loss_compute)`` calls
``loss_compute(out, tgt, norm)``, and the caller decides what that does: an instance of the script's
own ``SimpleLossCompute(criterion, opt)``, whose ``__call__`` runs ``loss.backward()`` and
``self.opt.step()``, or ``SimpleLossCompute(criterion, None)`` for evaluation, whose training
statements sit under ``if self.opt is not None``. The facts here follow the value, not its name:
a parameter through what each call binds (``Facts.callers``, ``Facts.bound_value``), a local
through its binding, a class of the script through the instance its call builds, a function of
the script passed as a value (also through ``functools.partial``). Whether a call trains is
decided per call site: a constant ``None`` handed to the attribute the training statements need
(``if <instance>.opt is not None:``, ``<instance>.opt.step()``) does not train, and neither does
a call under ``torch.no_grad()`` / ``torch.inference_mode()`` (a ``backward()`` there would raise).
The instance is the method's first parameter, whatever it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional

import libcst as cst

from distify.constructed import init_of
from distify.facts import training_call
from distify.instance import instance_name
from distify.syntax import NESTED, Scope, dotted

_NESTED = tuple(NESTED)
from distify.walk import children

if TYPE_CHECKING:
    from distify.facts import Facts

NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad"})
PARTIAL = "functools.partial"
_DEPTH = 4


def value_trains(facts: "Facts", expr: cst.BaseExpression, scope: Scope, stmt: cst.CSTNode, depth: int = 0) -> bool:
    """Calling the value of `expr` (read in `scope` at `stmt`) trains: an instance of a class of the
    script whose ``__call__`` trains given what its construction passes, a function of the script
    that trains, a ``functools.partial`` of one, or a name bound to one of these (a parameter: at
    some call of its function)."""
    if depth > _DEPTH or expr is None:
        return False
    if isinstance(expr, cst.Call):
        q = facts.qualname(expr.func) if facts.qualname is not None else None
        if q == PARTIAL and expr.args and expr.args[0].keyword is None:
            return value_trains(facts, expr.args[0].value, scope, stmt, depth + 1)
        cls = facts.classes.named(dotted(expr.func)) if facts.classes is not None else None
        return cls is not None and instance_trains(facts, cls, expr)
    if not isinstance(expr, cst.Name):
        return False
    name = expr.value
    if isinstance(scope, cst.FunctionDef) and name in facts.params(scope) and not facts.rebindings(scope, name):
        return any(
            value_trains(facts, v, site.scope, site.stmt, depth + 1)
            for site, v in _bound_at_callers(facts, scope, name)
            if not under_no_grad(facts, site.stmt)
        )
    value = _assigned_value(facts, scope, name, stmt)
    if value is not None:
        return value_trains(facts, value, scope, stmt, depth + 1)
    if isinstance(scope, cst.FunctionDef) and not facts.local_to(scope, name):
        value = _assigned_value(facts, facts.module, name, None)
        if value is not None:
            return value_trains(facts, value, facts.module, stmt, depth + 1)
    fn = facts.functions.named(name) if not (isinstance(scope, cst.FunctionDef) and facts.local_to(scope, name)) else None
    return fn is not None and fn not in facts.methods and (fn in facts.trainers or facts.trains(fn))


def call_of_value(facts: "Facts", call: cst.Call, scope: Scope) -> bool:
    """`call` calls a value rather than a definition: its callee is a plain name that names no
    function or class of the script where it is read (a parameter, a local, a global bound to an
    instance)."""
    if not isinstance(call.func, cst.Name):
        return False
    name = call.func.value
    local = isinstance(scope, cst.FunctionDef) and facts.local_to(scope, name)
    if not local and (name not in facts.bindings(facts.module) or name in facts.functions):
        return False  # a builtin, an import, a definition of the module
    if not local and facts.classes is not None and facts.classes.named(name) is not None:
        return False
    return facts.callee(call, scope) is None


def value_calls(facts: "Facts", node: cst.CSTNode, scope: Scope) -> List[cst.Call]:
    """The calls of values (see ``call_of_value``) made by `node` itself, not in what it defines."""
    out = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Call) and call_of_value(facts, n, scope):
            out.append(n)
        stack.extend(c for c in children(n) if not isinstance(c, _NESTED) or c is node)
    return out


def trains_through_values(facts: "Facts", node: cst.CSTNode, scope: Scope, stmt: cst.CSTNode) -> bool:
    """`node` trains by calling a value that trains (at some call of its function)."""
    return any(value_trains(facts, c.func, scope, stmt) for c in value_calls(facts, node, scope))


def trains_at(facts: "Facts", node: cst.CSTNode, fn: cst.FunctionDef, site) -> Optional[bool]:
    """Whether `node` (a loop of `fn`) trains when `fn` is called from `site`, where it trains only
    through values its parameters hold: True or False from what `site` binds to them (and False
    under no_grad); None when it calls another value (decided elsewhere)."""
    calls = value_calls(facts, node, fn)
    params = facts.params(fn)
    if not calls or any(c.func.value not in params or facts.rebindings(fn, c.func.value) for c in calls):
        return None
    if under_no_grad(facts, site.stmt):
        return False
    return any(
        value_trains(facts, facts.bound_value(site.call, fn, c.func.value), site.scope, site.stmt, 1) for c in calls
    )


def under_no_grad(facts: "Facts", stmt: cst.CSTNode) -> bool:
    """`stmt` runs inside ``with torch.no_grad():`` (or ``inference_mode``) in its own scope."""
    if facts.qualname is None:
        return False
    for p in facts.stmt_parent.get(stmt, ()):
        if isinstance(p, cst.With) and any(
            isinstance(i.item, cst.Call) and facts.qualname(i.item.func) in NO_GRAD for i in p.items
        ):
            return True
    return False


def instance_trains(facts: "Facts", cls: cst.ClassDef, built: Optional[cst.Call]) -> bool:
    """An instance of `cls` built by `built` trains when called: its ``__call__`` reaches
    backward()/step() on a path the constants of `built` leave open (an attribute its ``__init__``
    sets from a parameter `built` passes ``None`` for closes the branches that test it and the
    calls made on it)."""
    methods = {m.name.value: m for m, k in facts.methods.items() if k is cls}
    call = methods.get("__call__")
    if call is None:
        return False
    none = _none_attributes(facts, methods.get("__init__"), built)
    return _reaches_training(facts, call, methods, none, 0)


def _none_attributes(facts: "Facts", init: Optional[cst.FunctionDef], built: Optional[cst.Call]) -> FrozenSet[str]:
    """Attributes ``__init__`` sets, as ``<instance>.x = p``, from a parameter `built` leaves None."""
    if init is None or built is None or any(a.star for a in built.args):
        return frozenset()
    inst = _instance(init)
    none = set()
    for p in [*init.params.params[1:], *init.params.kwonly_params]:
        v = facts.bound_value(built, init, p.name.value)
        if v is None:
            v = p.default
        if isinstance(v, cst.Name) and v.value == "None" and not facts.rebindings(init, p.name.value):
            none.add(p.name.value)
    out = set()
    for a, _stmt, scope, _cls in facts.assigns:
        if scope is init and len(a.targets) == 1 and isinstance(a.value, cst.Name) and a.value.value in none:
            t = a.targets[0].target
            if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == inst:
                out.add(t.attr.value)
    return frozenset(out)


def _instance(fn: cst.FunctionDef) -> Optional[str]:
    return instance_name(fn)


def _reaches_training(facts: "Facts", fn: cst.FunctionDef, methods: Dict[str, cst.FunctionDef],
                      none: FrozenSet[str], depth: int) -> bool:
    inst = _instance(fn)

    def on_none(expr: cst.BaseExpression) -> bool:
        """`expr` is `<instance>.x` (or reads through it: `<instance>.x.step`) with x None."""
        while isinstance(expr, (cst.Attribute, cst.Call, cst.Subscript)):
            inner = expr.func if isinstance(expr, cst.Call) else expr.value
            if isinstance(expr, cst.Attribute) and isinstance(inner, cst.Name) and inner.value == inst:
                return expr.attr.value in none
            expr = inner
        return False

    def verdict(test: cst.BaseExpression) -> Optional[bool]:
        """The test's value where the None attributes are None (None: unknown)."""
        if on_none(test) and isinstance(test, cst.Attribute):
            return False
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and on_none(test.left):
            c = test.comparisons[0]
            if isinstance(c.comparator, cst.Name) and c.comparator.value == "None":
                if isinstance(c.operator, cst.IsNot):
                    return False
                if isinstance(c.operator, cst.Is):
                    return True
        return None

    def reach(node: cst.CSTNode) -> bool:
        if isinstance(node, cst.If):
            v = verdict(node.test)
            if v is not False and reach(node.body):
                return True
            return v is not True and node.orelse is not None and reach(node.orelse)
        if isinstance(node, _NESTED) and node is not fn:
            return False
        if isinstance(node, cst.Call):
            if training_call(node) and not on_none(node.func.value):
                return True
            f = node.func
            if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == inst:
                m = methods.get(f.attr.value)
                if m is not None and depth < _DEPTH and _reaches_training(facts, m, methods, none, depth + 1):
                    return True
            elif isinstance(f, cst.Name):
                g = facts.functions.named(f.value)
                if g is not None and not facts.local_to(fn, f.value) and (g in facts.trainers or facts.trains(g)):
                    return True
        return any(reach(c) for c in children(node))

    return reach(fn.body)


def _bound_at_callers(facts: "Facts", fn: cst.FunctionDef, param: str):
    out = []
    for site in facts.callers(fn):
        v = facts.bound_value(site.call, fn, param)
        if v is None:
            p = next((x for x in fn.params.params if x.name.value == param), None)
            v = p.default if p is not None else None
        if v is not None:
            out.append((site, v))
    return out


def _assigned_value(facts: "Facts", scope: Scope, name: str, stmt: Optional[cst.CSTNode]) -> Optional[cst.BaseExpression]:
    """The value of the one plain assignment ``name = <value>`` that binds `name` in `scope` (the
    last one before `stmt` when given), None when it is bound otherwise or more than once then."""
    binds = facts.bindings(scope).get(name, [])
    if stmt is not None and facts.stmt_scope.get(stmt) is scope:
        b = facts.reaching_binding(scope, name, stmt)
        binds = [b] if b is not None else []
    if len(binds) != 1:
        return None
    s = binds[0].stmt
    small = s.body[0] if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 else None
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and dotted(small.targets[0].target) == name:
        return small.value
    return None


def value_trainers(facts: "Facts") -> FrozenSet[Scope]:
    """Scopes whose own body calls a value that trains (``run_epoch`` calling its ``loss_compute``;
    the module, for a loop at its top level)."""
    out = set()
    if not _training_values(facts):
        return frozenset()  # nothing that trains can be handed around: no call of a value trains
    for c in facts.calls:
        if isinstance(c.call.func, cst.Name) and call_of_value(facts, c.call, c.scope):
            if c.scope not in out and value_trains(facts, c.call.func, c.scope, c.stmt):
                out.add(c.scope)
    return frozenset(out)


def calls_handing(facts: "Facts", fn: cst.FunctionDef, param: str, holds) -> list:
    """The calls of `fn` whose value for `param` is the loader: ``holds(value, calling scope)``
    (a reference to it there, or its own call, built in place)."""
    out = []
    for site in facts.callers(fn) if param in facts.params(fn) else ():
        v = facts.bound_value(site.call, fn, param)
        if v is not None and holds(v, site.scope):
            out.append(site)
    return out


def passed_in_place(facts: "Facts", site):
    """(call, function, parameter) when the call `site` (a DataLoader built in place) is an argument
    of a call of a function of this module (or of a construction of one of its classes, whose
    ``__init__`` binds it), which knows it by that parameter; None otherwise."""
    for c in facts.calls:
        if c.stmt is not site.stmt or c is site:
            continue
        a_node = next((x for x in c.call.args if x.value is site.call), None)
        # a function, a method, or the __init__ of a class it builds (`Trainer(model, DataLoader(...))`)
        fn = (facts.callee(c.call, c.scope) or init_of(facts, c.call)) if a_node is not None else None
        pname = facts.param_for(fn, c.call, a_node) if fn is not None else None
        if pname is not None:
            return c, fn, pname
    return None


def _training_values(facts: "Facts") -> bool:
    """The script has something that may train when called as a value: a class with a ``__call__``,
    or a function that trains named outside a call's callee (an argument, an assigned value)."""
    if any(m.name.value == "__call__" for m in facts.methods):
        return True
    trains = facts.trainers

    def names_trainer(v) -> bool:
        return isinstance(v, cst.Name) and facts.functions.named(v.value) in trains

    return bool(trains) and (
        any(names_trainer(a.value) for c in facts.calls for a in c.call.args)
        or any(names_trainer(a.value) for a, *_ in facts.assigns)
    )
