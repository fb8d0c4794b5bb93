"""Early stops that each rank would decide alone: a way out of a loop that trains (runs
``backward()``: the gradient all-reduce every rank joins) under a condition that reads a value each
rank computes from its own shard. A way out is a ``break``, a ``return``, a ``sys.exit()`` (or
``raise SystemExit``, also in a function of the script that every rank calls from such a loop:
``check(loss.item())``), or the test of a ``while`` loop that trains itself.

``if val_loss > best: patience += 1`` ... ``if patience >= limit: break``, ``if loss.item() < tol:
break``, ``if running_reward > threshold: print("Solved!"); break``, ``while not done:``: in one
process the loop ends once. On N ranks each evaluates the condition on its own numbers; one rank
leaves the loop and the others wait for it in the next all-reduce, forever. Where such a condition
decides, every rank must take one decision (the rules wrap an ``if`` test in ``runtime.agree``, true
everywhere when true on any rank, and a ``while`` test in ``runtime.agree_all``, true everywhere only
when true on every rank: either way a rank that would stop stops them all).

*Per rank* is a data-flow fact, over-approximated on purpose (agreeing on a value that is the same
everywhere costs one small all-reduce and changes nothing): a value is per rank when it is computed
from a loader (its batches, a function handed it: ``evaluate(model, val_loader)``) or from a random
draw on the training path (a policy's ``Categorical(probs).sample()``, which distify gives each rank
its own stream for, and so the rewards it earns), through any chain of assignments, ``+=``, loop
targets, the parameters a call binds, what a function of the script returns, and what a method of a
class of the script keeps on its instance (``early_stopping(val_loss, model)`` of a class whose
``__call__`` sets ``self.early_stop``: then ``early_stopping`` holds a per-rank value). A name bound
under an ``if``/``while`` whose test is per rank is per rank too (``patience = 0`` in one branch,
``patience += 1`` in the other), unless that test is agreed: once every rank takes the branch
together, the counter it steers is the same everywhere. The index ``enumerate`` counts is not (every
rank runs as many batches), nor is anything read from arguments or literals.

What stays each rank's own after the agreement: the values themselves. ``if runtime.agree(val <
best): best = val`` keeps each rank's own ``best`` (rank 0's is what rank 0 saves or prints beside
its "best" checkpoint, which is what a rank-0 save asks for); ``best`` stays per rank in this fact, so
any later stop that reads it is agreed in turn, and the patience counter the agreed branch steers is
one value everywhere.

Read-only, over ``distify.facts.Facts`` and the anatomy's loaders.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, List, Optional, Set

import libcst as cst

from distify.facts import stmt_bindings
from distify.names import qualified
from distify.rank_input import training_draws
from distify.sums import COLLECTIVES
from distify.syntax import Scope, all_nodes, dotted, names
from distify.values import Value

if TYPE_CHECKING:  # pragma: no cover
    from distify.anatomy import Anatomy

# calls that end the process: a way out of every loop around them
EXITS = frozenset({"sys.exit", "builtins.exit", "builtins.quit", "os._exit"})
_NONE: FrozenSet[int] = frozenset()


class Stop(Value):
    __slots__ = ("exit", "loop", "tests")
    exit: cst.CSTNode  # the break, return or exit statement; the loop itself for a `while` test
    loop: cst.CSTNode  # the loop that trains and that it leaves
    tests: tuple  # the `if`/`while` statements whose test reads a per-rank value, outermost first

    def __init__(self, exit: cst.CSTNode, loop: cst.CSTNode, tests: tuple) -> None:
        self._set(exit, loop, tests)


def per_rank_stops(a: "Anatomy") -> List[Stop]:
    """Every way out of a loop that trains under conditions of which at least one reads a per-rank
    value (none under a rank condition: that is another fault). Two rounds: a test the first round
    finds is agreed, so the names bound under it are no longer per rank for the second (the patience
    counter of an agreed ``if val < best``), and only the tests still per rank then are returned."""
    first = _stops(a, _NONE)
    if not first:
        return first
    return _stops(a, frozenset(id(t) for s in first for t in s.tests))


def _stops(a: "Anatomy", settled: FrozenSet[int]) -> List[Stop]:
    facts = a.facts
    out: List[Stop] = []
    loops = {id(x) for x in facts.training_loops() if _runs_backward(facts, x, 0)}
    cache: Dict[int, FrozenSet[str]] = {}
    scope_of = facts.stmt_scope.get

    def tainted_in(stmt: cst.CSTNode) -> FrozenSet[str]:
        scope = scope_of(stmt)
        if id(scope) not in cache:
            cache[id(scope)] = per_rank_names(a, scope, settled=settled)
        return cache[id(scope)]

    for stmt in facts.statements():
        if isinstance(stmt, cst.While) and id(stmt) in loops and not facts.in_rank_guard(stmt):
            if per_rank_value(a, scope_of(stmt), stmt.test, tainted_in(stmt), 0, settled) and not _agreed(a, stmt.test):
                out.append(Stop(stmt, stmt, (stmt,)))
            continue
        kind = _exit_kind(a, stmt)
        if kind is None:
            continue
        parents = facts.stmt_parent.get(stmt, ())
        enclosing = [i for i, p in enumerate(parents) if isinstance(p, (cst.For, cst.While))]
        if not enclosing:
            loop = _called_from_training(facts, stmt, loops) if kind == "exit" else None
            tests = tuple(
                p for p in parents
                if loop is not None and isinstance(p, cst.If) and not _agreed(a, p.test)
                and per_rank_value(a, scope_of(stmt), p.test, tainted_in(stmt), 0, settled)
            )
            if tests:
                out.append(Stop(stmt, loop, tests))
            continue
        # a break leaves the innermost loop; a return (or an exit) every loop of its function
        at = enclosing[-1] if kind == "break" else next(
            (i for i in enclosing if id(parents[i]) in loops), enclosing[-1])
        loop = parents[at]
        if id(loop) not in loops or facts.in_rank_guard(stmt):
            continue
        tainted = tainted_in(stmt)
        tests = tuple(
            p for p in parents[at + 1:]
            if isinstance(p, cst.If) and not _agreed(a, p.test)
            and per_rank_value(a, scope_of(stmt), p.test, tainted, 0, settled)
        )
        if tests:
            out.append(Stop(stmt, loop, tests))
    return out


def _called_from_training(facts, stmt: cst.CSTNode, loops) -> Optional[cst.CSTNode]:
    """The loop that trains around the calls of `stmt`'s function (``check(loss)`` in the batch
    loop, whose ``sys.exit`` ends the process), when every call of it is in such a loop and runs on
    every rank (an agreement in a function some ranks skip would wait for them); None otherwise."""
    fn = facts.stmt_scope.get(stmt)
    sites = facts.callers(fn) if isinstance(fn, cst.FunctionDef) else []
    found = None
    for site in sites:
        around = [p for p in facts.stmt_parent.get(site.stmt, ()) if id(p) in loops]
        if not around or facts.runs_on_some_ranks(site.stmt):
            return None
        found = found or around[0]
    return found


def _exit_kind(a: "Anatomy", stmt: cst.CSTNode) -> Optional[str]:
    """"break", "return" or "exit" (``sys.exit(...)``, ``raise SystemExit``) for a statement that
    leaves a loop; None for any other."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and stmt.body else None
    if isinstance(small, cst.Break):
        return "break"
    if isinstance(small, cst.Return):
        return "return"
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        return "exit" if _qualified(a, small.value.func) in EXITS else None
    if isinstance(small, cst.Raise) and small.exc is not None:
        exc = small.exc.func if isinstance(small.exc, cst.Call) else small.exc
        return "exit" if _qualified(a, exc) == "builtins.SystemExit" else None
    return None


