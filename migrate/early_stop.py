"""Early stops that each rank would decide alone: a ``break`` (or ``return``) out of a loop that
trains (runs ``backward()``: the gradient all-reduce every rank joins), under a condition that reads a value each rank computes from its own shard.

``if val_loss > best: patience += 1`` ... ``if patience >= limit: break``, ``if loss.item() < tol:
break``, ``if running_reward > threshold: print("Solved!"); break``: in one process the loop ends
once. On N ranks each evaluates the condition on its own numbers; one rank leaves the loop and the
others wait for it in the next all-reduce, forever. Where such a condition decides, every rank must
take one decision (the rules wrap the condition in ``runtime.agree``).

*Per rank* is a data-flow fact, over-approximated on purpose (agreeing on a value that is the same
everywhere costs one small all-reduce and changes nothing): a value is per rank when it is computed
from a loader (its batches, a function handed it: ``evaluate(model, val_loader)``) or from a random
draw on the training path (a policy's ``Categorical(probs).sample()``, which distify gives each rank
its own stream for, and so the rewards it earns), through any chain
of assignments, ``+=``, loop targets and the parameters a call binds. The index ``enumerate`` counts
is not (every rank runs as many batches), nor is anything read from arguments or literals.

Read-only, over ``distify.facts.Facts`` and the anatomy's loaders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Set

import libcst as cst

from distify.facts import stmt_bindings
from distify.rank_input import training_draws
from distify.sums import COLLECTIVES
from distify.syntax import Scope, all_nodes, dotted, names

if TYPE_CHECKING:  # pragma: no cover
    from distify.anatomy import Anatomy


@dataclass(frozen=True)
class Stop:
    exit: cst.CSTNode  # the break or return statement
    loop: cst.CSTNode  # the loop that trains and that it leaves
    tests: tuple  # the `if` statements between them whose test reads a per-rank value, outermost first


def per_rank_stops(a: "Anatomy") -> List[Stop]:
    """Every break/return that leaves a loop that trains, under conditions of which at least one
    reads a per-rank value (none under a rank condition: that is another fault)."""
    facts = a.facts
    out: List[Stop] = []
    loops = {id(x) for x in facts.training_loops() if _runs_backward(facts, x, 0)}
    cache: Dict[int, FrozenSet[str]] = {}
    for stmt in facts.statements():
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and stmt.body else None
        if not isinstance(small, (cst.Break, cst.Return)):
            continue
        parents = facts.stmt_parent.get(stmt, ())
        enclosing = [i for i, p in enumerate(parents) if isinstance(p, (cst.For, cst.While))]
        if not enclosing:
            continue
        # a break leaves the innermost loop; a return every loop of its function
        at = enclosing[-1] if isinstance(small, cst.Break) else next(
            (i for i in enclosing if id(parents[i]) in loops), enclosing[-1])
        loop = parents[at]
        if id(loop) not in loops or facts.in_rank_guard(stmt):
            continue
        scope = facts.stmt_scope.get(stmt)
        if id(scope) not in cache:
            cache[id(scope)] = per_rank_names(a, scope)
        tainted = cache[id(scope)]
        tests = tuple(
            p for p in parents[at + 1:]
            if isinstance(p, cst.If) and reads_any(p.test, tainted) and not _agreed(a, p.test)
        )
        if tests:
            out.append(Stop(stmt, loop, tests))
    return out


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


def per_rank_names(a: "Anatomy", scope: Scope, depth: int = 0) -> FrozenSet[str]:
    """The names of `scope` that may hold a per-rank value (see the module's docstring)."""
    facts = a.facts
    tainted: Set[str] = {ref for ld in a.loaders for s, ref in ld.refs if s is scope}
    draws = _draws(a)
    if isinstance(scope, cst.FunctionDef) and depth < 3:
        for site in facts.callers(scope):
            outer = per_rank_names(a, site.scope, depth + 1)
            for p in facts.params(scope):
                value = facts.bound_value(site.call, scope, p)
                if value is not None and reads_any(value, outer):
                    tainted.add(p)

    def per_rank(value: cst.CSTNode) -> bool:
        if reads_any(value, frozenset(tainted)):
            return True
        for n in all_nodes(value):
            if id(n) in draws:
                return True
            if isinstance(n, cst.Call) and depth < 3:
                fn = facts.callee(n, scope)
                if fn is not None and fn is not scope and _returns_per_rank(a, fn, depth + 1):
                    return True  # `action, log_prob = select_action(state)` of a draw
        return False

    changed = True
    while changed:
        changed = False
        for s in facts.statements(scope):
            for name in _taints(s, per_rank):
                if name not in tainted:
                    tainted.add(name)
                    changed = True
    return frozenset(tainted)


def _draws(a: "Anatomy") -> FrozenSet[int]:
    """The ids of the training path's random draws, found once per analysis (every scope and every
    function `per_rank_names` follows asks)."""
    return a.facts.memo(("early_stop.draws",), lambda: frozenset(id(c) for c in training_draws(a)))


def _returns_per_rank(a: "Anatomy", fn: cst.FunctionDef, depth: int) -> bool:
    """A ``return`` of `fn` hands back a per-rank value."""
    inside = per_rank_names(a, fn, depth)
    draws = _draws(a)
    return any(
        isinstance(n, cst.Return) and n.value is not None
        and (reads_any(n.value, inside) or any(id(x) in draws for x in all_nodes(n.value)))
        for n in all_nodes(fn.body, skip_nested=True)
    )


def _taints(stmt: cst.CSTNode, per_rank) -> List[str]:
    """The names `stmt` binds from a value that is `per_rank`."""
    if isinstance(stmt, cst.SimpleStatementLine):
        out: List[str] = []
        for small in stmt.body:
            value: Optional[cst.CSTNode] = None
            targets: List[cst.CSTNode] = []
            if isinstance(small, cst.Assign):
                value, targets = small.value, [t.target for t in small.targets]
            elif isinstance(small, (cst.AugAssign, cst.AnnAssign)) and small.value is not None:
                value, targets = small.value, [small.target]
            if value is not None and per_rank(value):
                for t in targets:
                    d = dotted(t)
                    out += [d] if d is not None else [n.value for n, how in names(t, "store") if how == "store"]
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                # rewards.append(reward): the receiver now holds the per-rank value
                call = small.value
                if isinstance(call.func, cst.Attribute) and any(per_rank(x.value) for x in call.args):
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
