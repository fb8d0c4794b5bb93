"""When a model's parameters are final: the statements that change them before training.

DDP broadcasts rank 0's parameters when it wraps a module, FSDP2 splits them when it shards one,
and Horovod copies rank 0's with ``hvd.broadcast_parameters``. Each of these must come after the
last statement that changes the parameters before training, on every path the script can take:

- ``model.apply(init_fn)``, ``torch.nn.init.normal_(model.fc.weight)``, ``model.reset_parameters()``
  (an initialisation drawn on each rank after the broadcast gives each rank its own model);
- ``model.load_state_dict(...)`` (a load after Horovod's broadcast is kept by the ranks that could
  read the file, the others keep their fresh weights);
- surgery, ``model.fc = nn.Linear(...)`` (a module DDP never saw: its gradients are not averaged);
- freezing, ``model.requires_grad_(False)``, ``p.requires_grad = False`` over ``model.parameters()``
  (DDP expects a gradient for every parameter that required one when it was built);
- compiling, ``model = torch.compile(model)``, and moving, ``model.to(device)`` (the object the
  wrapper must hold);

whether written in the statement, under a condition (``if args.resume:``), or in a function of the
script the model is handed to (``load_checkpoint(path, model, optimizer)``).

Read-only, over ``distify.facts.Facts``; the anatomy and the rules ask it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Sequence

import libcst as cst

from distify.facts import Facts, training_call
from distify.syntax import all_nodes, dotted

# nn.Module methods that rewrite the parameters they are called on (or below)
INIT_METHODS = frozenset({"apply", "reset_parameters", "to_empty"})
FREEZE_METHODS = frozenset({"requires_grad_"})
LOAD_METHODS = frozenset({"load_state_dict"})
INIT_PREFIX = "torch.nn.init."
PARAMETER_ITERATORS = frozenset({"parameters", "named_parameters", "modules", "children", "named_modules"})

LOAD, INIT, SURGERY, FREEZE, COMPILE, MOVE = "load", "init", "surgery", "freeze", "compile", "move"
# what changes the objects a wrapper holds or its parameters' values (a load is read the same on every rank)
REBUILDS = frozenset({INIT, SURGERY, FREEZE, COMPILE, MOVE})


@dataclass(frozen=True)
class Change:
    kind: str  # load | init | surgery | freeze | compile | move
    root: str  # the name changed, as the statement's scope spells it (`model`, `optimizer`)
    node: cst.CSTNode  # the call or assignment that changes it (in a called function: the call)


def _rooted(expr: Optional[cst.CSTNode], root: str) -> bool:
    d = dotted(expr) if expr is not None else None
    return d is not None and (d == root or d.startswith(root + "."))


def changes_in(
    facts: Facts,
    qualname: Callable[[cst.BaseExpression], Optional[str]],
    stmt: cst.CSTNode,
    roots: Sequence[str],
    depth: int = 0,
) -> List[Change]:
    """What `stmt` (with the statements nested in it, not the functions it defines) does to the
    modules or optimizers named `roots`, including through the script's own functions it calls
    with one of them as an argument."""
    from distify.model_build import compiles_model, moves_model  # model_build imports this module: import it late

    out: List[Change] = []
    scope = facts.stmt_scope.get(stmt)
    for n in all_nodes(stmt, skip_nested=True):
        if isinstance(n, cst.Call):
            func = n.func
            if isinstance(func, cst.Attribute):
                attr = func.attr.value
                for root in roots:
                    if not _rooted(func.value, root):
                        continue
                    if attr in LOAD_METHODS:
                        out.append(Change(LOAD, root, n))
                    elif attr in INIT_METHODS:
                        out.append(Change(INIT, root, n))
                    elif attr in FREEZE_METHODS:
                        out.append(Change(FREEZE, root, n))
            q = qualname(func) or ""
            if q.startswith(INIT_PREFIX) and n.args and any(_rooted(n.args[0].value, r) for r in roots):
                out.append(Change(INIT, next(r for r in roots if _rooted(n.args[0].value, r)), n))
            for root in roots:
                if moves_model(qualname, n, root):
                    out.append(Change(MOVE, root, n))
            if depth < 3 and scope is not None:
                out += _through_call(facts, qualname, n, scope, roots, depth)
        elif isinstance(n, cst.Assign):
            # model = torch.compile(model): the name now holds the compiled module (a compiled copy
            # under another name changes nothing the wrapper holds)
            out += [
                Change(COMPILE, r, n)
                for r in roots
                if compiles_model(qualname, n.value, r) and any(dotted(t.target) == r for t in n.targets)
            ]
            for t in n.targets:
                target = t.target
                if isinstance(target, cst.Attribute) and target.attr.value == "requires_grad":
                    out += [Change(FREEZE, r, n) for r in roots if _rooted(target.value, r)]
                elif isinstance(target, cst.Attribute) and isinstance(n.value, cst.Call):
                    # model.fc = nn.Linear(...): a submodule (or parameter) the model did not have
                    out += [Change(SURGERY, r, n) for r in roots if _rooted(target.value, r)]
        elif isinstance(n, cst.For) and any(_iterates_parameters(x, r) for x in all_nodes(n.iter) for r in roots):
            # for p in model.parameters(): p.requires_grad = False
            root = next(r for r in roots if any(_iterates_parameters(x, r) for x in all_nodes(n.iter)))
            # the parameter's name: `p` in `for p in model.parameters()`, also `para` in `for name, para in
            # model.named_parameters()` (any name of the target: the others are not tensors)
            loop_vars = [v for v in (
                [dotted(e.value) for e in n.target.elements] if isinstance(n.target, (cst.Tuple, cst.List)) else [dotted(n.target)]
            ) if v]

            def on_var(x: cst.CSTNode) -> bool:
                return any(_rooted(x, v) for v in loop_vars)

            for inner in all_nodes(n.body, skip_nested=True):
                if isinstance(inner, cst.Assign) and loop_vars and any(
                    isinstance(t.target, cst.Attribute)
                    and t.target.attr.value == "requires_grad"
                    and on_var(t.target.value)
                    for t in inner.targets
                ):
                    out.append(Change(FREEZE, root, n))
                    break
                if (
                    isinstance(inner, cst.Call)
                    and (qualname(inner.func) or "").startswith(INIT_PREFIX)
                    and inner.args
                    and on_var(inner.args[0].value)
                ):
                    out.append(Change(INIT, root, n))  # for m in model.modules(): nn.init.zeros_(m.bias)
                    break
                if (
                    isinstance(inner, cst.Call)
                    and isinstance(inner.func, cst.Attribute)
                    and inner.func.attr.value in FREEZE_METHODS | INIT_METHODS
                    and on_var(inner.func.value)
                ):
                    out.append(Change(FREEZE if inner.func.attr.value in FREEZE_METHODS else INIT, root, n))
                    break
    return out


def _iterates_parameters(node: cst.CSTNode, root: str) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in PARAMETER_ITERATORS
        and _rooted(node.func.value, root)
    )


def _through_call(facts, qualname, call: cst.Call, scope, roots: Sequence[str], depth: int) -> List[Change]:
    """Changes a function of the script makes to the arguments it is handed: the call stands for
    them (``load_checkpoint(path, model, optimizer)`` loads `model` and `optimizer`)."""
    fn = facts.callee(call, scope)
    if fn is None:
        return _through_project(facts, qualname, call, roots, depth)
    if fn is scope:
        return []
    pairs = [(dotted(a.value), facts.param_for(fn, call, a)) for a in call.args if dotted(a.value) in roots]
    return _in_function(facts, qualname, fn, call, pairs, depth)


def _through_project(facts, qualname, call: cst.Call, roots: Sequence[str], depth: int) -> List[Change]:
    """Changes a function of another module of the project makes to the arguments it is handed
    (``initialize_weights(gen)`` with ``from model import initialize_weights``): the call stands for
    them, read in that module's own facts."""
    q = qualname(call.func) if facts.project is not None else None
    got = facts.project(q, call) if q else None
    if got is None:
        return []
    other, other_qualname, fn, bound = got
    pairs = [(dotted(expr), param) for param, expr in bound.items() if dotted(expr) in roots]
    return _in_function(other, other_qualname, fn, call, pairs, depth)


