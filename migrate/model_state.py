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

from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence

import libcst as cst

from distify.facts import Facts, training_call
from distify.model_refs import Refs
from distify.syntax import all_nodes, dotted
from distify.values import Value

# nn.Module methods that rewrite the parameters they are called on (or below)
INIT_METHODS = frozenset({"apply", "reset_parameters", "to_empty"})
FREEZE_METHODS = frozenset({"requires_grad_"})
LOAD_METHODS = frozenset({"load_state_dict"})
INIT_PREFIX = "torch.nn.init."
PARAMETER_ITERATORS = frozenset({"parameters", "named_parameters", "modules", "children", "named_modules"})

LOAD, INIT, SURGERY, FREEZE, COMPILE, MOVE = "load", "init", "surgery", "freeze", "compile", "move"
# what changes the objects a wrapper holds or its parameters' values (a load is read the same on every rank)
REBUILDS = frozenset({INIT, SURGERY, FREEZE, COMPILE, MOVE})


class Change(Value):
    """A statement that changes a model or optimizer before training (``changes_in``)."""

    __slots__ = ("kind", "root", "node")
    kind: str  # load | init | surgery | freeze | compile | move
    root: str  # the name changed, as the statement's scope spells it (`model`, `optimizer`)
    node: cst.CSTNode  # the call or assignment that changes it (in a called function: the call)

    def __init__(self, kind: str, root: str, node: cst.CSTNode) -> None:
        self._set(kind, root, node)


def changes_in(
    facts: Facts,
    qualname: Callable[[cst.BaseExpression], Optional[str]],
    stmt: cst.CSTNode,
    roots: Sequence[str],
    depth: int = 0,
    held: Optional[Dict[str, FrozenSet[str]]] = None,
    named: Optional[Dict[str, FrozenSet[str]]] = None,
) -> List[Change]:
    """What `stmt` (with the statements nested in it, not the functions it defines) does to the
    modules or optimizers named `roots`, including under another name (an alias, a loop over a
    container holding them: ``distify.model_refs``) and through the script's own functions it
    calls with one of them as an argument. `named` / `held`: further names holding (a container
    of) them, name -> the roots (a called function's parameters)."""
    from distify.model_build import compiles_model, moves_model  # model_build imports this module: import it late

    out: List[Change] = []
    scope = facts.stmt_scope.get(stmt)
    direct = {**{r: frozenset({r}) for r in roots}, **(named or {})}
    refs = Refs(facts, scope, direct, held or {}, qualname)
    upto = facts.order(last_within(facts, stmt)) if scope is not None else -1

    def of(expr) -> List[str]:
        return sorted(refs.roots_of(expr, upto))

    for n in all_nodes(stmt, skip_nested=True):
        if type(n) is cst.Call:
            func = n.func
            if type(func) is cst.Attribute:
                attr = func.attr.value
                kind = LOAD if attr in LOAD_METHODS else INIT if attr in INIT_METHODS else FREEZE if attr in FREEZE_METHODS else None
                if kind is not None:
                    out += [Change(kind, root, n) for root in of(func.value)]
            q = qualname(func) or ""
            if q.startswith(INIT_PREFIX) and n.args:
                out += [Change(INIT, root, n) for root in of(n.args[0].value)]
            for name, labels in direct.items():
                if moves_model(qualname, n, name):
                    out += [Change(MOVE, root, n) for root in sorted(labels)]
            if depth < 3 and scope is not None:
                out += _through_call(facts, qualname, n, scope, refs, upto, depth)
        elif type(n) is cst.Assign:
            # model = torch.compile(model): the name now holds the compiled module (a compiled copy
            # under another name changes nothing the wrapper holds)
            out += [
                Change(COMPILE, root, n)
                for name, labels in direct.items()
                if compiles_model(qualname, n.value, name) and any(dotted(t.target) == name for t in n.targets)
                for root in sorted(labels)
            ]
            for t in n.targets:
                target = t.target
                if type(target) is cst.Attribute and target.attr.value == "requires_grad":
                    out += [Change(FREEZE, r, n) for r in of(target.value)]
                elif type(target) is cst.Attribute and type(n.value) is cst.Call:
                    # model.fc = nn.Linear(...): a submodule (or parameter) the model did not have
                    out += [Change(SURGERY, r, n) for r in of(target.value)]
        elif type(n) is cst.For:
            over = [r for x in all_nodes(n.iter) if _iterates_parameters(x) for r in of(x.func.value)]
            if over:
                # for p in model.parameters(): p.requires_grad = False
                kind = _parameter_loop(qualname, n)
                if kind is not None:
                    out.append(Change(kind, over[0], n))
    return out