def _qualified(a: "Anatomy", expr: cst.BaseExpression) -> Optional[str]:
    return qualified(a.aliases, expr, a.name_bindings)


def _runs_backward(facts, node: cst.CSTNode, depth: int) -> bool:
    """`node` (a loop, a function) calls ``backward()``, itself or through a function of the script:
    the gradient all-reduce every rank must join (an ``env.step(action)`` is no such step)."""
    body = node.body if isinstance(node, cst.FunctionDef) else node
    scope = node if isinstance(node, cst.FunctionDef) else facts.stmt_scope.get(node)
    for n in all_nodes(body, skip_nested=True):
        if not isinstance(n, cst.Call):
            continue
        if isinstance(n.func, cst.Attribute) and n.func.attr.value == "backward":
            return True
        fn = facts.callee(n, scope) if scope is not None and depth < 3 else None
        if fn is not None and fn is not scope and _runs_backward(facts, fn, depth + 1):
            return True
    return False


def reads_any(expr: cst.CSTNode, tainted: FrozenSet[str]) -> bool:
    """`expr` reads one of `tainted` (a name, or a dotted name it spells in full)."""
    if any(n.value in tainted for n, how in names(expr) if how == "load"):
        return True
    return any(dotted(n) in tainted for n in all_nodes(expr) if isinstance(n, cst.Attribute))


