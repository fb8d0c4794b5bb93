"""Micro-step loops: gradient accumulation written as an inner loop (nanoGPT's train.py).

    for micro_step in range(gradient_accumulation_steps):
        X, Y = get_batch("train")
        loss = model(X, Y) / gradient_accumulation_steps
        loss.backward()
    optimizer.step()

Every iteration of such a loop runs ``backward()`` and none steps an optimizer; the statement after
the loop that steps one is the step all of them feed. Under DDP / FSDP only the backward of the last
iteration needs to reduce the gradients (DST402): what the others accumulate locally is part of the
gradient that last reduction averages. That is exact only when the last iteration is the one that
runs last and always runs its backward, so the record says, from the loop's own code, how to tell
the last iteration (``micro_step == gradient_accumulation_steps - 1`` for a loop over ``range``), or
why it cannot be told. Nothing here reads how a name is spelled: the loop is found by what its body
calls and what follows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, FrozenSet, List, Optional, Sequence

import libcst as cst

from distify.gradients import block_of, calls_backward, reads_gradients
from distify.library import COUNTING_RANGES
from distify.names import qualname_or_builtin
from distify.records import CallSite, Scope
from distify.syntax import all_nodes, dotted
from distify.values import Record

if TYPE_CHECKING:
    from distify.anatomy import Anatomy

# builtins a loop's count may call without changing anything (`range(len(chunks))`)
_PURE_COUNT_CALLS = frozenset({"builtins.len", "builtins.int", "builtins.min", "builtins.max", "builtins.round"})
# operators that bind at least as tightly as the `- 1` written after the count
_TIGHT = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power, cst.MatrixMultiply)


class MicroStepLoop(Record):
    """An inner loop whose iterations all run backward() for the one optimizer step after it."""

    __slots__ = ("loop", "scope", "upto", "step", "var", "stop", "why_not", "__dict__")
    loop: cst.For
    scope: Scope
    upto: int  # index, in the loop's body, of the last statement that runs backward()
    step: CallSite  # the optimizer step the iterations feed (the first one after the loop)
    var: Optional[str]  # the loop variable, when the last iteration can be told
    stop: Optional[cst.BaseExpression]  # range's stop: the last iteration is `var == stop - 1`
    why_not: Optional[str]  # why the last iteration cannot be told (var and stop are then None)

    def __init__(self, loop: cst.For, scope: Scope, upto: int, step: CallSite, var: Optional[str],
                 stop: Optional[cst.BaseExpression], why_not: Optional[str]) -> None:
        self._set(loop, scope, upto, step, var, stop, why_not)

    def last_test(self, code, op: str = "==") -> Optional[str]:
        """`micro_step == n - 1` as source (`code` renders a node; `op` "!=" for every iteration but
        the last), None when the last iteration cannot be told."""
        if self.var is None or self.stop is None:
            return None
        if isinstance(self.stop, cst.Integer):
            return f"{self.var} {op} {int(self.stop.evaluated_value) - 1}"
        stop = code(self.stop)
        if isinstance(self.stop, cst.BinaryOperation) and not isinstance(self.stop.operator, _TIGHT):
            stop = f"({stop})"
        return f"{self.var} {op} {stop} - 1"


def micro_step_loops(a: "Anatomy") -> List[MicroStepLoop]:
    """Every micro-step loop of the script (see the module's docstring)."""
    steps = optimizer_steps(a)
    out: List[MicroStepLoop] = []
    seen = set()
    for site in a.calls:
        if not _is_backward(site) or not site.loops:
            continue
        loop = site.loops[-1]  # the innermost `for` around the backward
        if id(loop) in seen:
            continue
        seen.add(id(loop))
        found = _micro_step_loop(a, loop, site.scope, steps)
        if found is not None:
            out.append(found)
    return out


def optimizer_steps(a: "Anatomy") -> List[CallSite]:
    """`opt.step()` and `scaler.step(opt)` for every optimizer the script builds (its name as the
    step's scope spells it)."""
    targets = {o.site.target for o in a.optimizers if o.site.target is not None}
    out = []
    for site in a.calls:
        func = site.call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step" and a.qualname(func) is None):
            continue
        receiver = dotted(func.value)
        handed = [dotted(x.value) for x in site.call.args if x.keyword is None]
        if (receiver in targets and not site.call.args) or any(h in targets for h in handed):
            out.append(site)
    return out


def _is_backward(site: CallSite) -> bool:
    func = site.call.func
    return isinstance(func, cst.Attribute) and func.attr.value == "backward" and site.qualname is None


def _micro_step_loop(a: "Anatomy", loop: cst.For, scope: Scope, steps: Sequence[CallSite]) -> Optional[MicroStepLoop]:
    if not isinstance(loop.body, cst.IndentedBlock):
        return None
    body = list(loop.body.body)
    inside = list(all_nodes(loop.body, skip_nested=True))
    if any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in ("step", "zero_grad")
           for n in inside):
        return None  # something in the loop steps or clears: its iterations do not all feed one step
    step = _step_after(a, loop, steps)
    if step is None:
        return None
    upto = max((i for i, s in enumerate(body) if calls_backward(s)), default=None)
    if upto is None:
        return None

    def record(why_not: Optional[str], var=None, stop=None) -> MicroStepLoop:
        return MicroStepLoop(loop, scope, upto, step, var, stop, why_not)

    if _leaves_early(loop):
        return record("an iteration can skip its backward() or end the loop early (break, continue, return)")
    if not all(_unconditional(a, loop, s) for s in a.calls if _is_backward(s) and s.loops and s.loops[-1] is loop):
        return record("its backward() runs under a condition or a handler, so the last iteration may not run it")
    if reads_gradients(a, loop.body, scope) is not None:
        return record("it reads the gradients between its backward passes")
    it = loop.iter
    if not isinstance(it, cst.Call) or qualname_or_builtin(a, it.func) not in COUNTING_RANGES or not 1 <= len(it.args) <= 2 or any(x.keyword or x.star for x in it.args):
        return record("its last iteration cannot be told (it is not a loop over range(n) or range(a, b))")
    if not isinstance(loop.target, cst.Name):
        return record("its last iteration cannot be told (the loop variable is not a plain name)")
    stop = it.args[-1].value
    stored = _stored_names(loop.body)
    if not _plain_count(a, stop) or (_read_names(stop) | {loop.target.value}) & stored:
        return record("its count or its variable may change while it runs")
    return record(None, loop.target.value, stop)


