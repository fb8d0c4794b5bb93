"""How the model is built and found: device moves, DataParallel and torch.compile around it, and the
statement that makes it (part of the anatomy, see anatomy.py).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from distify.facts import same_object
from distify.forward_methods import class_method
from distify.library import BATCH_NORM, Known, known
from distify.syntax import all_nodes, arg, dotted
from distify.instance import receiver
from distify.model_state import final_place
from distify.records import DATA_PARALLEL, Model, Optimizer, _Collector


def moves_to_device(expr: cst.BaseExpression) -> bool:
    """`X.to(...)` / `X.cuda(...)` as the outermost call."""
    return (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in ("to", "cuda")
    )


def data_parallel_module(qualname, expr: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    """The module `nn.DataParallel(module, ...)` wraps (None when `expr` is no such call).

    `qualname` resolves a callee through the module's imports (`Anatomy.qualname`)."""
    return _first_arg_of(qualname, expr, DATA_PARALLEL, "module")


def _first_arg_of(qualname, expr, callees, keyword: str) -> Optional[cst.BaseExpression]:
    """The first argument of `expr` when it is a call of one of `callees`, else None."""
    if isinstance(expr, cst.Call) and qualname(expr.func) in callees:
        a = arg(expr, 0, keyword)
        if a is not None and not a.star:
            return a.value
    return None