def _agreed(a: "Anatomy", test: cst.BaseExpression) -> bool:
    """The test calls a collective already (``runtime.agree(...)``, an all-reduce): one value everywhere."""
    return any(
        isinstance(n, cst.Call) and (a.qualname(n.func) or "").startswith(COLLECTIVES) for n in all_nodes(test)
    )


def per_rank_names(
    a: "Anatomy", scope: Scope, depth: int = 0, seed: FrozenSet[str] = frozenset(), settled: FrozenSet[int] = _NONE,
    clean: FrozenSet[str] = frozenset(),
) -> FrozenSet[str]:
    """The names of `scope` that may hold a per-rank value (see the module's docstring). `seed`:
    names known to be per rank already (the parameters one call binds to per-rank values);
    `settled`: ids of the ``if``/``while`` statements whose test will be agreed; `clean`: names a
    rule reduces across ranks before the reads in question (DST206's sums after their loop)."""
    facts = a.facts
    tainted: Set[str] = ({ref for ld in a.loaders for s, ref in ld.refs if s is scope} | set(seed)) - set(clean)
    if isinstance(scope, cst.FunctionDef) and depth < 3:
        for site in facts.callers(scope):
            outer = per_rank_names(a, site.scope, depth + 1, settled=settled)
            for p in facts.params(scope):
                value = facts.bound_value(site.call, scope, p)
                if value is not None and reads_any(value, outer):
                    tainted.add(p)

    def per_rank(value: cst.CSTNode) -> bool:
        return per_rank_value(a, scope, value, frozenset(tainted), depth, settled)

    def keeps(stmt: cst.CSTNode, call: cst.Call) -> Optional[bool]:
        """Whether the method of a class of the script that `call` runs on an instance keeps a
        per-rank value on it; None when the call runs no such method."""
        method = _instance_method(a, scope, stmt, call)
        if method is None or depth >= 3:
            return None
        values = {p: facts.bound_value(call, method, p) for p in facts.params(method)}
        bound = frozenset(p for p, v in values.items() if v is not None and per_rank(v))
        if not bound:
            return False
        instance = method.params.params[0].name.value if method.params.params else None
        inside = per_rank_names(a, method, depth + 1, bound, settled)
        return instance is not None and any(n.startswith(f"{instance}.") for n in inside)

    def steered(stmt: cst.CSTNode) -> bool:
        """`stmt` runs under an ``if``/``while`` of its scope whose test is per rank, not agreed."""
        return any(
            isinstance(p, (cst.If, cst.While)) and id(p) not in settled
            and per_rank(p.test) and not _agreed(a, p.test)
            for p in facts.stmt_parent.get(stmt, ())
        )

    changed = True
    while changed:
        changed = False
        for s in facts.statements(scope):
            for name in _taints(s, per_rank, keeps, steered(s)):
                if name not in tainted and name not in clean:
                    tainted.add(name)
                    changed = True
    return frozenset(tainted)


def per_rank_value(
    a: "Anatomy", scope: Scope, value: cst.CSTNode, tainted: FrozenSet[str], depth: int = 0,
    settled: FrozenSet[int] = _NONE,
) -> bool:
    """`value`, an expression of `scope`, may differ between ranks: it reads a name of `tainted`
    (``per_rank_names``), holds a draw of the training path, or calls a function of the script that
    returns a per-rank value (``select_action(state)`` of a draw, ``converged(model)`` returning
    under a test on a loss)."""
    if reads_any(value, tainted):
        return True
    draws = _draws(a)
    for n in all_nodes(value):
        if id(n) in draws:
            return True
        if isinstance(n, cst.Call) and depth < 3:
            fn = a.facts.callee(n, scope)
            if fn is not None and fn is not scope and _returns_per_rank(a, fn, depth + 1, settled):
                return True
    return False