def _step_after(a: "Anatomy", loop: cst.For, steps: Sequence[CallSite]) -> Optional[CallSite]:
    """The optimizer step in the statements after `loop` in its block, before any other backward():
    unconditional (the statement itself, or inside `with` blocks only)."""
    block = block_of(a, loop)
    if block is None:
        return None
    index = next(i for i, s in enumerate(block) if s is loop)
    for stmt in block[index + 1:]:
        mine = [s for s in steps if s.stmt is stmt or stmt in s.parents]
        if mine:
            site = mine[0]
            chain = site.parents[site.parents.index(stmt) + 1:] if stmt in site.parents else ()
            inner = (stmt,) + tuple(chain) if stmt is not site.stmt else ()
            return site if all(isinstance(p, cst.With) for p in inner) else None
        if calls_backward(stmt):
            return None
    return None


def _unconditional(a: "Anatomy", loop: cst.For, site: CallSite) -> bool:
    """The backward runs on every iteration of `loop` that runs to its end: only `with` blocks lie
    between the loop and its statement."""
    parents = site.parents
    if loop not in parents:
        return False
    return all(isinstance(p, cst.With) for p in parents[parents.index(loop) + 1:])


def _leaves_early(loop: cst.For) -> bool:
    """A break / continue of this loop, or a return / yield anywhere in its body."""

    def walk(node: cst.CSTNode, own: bool) -> bool:
        for child in node.children:
            if isinstance(child, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                continue
            if isinstance(child, (cst.Return, cst.Yield)):
                return True
            if own and isinstance(child, (cst.Break, cst.Continue)):
                return True
            if walk(child, own and not isinstance(child, (cst.For, cst.While))):
                return True
        return False

    return walk(loop.body, True)


def _plain_count(a: "Anatomy", expr: cst.BaseExpression) -> bool:
    """A count that reads values without changing anything: names, attributes, integers, constant
    subscripts, arithmetic and len()/int()/min()/max() of those."""
    if isinstance(expr, (cst.Name, cst.Integer)):
        return True
    if isinstance(expr, cst.Attribute):
        return _plain_count(a, expr.value)
    if isinstance(expr, cst.BinaryOperation):
        return _plain_count(a, expr.left) and _plain_count(a, expr.right)
    if isinstance(expr, cst.UnaryOperation):
        return _plain_count(a, expr.expression)
    if isinstance(expr, cst.Subscript):
        return _plain_count(a, expr.value) and all(
            isinstance(e.slice, cst.Index) and isinstance(e.slice.value, (cst.SimpleString, cst.Integer)) for e in expr.slice
        )
    if isinstance(expr, cst.Call):
        return qualname_or_builtin(a, expr.func) in _PURE_COUNT_CALLS and all(
            x.keyword is None and not x.star and _plain_count(a, x.value) for x in expr.args
        )
    return False


def _read_names(expr: cst.BaseExpression) -> FrozenSet[str]:
    return frozenset(n.value for n in all_nodes(expr) if isinstance(n, cst.Name))


def _stored_names(node: cst.CSTNode) -> FrozenSet[str]:
    """The roots of everything `node` binds or assigns to (`args` for `args.n = 2`)."""
    out = set()
    for n in all_nodes(node, skip_nested=True):
        targets = []
        if isinstance(n, cst.AssignTarget):
            targets.append(n.target)
        elif isinstance(n, (cst.AugAssign, cst.AnnAssign)):
            targets.append(n.target)
        elif isinstance(n, (cst.For, cst.CompFor)):
            targets.append(n.target)
        elif isinstance(n, cst.AsName):
            targets.append(n.name)
        elif isinstance(n, cst.NamedExpr):
            targets.append(n.target)
        for t in targets:
            out |= _read_names(t)
    return frozenset(out)