def _iterates_parameters(node: cst.CSTNode) -> bool:
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in PARAMETER_ITERATORS
    )


def _parameter_loop(qualname, loop: cst.For) -> Optional[str]:
    """FREEZE or INIT when the body of a loop over a module's parameters or submodules freezes or
    initialises the loop variable (``p.requires_grad = False``, ``nn.init.zeros_(m.bias)``)."""
    # the parameter's name: `p` in `for p in model.parameters()`, also `para` in `for name, para in
    # model.named_parameters()` (any name of the target: the others are not tensors)
    target = loop.target
    loop_vars = [v for v in (
        [dotted(e.value) for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [dotted(target)]
    ) if v]
    if not loop_vars:
        return None

    def on_var(expr) -> bool:
        d = dotted(expr)
        return d is not None and any(d == v or d.startswith(v + ".") for v in loop_vars)

    for inner in all_nodes(loop.body, skip_nested=True):
        if isinstance(inner, cst.Assign) and any(
            isinstance(t.target, cst.Attribute) and t.target.attr.value == "requires_grad" and on_var(t.target.value)
            for t in inner.targets
        ):
            return FREEZE
        if isinstance(inner, cst.Call):
            if (qualname(inner.func) or "").startswith(INIT_PREFIX) and inner.args and on_var(inner.args[0].value):
                return INIT  # for m in model.modules(): nn.init.zeros_(m.bias)
            if (
                isinstance(inner.func, cst.Attribute)
                and inner.func.attr.value in FREEZE_METHODS | INIT_METHODS
                and on_var(inner.func.value)
            ):
                return FREEZE if inner.func.attr.value in FREEZE_METHODS else INIT
    return None


def _through_call(facts, qualname, call: cst.Call, scope, refs: Refs, upto: int, depth: int) -> List[Change]:
    """Changes a function of the script makes to the arguments it is handed: the call stands for
    them (``load_checkpoint(path, model, optimizer)`` loads `model` and `optimizer`; an argument
    may also be an alias of one, or a container holding them: ``init_all([gen, disc])``)."""
    fn = facts.callee(call, scope)
    if fn is None:
        return _through_project(facts, qualname, call, refs, upto, depth)
    if fn is scope:
        return []
    bound = [(facts.param_for(fn, call, a), a.value) for a in call.args]
    named, held = _handed(refs, bound, upto)
    _spread(facts, fn, call, refs, upto, named, held)
    _instance(facts, scope, fn, call, refs, upto, named, held)
    return _in_function(facts, qualname, fn, call, (named, held), depth)


def _instance(facts, scope, fn: cst.FunctionDef, call: cst.Call, refs: Refs, upto: int, named, held) -> None:
    """A method of the same class called on the instance (``self.init_weights()`` in ``__init__``):
    the attributes of the instance that hold the modules, or containers of them, hold them in the
    method too (``self.nets = [self.gen, self.disc]``, then ``for net in self.nets: ...`` there),
    under the method's own name for the instance (its first parameter, whatever it is called)."""
    here, there = facts.instance(scope), facts.instance(fn)
    if here is None or there is None or here[1] is not there[1] or fn not in facts.methods:
        return
    mine, theirs = here[0], there[0]
    if not isinstance(call.func, cst.Attribute) or not isinstance(call.func.value, cst.Name) or call.func.value.value != mine:
        return
    for name, labels in refs.attributes(mine, upto, held=False).items():
        named[theirs + name[len(mine):]] = named.get(theirs + name[len(mine):], frozenset()) | labels
    for name, labels in refs.attributes(mine, upto, held=True).items():
        held[theirs + name[len(mine):]] = held.get(theirs + name[len(mine):], frozenset()) | labels


def _spread(facts, fn: cst.FunctionDef, call: cst.Call, refs: Refs, upto: int, named, held) -> None:
    """What a call binds that ``param_for`` leaves out: the positional arguments a ``*models``
    parameter collects (``init_all(gen, disc)``: a tuple holding them), and a container spread into
    the call (``init_all(*nets)``), whose items may land in any positional parameter or in the
    ``*`` one (more than it binds: a wrap later than needed is harmless)."""
    params = facts.params(fn)
    star = fn.params.star_arg.name.value if isinstance(fn.params.star_arg, cst.Param) else None
    spread = frozenset()
    for x in call.args:
        if x.star == "*":
            spread |= refs.held_by(x.value, upto)
    positional = [x for x in call.args if x.keyword is None and not x.star]
    extra = frozenset().union(*(refs.roots_of(x.value, upto) for x in positional[len(params):])) if star else frozenset()
    if star and (extra or spread):
        held[star] = held.get(star, frozenset()) | extra | spread
    if spread:
        for p in params[len(positional):]:
            named[p] = named.get(p, frozenset()) | spread


def _through_project(facts, qualname, call: cst.Call, refs: Refs, upto: int, depth: int) -> List[Change]:
    """Changes a function of another module of the project makes to the arguments it is handed
    (``initialize_weights(gen)`` with ``from model import initialize_weights``): the call stands for
    them, read in that module's own facts."""
    q = qualname(call.func) if facts.project is not None else None
    got = facts.project(q, call) if q else None
    if got is None:
        return []
    other, other_qualname, fn, bound = got
    return _in_function(other, other_qualname, fn, call, _handed(refs, list(bound.items()), upto), depth)


def _handed(refs: Refs, bound, upto: int):
    """(named, held): the parameters bound to one of the roots, and those bound to a container of them."""
    named: Dict[str, FrozenSet[str]] = {}
    held: Dict[str, FrozenSet[str]] = {}
    for param, expr in bound:
        if param is None:
            continue
        got = refs.roots_of(expr, upto)
        if got:
            named[param] = got
        got = refs.held_by(expr, upto)
        if got:
            held[param] = got
    return named, held


def _in_function(facts, qualname, fn: cst.FunctionDef, call: cst.Call, handed, depth: int) -> List[Change]:
    """What `fn` (read in `facts`) does to the parameters `handed` names, as changes of the roots
    they hold made by `call`."""
    named, held = handed
    if not named and not held:
        return []
    out: List[Change] = []
    for s in facts.statements(fn):
        if facts.stmt_parent.get(s, ()):
            continue  # nested statements are read with the one at the function's top level
        out += [Change(c.kind, c.root, call) for c in changes_in(facts, qualname, s, [], depth + 1, held, named)]
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
    scope = facts.stmt_scope.get(assign_stmt)
    if facts.instance_attr(facts.stmt_scope.get(opt_stmt), root) is not None and facts.stmt_scope.get(opt_stmt) is not scope:
        return None  # an attribute of the instance whose optimizer is built in another method: no order between them
    late = None
    lazy = holds_lazy_modules(facts, qualname, assign_stmt)
    for s in facts.statements(scope):
        if facts.order(s) <= facts.order(place) or facts.order(s) >= facts.order(opt_stmt):
            continue
        if isinstance(s, (cst.SimpleStatementLine, cst.For)) and _own_changes(facts, qualname, s, root):
            late = s
        elif lazy and isinstance(s, cst.SimpleStatementLine) and _calls_model(s, root):
            late = s  # the dry run that makes the lazy modules' parameters
    level = facts.stmt_parent.get(assign_stmt, ())
    if facts.stmt_parent.get(opt_stmt, ()) == level:
        for s in before_training(facts, opt_stmt):
            if any(c.kind in REBUILDS for c in changes_in(facts, qualname, s, [root])):
                late = s
    return late


def holds_lazy_modules(facts: Facts, qualname, stmt: cst.CSTNode, depth: int = 0) -> bool:
    """The model `stmt` builds holds a lazy module (``library.LAZY_MODULES``, by qualified name:
    ``nn.LazyLinear``), built in the statement itself or in the ``__init__`` of a class of this
    module it constructs (and of the module's classes that one builds, a few levels down)."""
    from distify.constructed import init_of
    from distify.library import LAZY_MODULES

    for n in all_nodes(stmt):
        if not isinstance(n, cst.Call):
            continue
        if qualname(n.func) in LAZY_MODULES:
            return True
        init = init_of(facts, n) if depth < 3 else None
        if init is not None and holds_lazy_modules(facts, qualname, init.body, depth + 1):
            return True
    return False


def _calls_model(stmt: cst.CSTNode, root: str) -> bool:
    """`stmt` calls the model named `root` itself (``model(dummy)``: its forward)."""
    return any(isinstance(n, cst.Call) and dotted(n.func) == root for n in all_nodes(stmt))


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
