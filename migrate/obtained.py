"""Where the script obtains an optimizer that a function of it builds and hands back.

The most common shape of LLM scripts (nanoGPT, minGPT) builds the optimizer in a method of the
model over parameter groups of its instance, or in a builder function handed the model:

    optimizer = model.configure_optimizers(weight_decay, lr, betas)
    optimizer = build_optimizer(model, cfg)        # def build_optimizer(net, cfg): return AdamW(...)

The `Optimizer` record of such an optimizer is its construction inside that function (what DST907,
DST102 and the audit read). `obtained(...)` is a second view of it, the place where the script
gets it: an `Optimizer` record whose `call` is the call site in the caller
(``model.configure_optimizers(...)``), whose `target` is the name the caller binds it to, and whose
`models` is the one model it steps, *as the caller spells it*. It exists only when the facts name
that model:

- the function builds exactly one optimizer and every return of it hands that optimizer back;
- every parameter the optimizer receives comes from ``X.parameters()`` / ``X.named_parameters()``
  of one root `X` (followed through names bound in the function, comprehensions, parameter-group
  dicts' ``"params"``, ``list(...)``, ``.items()``), and that root is the method's instance or a
  parameter of the function: anything else (another module, a parameter handed in as such, a name
  bound otherwise) names no model, and the optimizer keeps today's refusal;
- the function is called once in this file, in a statement ``name = <call>``, and the caller's
  model is the receiver of the method call (a name bound only to an instance of the method's class,
  or to itself moved or compiled) or the plain name handed for that parameter.

Read-only, over ``distify.facts.Facts``; the anatomy asks it once per optimizer.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Optional

import libcst as cst

from distify.dataflow import parameters_receiver
from distify.instance import instance_name
from distify.model_build import built_class, constructor
from distify.records import DDP, Optimizer, assigned_name
from distify.syntax import all_nodes, arg, dotted

Roots = Optional[FrozenSet[str]]  # None: a source distify cannot follow

# builtins that hand on the items of their (last) argument
_ITEMS = frozenset({"list", "tuple", "set", "sorted", "iter", "filter", "dict", "reversed"})
# methods of a dict or list that read its items without changing it
_READS = frozenset({"items", "values", "keys", "copy", "get"})
_DEPTH = 12


def obtained(facts, qualname, classes, optimizers: List[Optimizer], opt: Optimizer) -> Optional[Optimizer]:
    """The caller's view of `opt` (see the module docstring), or None."""
    fn = opt.call.scope
    if type(fn) is not cst.FunctionDef or sum(1 for o in optimizers if o.call.scope is fn) != 1:
        return None
    if not _hands_back(facts, fn, opt):
        return None
    p = arg(opt.call.call, 0, "params")
    if p is None or p.star:
        return None
    inst = facts.instance(fn)
    me = inst[0] if inst is not None and fn in facts.methods else None
    roots = _sources(facts, fn, opt.call.stmt, p.value, {}, _module_names(facts, fn), 0)
    if roots is None or len(roots) != 1:
        return None
    root = next(iter(roots))
    if me is not None and root == me:
        return _method_site(facts, qualname, classes, fn, inst[1])
    if root in facts.params(fn) and root != me:
        sites = facts.callers(fn)
        if len(sites) != 1:
            return None
        site = sites[0]
        value = facts.bound_value(site.call, fn, root)
        model = dotted(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
        target = assigned_name(site.stmt, site.call)
        if model is None or target is None or _is_instance(facts, site.scope, model):
            return None
        return Optimizer(call=site, target=target, models=[model])
    return None


def _hands_back(facts, fn: cst.FunctionDef, opt: Optimizer) -> bool:
    """Every return of `fn` hands back `opt`: ``return <its call>`` or ``return name`` of the one
    name bound to it."""
    returns = [n for n in all_nodes(fn.body, skip_nested=True) if type(n) is cst.Return]
    if not returns:
        return False
    if opt.target is not None and (
        "." in opt.target or len(facts.bindings(fn).get(opt.target, [])) != 1
    ):
        return False
    return all(
        n.value is opt.call.call or (opt.target is not None and isinstance(n.value, cst.Name) and n.value.value == opt.target)
        for n in returns
    )


def _method_site(facts, qualname, classes, fn: cst.FunctionDef, cls: cst.ClassDef) -> Optional[Optimizer]:
    """`recv.<fn>(...)` called once in this file outside the class, `recv` bound only to an
    instance of `cls` (also moved or compiled), in ``name = recv.<fn>(...)``."""
    sites = facts.callers(fn, any_receiver=True)
    if len(sites) != 1:
        return None
    site = sites[0]
    recv = dotted(site.call.func.value) if isinstance(site.call.func, cst.Attribute) else None
    target = assigned_name(site.stmt, site.call)
    if recv is None or target is None or _is_instance(facts, site.scope, recv):
        return None
    name, wrapped = recv, False
    if recv.endswith(".module"):  # the module a DDP wrapper holds (distify's own output: `model.module.m(...)`)
        name, wrapped = recv[: -len(".module")], True
    if "." in name:
        return None
    bound = facts.bindings(site.scope).get(name, [])
    if not site.loops and not facts.loops_around(site.stmt):
        # what the receiver holds at the call: its bindings before it (nanoGPT compiles and wraps
        # the model after building its optimizer); in a loop, every binding may reach the call
        bound = [b for b in bound if facts.order(b.stmt) < facts.order(site.stmt)]
    built = False
    for b in bound:
        small = b.stmt.body[0] if isinstance(b.stmt, cst.SimpleStatementLine) and len(b.stmt.body) == 1 else None
        if not (b.kind == "assign" and isinstance(small, cst.Assign) and len(small.targets) == 1
                and dotted(small.targets[0].target) == name):
            return None
        value = small.value
        if wrapped:
            if not (isinstance(value, cst.Call) and qualname(value.func) in DDP and value.args):
                return None
            value = value.args[0].value
        if built_class(classes, qualname, value) is cls:
            built = True
            continue
        if dotted(constructor(qualname, value)) != name:
            return None  # bound to something else (another class, a wrapper, a loaded object)
    if not built:
        return None
    return Optimizer(call=site, target=target, models=[recv])


def _is_instance(facts, scope, name: str) -> bool:
    """`name` is (an attribute of) the instance of the method `scope` is: not a model the script
    builds in that scope."""
    inst = facts.instance(scope)
    return inst is not None and name.split(".")[0] == inst[0]


def _module_names(facts, fn: cst.FunctionDef) -> FrozenSet[str]:
    """Names bound at module level or in `fn`: a call of one of them is no builtin."""
    scope = fn
    while not isinstance(scope, cst.Module) and scope is not None:
        scope = facts.stmt_scope.get(scope)
    names = set(facts.bindings(fn))
    if scope is not None:
        names |= set(facts.bindings(scope))
    return frozenset(names)


def _sources(facts, fn, stmt, expr, local: Dict[str, Roots], shadowed: FrozenSet[str], depth: int) -> Roots:
    """The roots `X` of the ``X.parameters()`` / ``X.named_parameters()`` calls whose items
    `expr` (read in `fn` at `stmt`) may hold, or None when some of what it holds comes from a
    source distify does not follow. `local`: comprehension variables and what they hold."""
    if depth > _DEPTH:
        return None

    def down(e, loc=local):
        return _sources(facts, fn, stmt, e, loc, shadowed, depth + 1)

    def union(parts) -> Roots:
        out: set = set()
        for part in parts:
            got = down(part)
            if got is None:
                return None
            out |= got
        return frozenset(out)

    if isinstance(expr, cst.Call):
        f = expr.func
        if isinstance(f, cst.Attribute) and f.attr.value in ("parameters", "named_parameters"):
            d = parameters_receiver(expr)  # `runtime.unwrap(X).named_parameters()` too: X's own
            root = d.split(".")[0] if d else None
            if root is None or root in local or root in facts.bindings(fn):
                return None  # a comprehension's variable, or a name the function rebinds: not followed
            return frozenset({root})
        if isinstance(f, cst.Attribute) and f.attr.value in _READS:
            return down(f.value)
        if isinstance(f, cst.Name) and f.value in _ITEMS and f.value not in shadowed:
            args = [a.value for a in expr.args if not a.keyword]
            if f.value == "filter":
                args = args[1:]
            return union(args) if args else frozenset()
        return None
    if isinstance(expr, cst.Name):
        if expr.value in local:
            return local[expr.value]
        return _bound(facts, fn, stmt, expr.value, shadowed, depth)
    if isinstance(expr, cst.Subscript):
        return down(expr.value)
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        return union([e.value for e in expr.elements])
    if isinstance(expr, cst.Dict):
        parts = []
        for e in expr.elements:
            if not isinstance(e, cst.DictElement) or not isinstance(e.key, cst.SimpleString):
                return None
            if e.key.evaluated_value == "params":
                parts.append(e.value)
        return union(parts) if parts else None
    if isinstance(expr, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
        loc = dict(local)
        clause = expr.for_in
        while clause is not None:
            held = _sources(facts, fn, stmt, clause.iter, loc, shadowed, depth + 1)
            for t in all_nodes(clause.target):
                if isinstance(t, cst.Name):
                    loc[t.value] = held
            clause = clause.inner_for_in
        return down(expr.value if isinstance(expr, cst.DictComp) else expr.elt, loc)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
        return union([expr.left, expr.right])
    if isinstance(expr, cst.IfExp):
        return union([expr.body, expr.orelse])
    return None


def _bound(facts, fn, stmt, name: str, shadowed: FrozenSet[str], depth: int) -> Roots:
    """What the local `name` holds at `stmt`: the union over its assignments before it (each a
    plain ``name = value``), when nothing changes it in place (``name.append(...)``,
    ``name[k] = ...``). A parameter, a global or any other binding is not followed."""
    bound = facts.bindings(fn).get(name, [])
    if not bound or name in facts.params(fn) or name == instance_name(fn):
        return None
    for node, parents, _nested in facts.uses(fn, name):
        up = parents[-1] if parents else None
        if isinstance(up, cst.Attribute) and up.value is node and up.attr.value not in _READS:
            return None
        if isinstance(up, cst.Subscript) and up.value is node and len(parents) > 1 and isinstance(
            parents[-2], (cst.AssignTarget, cst.AugAssign, cst.Del)
        ):
            return None
    out: set = set()
    at = facts.order(stmt)
    for b in bound:
        if facts.order(b.stmt) >= at:
            continue
        small = b.stmt.body[0] if isinstance(b.stmt, cst.SimpleStatementLine) and len(b.stmt.body) == 1 else None
        if not (b.kind == "assign" and isinstance(small, cst.Assign) and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)):
            return None
        got = _sources(facts, fn, b.stmt, small.value, {}, shadowed, depth + 1)
        if got is None:
            return None
        out |= got
    return frozenset(out)