def _instance_method(a: "Anatomy", scope: Scope, stmt: cst.CSTNode, call: cst.Call) -> Optional[cst.FunctionDef]:
    """The method of a module-level class of the script that `call` runs on an instance the scope
    bound from that class: ``stopper(loss)`` (its ``__call__``) or ``stopper.update(loss)`` after
    ``stopper = EarlyStopping(...)``; None otherwise."""
    func = call.func
    if isinstance(func, cst.Name):
        receiver, name = func.value, "__call__"
    elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        receiver, name = func.value.value, func.attr.value
    else:
        return None
    facts = a.facts
    if scope is None:
        return None
    made = facts.instance_call(scope, receiver, stmt)
    cls_name = dotted(made.func) if made is not None else None
    if cls_name is None:
        return None
    cls_name = facts.functions.local(cls_name)
    for method, cls in facts.methods.items():
        if cls.name.value == cls_name and method.name.value == name and isinstance(facts.stmt_scope.get(cls), cst.Module):
            return method
    return None


def _draws(a: "Anatomy") -> FrozenSet[int]:
    """The ids of the training path's random draws, found once per analysis (every scope and every
    function `per_rank_names` follows asks)."""
    return a.facts.memo(("early_stop.draws",), lambda: frozenset(id(c) for c in training_draws(a)))


def _returns_per_rank(a: "Anatomy", fn: cst.FunctionDef, depth: int, settled: FrozenSet[int] = _NONE) -> bool:
    """A ``return`` of `fn` hands back a per-rank value, or returns under a per-rank test
    (``if loss < tol: return True``). Asked for every call of `fn` the fixed point meets: once."""
    return a.facts.memo(("early_stop.returns", id(fn), depth, settled), lambda: _returns(a, fn, depth, settled))


def _returns(a: "Anatomy", fn: cst.FunctionDef, depth: int, settled: FrozenSet[int]) -> bool:
    inside = per_rank_names(a, fn, depth, settled=settled)
    facts = a.facts
    for s in facts.statements(fn):
        small = s.body[0] if isinstance(s, cst.SimpleStatementLine) and s.body else None
        if not isinstance(small, cst.Return):
            continue
        if small.value is not None and per_rank_value(a, fn, small.value, inside, depth, settled):
            return True
        if any(
            isinstance(p, (cst.If, cst.While)) and not _agreed(a, p.test)
            and per_rank_value(a, fn, p.test, inside, depth, settled)
            for p in facts.stmt_parent.get(s, ())
        ):
            return True
    return False


def _taints(stmt: cst.CSTNode, per_rank, keeps: Callable, steered: bool) -> List[str]:
    """The names `stmt` binds from a value that is `per_rank` (every name it binds when it is
    `steered` by a per-rank test)."""
    if isinstance(stmt, cst.SimpleStatementLine):
        out: List[str] = []
        for small in stmt.body:
            value: Optional[cst.CSTNode] = None
            targets: List[cst.CSTNode] = []
            if isinstance(small, cst.Assign):
                value, targets = small.value, [t.target for t in small.targets]
            elif isinstance(small, (cst.AugAssign, cst.AnnAssign)) and small.value is not None:
                value, targets = small.value, [small.target]
            if value is not None and (steered or per_rank(value)):
                for t in targets:
                    if isinstance(t, cst.Subscript):
                        # losses[k] = loss.item(): the container now holds the per-rank value
                        t = t.value
                    d = dotted(t)
                    out += [d] if d is not None else [n.value for n, how in names(t, "store") if how == "store"]
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                call = small.value
                kept = keeps(stmt, call)
                if kept is not None:
                    # early_stopping(val_loss, model): the script's own method says what it keeps
                    out += [call.func.value] if kept and isinstance(call.func, cst.Name) else []
                    out += [dotted(call.func.value)] if kept and isinstance(call.func, cst.Attribute) else []
                elif isinstance(call.func, cst.Attribute) and any(per_rank(x.value) for x in call.args):
                    # rewards.append(reward): the receiver now holds the per-rank value
                    d = dotted(call.func.value)
                    out += [d] if d is not None else []
        return out
    if isinstance(stmt, cst.For) and per_rank(stmt.iter):
        target = stmt.target
        if (
            isinstance(stmt.iter, cst.Call)
            and dotted(stmt.iter.func) == "enumerate"
            and isinstance(target, cst.Tuple)
            and len(target.elements) == 2
        ):
            target = target.elements[1].value  # the count enumerate adds is the same on every rank
        return [n.value for n, how in names(target, "store") if how == "store"]
    if isinstance(stmt, cst.With):
        return [
            name for item in stmt.items if item.asname is not None and per_rank(item.item)
            for name, _, _ in stmt_bindings(stmt)
        ]
    return []