def through_data_parallel(qualname, expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` with any `nn.DataParallel(...)` around it looked through: DST902 removes the wrapper,
    so the model is what it wraps."""
    inner = data_parallel_module(qualname, expr)
    while inner is not None:
        expr = inner
        inner = data_parallel_module(qualname, expr)
    return expr


COMPILE = {"torch.compile"}


def compiled_module(qualname, expr: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    """The module `torch.compile(module, ...)` compiles (None when `expr` is no such call)."""
    return _first_arg_of(qualname, expr, COMPILE, "model")


def through_compile(qualname, expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` with a `torch.compile(...)` around it looked through (the module it compiles)."""
    inner = compiled_module(qualname, expr)
    return inner if inner is not None else expr


def constructor(qualname, expr: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    """The call that builds the module `expr` evaluates to, looked through DataParallel, torch.compile
    and the methods that return the module they are called on (``GPT(cfg).to(device)`` -> ``GPT(cfg)``);
    `expr` itself when it is none of those."""
    while expr is not None:
        expr = through_compile(qualname, through_data_parallel(qualname, expr))
        inner = same_object(expr)
        if inner is not expr:
            expr = inner
            continue
        break
    return expr


def built_class(classes, qualname, expr: Optional[cst.BaseExpression]) -> Optional[cst.ClassDef]:
    """The class of this file whose instance `expr` builds: ``GPT(cfg).to(device)`` (see
    ``constructor``), or an alternative constructor of it, ``Tiny.from_pretrained(name)``: a
    classmethod whose every return is ``cls(...)`` or a name bound to it. None otherwise."""
    built = constructor(qualname, expr)
    if not isinstance(built, cst.Call):
        return None
    if classes.named(dotted(built.func)) is not None:
        return classes.named(dotted(built.func))
    if isinstance(built.func, cst.Attribute):
        owner = classes.named(dotted(built.func.value))
        if owner is not None and _builds_own_instance(classes, owner, built.func.attr.value):
            return owner
    return None


def _builds_own_instance(classes, cls: cst.ClassDef, name: str) -> bool:
    fn = class_method(classes, cls, name)
    me = receiver(fn, "class") if fn is not None else None  # a classmethod's class, whatever it is called
    if me is None:
        return False
    made: set = set()
    returns = []
    for node in all_nodes(fn.body, skip_nested=True):
        if isinstance(node, cst.Assign) and _calls(node.value, me):
            made |= {dotted(t.target) for t in node.targets}
        elif isinstance(node, cst.Return):
            returns.append(node.value)
    return bool(returns) and all(_calls(v, me) or (isinstance(v, cst.Name) and v.value in made) for v in returns)


def _calls(expr, name: str) -> bool:
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == name


def module_container(qualname, expr: Optional[cst.BaseExpression]) -> Optional[Known]:
    """The library row of the container a model is (``nn.ModuleList([...])``, ``nn.ModuleDict(...)``):
    a module with no forward of its own, which only holds other modules; None for any other model."""
    built = constructor(qualname, expr)
    row = known(qualname(built.func)) if isinstance(built, cst.Call) else None
    return row if row is not None and row.kind == "container" else None


def compiles_model(qualname, expr: cst.BaseExpression, root: str) -> bool:
    """`torch.compile(root, ...)`: the name keeps the same module, compiled (its parameters are the
    module's own; the wrapper goes around the compiled module, as PyTorch advises for DDP)."""
    return dotted(compiled_module(qualname, expr)) == root


def moves_model(qualname, expr: cst.BaseExpression, root: str) -> bool:
    """`root.to(...)` / `root.cuda(...)`, also through DataParallel: `nn.DataParallel(root).cuda()`,
    `nn.DataParallel(root.to(device))`."""
    expr = through_data_parallel(qualname, expr)
    return moves_to_device(expr) and dotted(through_data_parallel(qualname, expr.func.value)) == root


def _find_model(col: _Collector, opt: Optimizer, root: str) -> Optional[Model]:
    """The statement constructing `root` and the last one moving it, before the optimizer."""
    facts = col.facts
    inst = facts.instance(opt.call.scope) if facts.instance_attr(opt.call.scope, root) is not None else None
    key = facts.canonical(opt.call.scope, root)  # the attribute's key in every method of the class
    if inst is not None:
        candidates = [
            (a, s, sc) for a, s, sc, k in col.assigns if k is inst[1]
        ]
    else:
        candidates = [(a, s, sc) for a, s, sc, k in col.assigns if sc is opt.call.scope]
    assign_stmt = None
    value = None
    place = None
    rebinding = None
    assign_node = None
    opt_stmt = opt.call.stmt
    built: list = []  # every statement binding the model itself before its optimizer
    for a, s, sc in candidates:
        if len(a.targets) != 1 or facts.canonical(sc, dotted(a.targets[0].target)) != key:
            continue
        if sc is opt.call.scope and not _before(col, s, opt_stmt):
            continue
        v = a.value
        here = facts.respell(root, opt.call.scope, sc) or root  # how that method spells the model
        if moves_model(col.qualname, v, here) or compiles_model(col.qualname, v, here):
            # model = model.to(device), also `model = nn.DataParallel(model).to(device)`, and
            # model = torch.compile(model): the wrap goes after it (compile first, then wrap)
            place = s
            if assign_stmt is None:
                rebinding = (s, v, a)
            continue
        if dotted(data_parallel_module(col.qualname, v)) == here:
            # model = nn.DataParallel(model): DST902 removes it. A model that comes from a parameter
            # is wrapped in its place, when that is at the optimizer's level (not under an `if`)
            if assign_stmt is None and rebinding is None and col.stmt_parent.get(s) == col.stmt_parent.get(opt_stmt):
                rebinding = (s, v, a)
            continue
        assign_stmt, value, place, assign_node = s, v, s, a
        built.append(s)
    if assign_stmt is None and rebinding is not None:
        # the model comes from a parameter or a global and is rebound by `model = model.to(...)`
        assign_stmt, value, assign_node = rebinding
        place = assign_stmt
    if assign_stmt is None:
        return None
    # statement-form moves: `model.to(device)` / `model.cuda()` between assignment and optimizer
    for c in col.calls:
        here = facts.respell(root, opt.call.scope, c.scope) if inst is not None else root
        if (c.scope is not opt.call.scope and inst is None) or here is None:
            continue
        if moves_model(col.qualname, c.call, here) and isinstance(c.stmt, cst.SimpleStatementLine):
            small = c.stmt.body[0]
            if isinstance(small, cst.Expr) and small.value is c.call:
                if _before(col, place, c.stmt) and _before(col, c.stmt, opt_stmt):
                    place = c.stmt
    late = final_place(col.facts, col.qualname, root, assign_stmt, place, opt_stmt)
    if late is not None:
        place = late
    if place is not assign_stmt:
        # a move nested deeper than the construction (`if args.cuda: model.cuda()`): the wrap goes
        # after the enclosing statement at the construction's level, so it happens on every path
        level = col.stmt_parent.get(assign_stmt, ())
        for s in (*col.stmt_parent.get(place, ()), place):
            if col.stmt_parent.get(s, ()) == level:
                place = s
                break
    top = col.stmt_parent.get(opt_stmt, ())
    if any(b is not assign_stmt for b in built) and col.stmt_parent.get(assign_stmt, ()) != top:
        # `if args.resume: model = ckpt["model"] else: model = Net()`: the model the optimizer gets
        # may come from another branch; the wrap goes after the statement at the optimizer's level
        # that holds them, so that it wraps the model on every path
        for s in (*col.stmt_parent.get(place, ()), place):
            if col.stmt_parent.get(s, ()) == top and _before(col, s, opt_stmt):
                place = s
                break
    return Model(
        name=root,
        scope=col.stmt_scope[assign_stmt],
        cls=inst[1] if inst is not None else None,
        assign=assign_stmt,
        value=value,
        place=place,
        optimizer=opt,
        assign_node=assign_node,
    )


def _compiled_alias(col: _Collector, opt: Optimizer, m: Model) -> Optional[Model]:
    """`raw_model = model` then `model = torch.compile(model)`, the optimizer built on raw_model's
    parameters: training calls `model`, so `model` is what gets wrapped (after the compile),
    while raw_model stays the plain module (its state_dict keeps the original's keys)."""
    other = dotted(m.value) if isinstance(m.value, cst.Name) else None
    if other is None or other == m.name or col.facts.instance_attr(opt.call.scope, m.name) is not None:
        return None
    for a, s, sc, _cls in col.assigns:
        if (
            sc is m.scope
            and len(a.targets) == 1
            and dotted(a.targets[0].target) == other
            and compiles_model(col.qualname, a.value, other)
            and _before(col, m.assign, s)
            and _before(col, s, opt.call.stmt)
        ):
            found = _find_model(col, opt, other)
            if found is not None:
                found.stands_for = m.name
            return found
    return None


def _before(col: _Collector, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """Statement order by the visitor's discovery order (source order)."""
    order = col.__dict__.setdefault("_order", {s: i for i, s in enumerate(col.stmt_parent)})
    return order.get(a, -1) < order.get(b, -1)


def batch_norm(classes, qualname, node: Optional[cst.CSTNode], depth: int = 0) -> Optional[cst.Call]:
    """The first BatchNorm layer the model built by `node` holds: in the expression itself
    (`nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16))`) or in a class of this file it builds (the
    model's class, its submodules' classes), three classes deep. None when none is seen; a model of
    another library is not looked into."""
    if node is None or depth > 3:
        return None
    for n in all_nodes(node):
        if not isinstance(n, cst.Call):
            continue
        if qualname(n.func) in BATCH_NORM:
            return n
        cls = classes.named(dotted(n.func))
        if cls is not None and cls is not node:
            found = batch_norm(classes, qualname, cls, depth + 1)
            if found is not None:
                return found
    return None