def _in_function(facts, qualname, fn: cst.FunctionDef, call: cst.Call, pairs, depth: int) -> List[Change]:
    """What `fn` (read in `facts`) does to each parameter of `pairs` (root, parameter), as changes
    of the root made by `call`."""
    out: List[Change] = []
    for root, param in pairs:
        if param is None:
            continue
        for s in facts.statements(fn):
            if facts.stmt_parent.get(s, ()):
                continue  # nested statements are read with the one at the function's top level
            out += [Change(c.kind, root, call) for c in changes_in(facts, qualname, s, [param], depth + 1)]
    return out


def top_level(facts: Facts, stmt: cst.CSTNode, level: tuple) -> Optional[cst.CSTNode]:
    """The statement enclosing `stmt` (or `stmt` itself) whose parents are `level`."""
    for s in (*facts.stmt_parent.get(stmt, ()), stmt):
        if facts.stmt_parent.get(s, ()) == level:
            return s
    return None


def before_training(facts: Facts, anchor: cst.CSTNode) -> Iterable[cst.CSTNode]:
    """The statements after `anchor` at its level, in its scope, up to the first loop (the loops
    that train: what follows one is no setup step) or the first statement that trains (calls
    ``backward()``/``step()`` or a function of the script that does)."""
    scope = facts.stmt_scope.get(anchor)
    level = facts.stmt_parent.get(anchor, ())
    at = facts.order(anchor)
    for s in facts.statements(scope):
        if facts.order(s) <= at or facts.stmt_parent.get(s, ()) != level:
            continue
        if isinstance(s, (cst.For, cst.While)) or _trains(facts, s):
            return
        yield s