def per_rank_branches(a: "Anatomy", stmt: cst.CSTNode) -> List[cst.If]:
    """The ``if`` statements of `stmt`'s scope around it whose test reads a per-rank value (a loss
    each rank measures on its own batches: ``if losses["val"] < best_val_loss:``), outermost first;
    none that reads the rank (a rank-0 guard is another fault), calls a collective already, or that
    ``per_rank_stops`` has agreed (DST207 wraps it). A collective a migration puts under such a
    branch (FSDP's full-state gather of a checkpoint) is reached by some ranks only: they hang."""
    facts = a.facts
    scope = facts.stmt_scope.get(stmt)
    settled = {id(t) for s in per_rank_stops(a) for t in s.tests}
    branches = [
        p for p in facts.stmt_parent.get(stmt, ())
        if isinstance(p, cst.If) and facts.stmt_scope.get(p) is scope and id(p) not in settled
        and not a.reads_rank(p.test) and not _agreed(a, p.test)
    ]
    if not branches:
        return []
    tainted = per_rank_names(a, scope)
    return [p for p in branches if per_rank_value(a, scope, p.test, tainted)]


def per_rank_scheduler_metrics(a: "Anatomy", reduced=()) -> List[cst.BaseExpression]:
    """The metrics handed to ``step`` of a scheduler that decides from one
    (``library.METRIC_SCHEDULERS``: ``ReduceLROnPlateau``) that read a per-rank value
    (``scheduler.step(losses["val"])`` with each rank's own estimate). Each rank would cut its own
    learning rate at its own time: the averaged gradients then move the ranks' weights apart,
    silently. The scheduler is the one the receiver is bound to in the step's scope (or at module
    level, read from a function that does not bind the name). `reduced`: (scope, name, loop) of the
    sums a rule reduces after their loop (``Plan.reduced``): a metric computed from them after it is
    alike everywhere, and reducing it again would reduce it twice."""
    from distify.library import METRIC_SCHEDULERS
    from distify.records import assigned_name

    facts = a.facts
    made: Dict[tuple, bool] = {}
    for c in a.calls:
        if c.qualname in METRIC_SCHEDULERS:
            name = assigned_name(c.stmt, c.call)
            if name is not None:
                made[(id(c.scope), name)] = True
    if not made:
        return []
    module = next((s for s in facts.stmt_scope.values() if isinstance(s, cst.Module)), None)
    out: List[cst.BaseExpression] = []
    cache: Dict[tuple, FrozenSet[str]] = {}
    for c in a.calls:
        func = c.call.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "step":
            continue
        recv = dotted(func.value)
        if recv is None:
            continue
        local = (id(c.scope), recv) in made
        global_ = (module is not None and (id(module), recv) in made and "." not in recv
                   and recv not in a.bindings(c.scope))
        if not (local or global_):
            continue
        metric = next((x.value for x in c.call.args if x.keyword is None or x.keyword.value == "metrics"), None)
        if metric is None or _agreed(a, metric) or facts.in_rank_guard(c.stmt):
            continue
        clean = frozenset(n for scope, n, loop in reduced if scope is c.scope and a.is_before(loop, c.stmt)) | (
            _reduced_before(a, c.scope, c.stmt))
        key = (id(c.scope), clean)
        if key not in cache:
            cache[key] = per_rank_names(a, c.scope, clean=clean)
        if per_rank_value(a, c.scope, metric, cache[key]):
            out.append(metric)
    return out


def _reduced_before(a: "Anatomy", scope: Scope, stmt: cst.CSTNode) -> FrozenSet[str]:
    """Names `scope` binds from a collective before `stmt` (``losses = runtime.reduce_each(losses)``,
    as distify's own output has it): alike on every rank from there on."""
    out = set()
    for s in a.facts.statements(scope):
        small = s.body[0] if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 else None
        if (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Call)
                and _agreed(a, small.value) and a.is_before(s, stmt)):
            out.update(n.value for n, how in names(small.targets[0].target, "store") if how == "store")
    return frozenset(out)