def _trains(facts: Facts, stmt: cst.CSTNode) -> bool:
    scope = facts.stmt_scope.get(stmt)
    for n in all_nodes(stmt, skip_nested=True):
        if training_call(n):
            return True
        if isinstance(n, cst.Call) and scope is not None and facts.callee(n, scope) in facts.trainers:
            return True
    return False


def final_place(facts: Facts, qualname, root: str, assign_stmt, place, opt_stmt) -> Optional[cst.CSTNode]:
    """The statement after which the model named `root` is final, when that is later than `place`
    (the last move before its optimizer): the last change to its parameters before the optimizer
    is built (at any depth, under a condition too), or a change that rebuilds what the wrapper
    holds (a move, a compile, an initialisation, surgery, freezing; not a load, which every rank
    reads alike) after the optimizer and before the first loop, at the construction's level.
    Statement-level; the caller lifts a nested one to the construction's level."""
    if root.startswith("self."):
        return None
    scope = facts.stmt_scope.get(assign_stmt)
    late = None
    for s in facts.statements(scope):
        if facts.order(s) <= facts.order(place) or facts.order(s) >= facts.order(opt_stmt):
            continue
        if isinstance(s, (cst.SimpleStatementLine, cst.For)) and _own_changes(facts, qualname, s, root):
            late = s
    level = facts.stmt_parent.get(assign_stmt, ())
    if facts.stmt_parent.get(opt_stmt, ()) == level:
        for s in before_training(facts, opt_stmt):
            if any(c.kind in REBUILDS for c in changes_in(facts, qualname, s, [root])):
                late = s
    return late


def _own_changes(facts, qualname, stmt, root) -> List[Change]:
    """Changes made by a simple statement, or by a `for` statement's header and body when it is the
    parameter loop itself (nested simple statements are visited on their own)."""
    if isinstance(stmt, cst.For):
        return [c for c in changes_in(facts, qualname, stmt, [root]) if c.node is stmt]
    return changes_in(facts, qualname, stmt, [root])


def last_within(facts: Facts, stmt: cst.CSTNode) -> cst.CSTNode:
    """The last statement in source order that `stmt` encloses (`stmt` itself when it is simple):
    a wrap inserted after an ``if``/``else`` comes after every statement in either branch, so a
    use is "after the wrap" when it comes after this one."""
    last = stmt
    for s in facts.statements(facts.stmt_scope.get(stmt)):
        if stmt in facts.stmt_parent.get(s, ()):
            last = s
    return last


def moved(facts: Facts, qualname, root: str, start, end) -> bool:
    """A statement from `start` to `end` (inclusive, in `start`'s scope) moves the model named
    `root` to a device: the wrapper then gets ``device_ids``."""
    scope = facts.stmt_scope.get(start)
    lo, hi = facts.order(start), facts.order(last_within(facts, end))
    return any(
        c.kind == MOVE
        for s in facts.statements(scope)
        if lo <= facts.order(s) <= hi and isinstance(s, cst.SimpleStatementLine)
        for c in changes_in(facts, qualname, s, [root])
    )
