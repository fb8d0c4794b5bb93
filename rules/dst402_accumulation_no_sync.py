"""DST402 one gradient reduction per optimizer step under gradient accumulation (DDP, FSDP)."""

from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from distify.syntax import dotted, all_nodes
from distify.micro_steps import micro_step_loops
from distify.names import row_of
from distify.rules.base import DDP_BACKEND, FSDP_BACKEND, Context, Rule, method_calls_in, names_in, reaching_scopes
from distify.walk import walk

# the ways a loop controls gradient sync itself: DDP's no_sync() and the flag it sets (nanoGPT assigns
# model.require_backward_grad_sync itself), FSDP2's switch
SYNC_CONTROLS = frozenset({"no_sync", "require_backward_grad_sync", "set_requires_gradient_sync"})


class AccumulationNoSync(Rule):
    """Skip the gradient all-reduce on micro-batches that do not step the optimizer (DDP, FSDP).

    What it does:
        In a batch loop that steps the optimizer under ``if (step + 1) % accum == 0:`` (also
        ``... or step + 1 == len(loader)``, or a name bound to either), puts the
        statements up to and including ``backward()`` under
        ``with model.no_sync() if (step + 1) % accum != 0 else contextlib.nullcontext():``.
        With FSDP (``--backend fsdp``) ``model.set_requires_gradient_sync((step + 1) % accum == 0)``
        goes before the micro-batch's first statement instead (FSDP2 has no ``no_sync()``), also
        true on the loop's last micro-batch (``or step + 1 == len(loader)``): FSDP holds unsynced
        gradients in buffers of its own that ``optimizer.zero_grad()`` does not clear, so a
        remainder micro-batch that never steps would otherwise leak into the next pass's first
        step. A loop whose last micro-batch cannot be told keeps reducing on every micro-batch.
        (With Horovod the same idiom becomes ``backward_passes_per_step``, see DST111.)

        Accumulation written as an inner loop of micro-steps (nanoGPT: ``for micro_step in
        range(n):`` running ``backward()`` on every iteration, the step after the loop;
        ``distify.micro_steps``) gets ``with model.no_sync() if micro_step != n - 1 else
        contextlib.nullcontext():`` around each micro-step up to its backward (FSDP:
        ``model.set_requires_gradient_sync(micro_step == n - 1)`` first in the loop): the last
        iteration always runs and reduces what all of them accumulated. A loop that can skip a
        backward or end early, a backward under a condition, a count the loop can change, a loop
        that is not over ``range`` or reads the gradients keeps reducing on every micro-step (an
        info line says why). ``no_sync()`` rather than nanoGPT's
        ``model.require_backward_grad_sync = ...``: a context that restores the flag, reached
        through a compiled wrapper as well, and the one-process ``runtime.DDP`` has it too. (With
        Horovod, DST111 averages the gradients once, before the step.)

    Why:
        DDP all-reduces every gradient at every ``backward()``. With accumulation only the last
        micro-batch before ``step()`` needs it: ``no_sync`` lets the others accumulate locally, so
        there is one all-reduce per optimizer step instead of one per micro-batch, with the same
        result. The forward pass must be inside the context too – DDP prepares the reduction there.
        FSDP reduce-scatters gradients in ``backward()`` unless told otherwise; with the sync off
        each rank accumulates its unsharded gradients until the micro-batch that steps.

    Example:
        for step, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / accum
            loss.backward()
            if (step + 1) % accum == 0:
                optimizer.step()

        becomes

        for step, (x, y) in enumerate(loader):
            with model.no_sync() if (step + 1) % accum != 0 else contextlib.nullcontext():
                loss = criterion(model(x), y) / accum
                loss.backward()
            if (step + 1) % accum == 0:
                optimizer.step()

        and with FSDP

        for step, (x, y) in enumerate(loader):
            model.set_requires_gradient_sync((step + 1) % accum == 0 or step + 1 == len(loader))
            loss = criterion(model(x), y) / accum
            ...

        and, micro-steps in an inner loop,

        for micro_step in range(n):
            X, Y = get_batch("train")
            loss = model(X, Y) / n
            loss.backward()
        optimizer.step()

        becomes

        for micro_step in range(n):
            with model.no_sync() if micro_step != n - 1 else contextlib.nullcontext():
                X, Y = get_batch("train")
                loss = model(X, Y) / n
                loss.backward()
        optimizer.step()
    """

    code = "DST402"
    name = "accumulation-no-sync"
    backends = frozenset({DDP_BACKEND, FSDP_BACKEND})
    summary = "all-reduce once per optimizer step under gradient accumulation"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        wrapped = ctx.plan.sharded() if ctx.backend == FSDP_BACKEND else ctx.plan.wrapped
        if not wrapped:
            return
        done = set()
        for loader in a.loaders:
            for bl in loader.batch_loops:
                if not bl.trains or bl.loop in done or not isinstance(bl.loop.body, cst.IndentedBlock):
                    continue
                done.add(bl.loop)
                self._loop(ctx, bl, wrapped)
        # a loop over range() whose iterations all feed the step after it; never one of the loops
        # above, which step inside (a loop fed by next(it) is both a batch loop and this)
        for ms in micro_step_loops(a):
            self._micro_steps(ctx, ms, wrapped)

    def _micro_steps(self, ctx: Context, ms, wrapped) -> None:
        """An inner loop whose iterations all feed the one step after it (distify.micro_steps):
        only its last iteration's backward reduces."""
        body = list(ms.loop.body.body)
        if _controls_sync(ms.loop.body):
            return
        models = self._models_here(ctx, ms.loop, ms.scope, wrapped)
        if len(models) != 1:
            return
        model = models[0]
        last = ms.last_test(ctx.code)
        why_not = ms.why_not
        if last is not None and any(_calls(s, model) for s in body[ms.upto + 1:]):
            # DDP prepares a reduction in the forward: one after the backward would escape the switch
            last, why_not = None, f"it calls {model} after its backward()"
        if last is None:
            ctx.report(
                self.code, ms.loop,
                f"gradients reduced on every micro-step of this loop (correct, slower): {why_not}",
                kind="info",
            )
            return
        if ctx.backend == FSDP_BACKEND:
            # the last micro-step always runs and syncs: nothing unsynced is left for the next step
            ctx.edits.insert_before(body[0], ctx.stmts(f"{model}.set_requires_gradient_sync({last})"))
            ctx.report(self.code, ms.loop, f"gradients reduced once per optimizer step, on the last micro-step ({model}.set_requires_gradient_sync({last}))")
            return
        contextlib = ctx.imported("contextlib", None, "contextlib")
        item = f"{model}.no_sync() if {ms.last_test(ctx.code, '!=')} else {contextlib}.nullcontext()"

        def make(stmts: List[cst.CSTNode], item=item) -> cst.CSTNode:
            return cst.With(items=[cst.WithItem(cst.parse_expression(item))], body=cst.IndentedBlock(body=stmts))

        ctx.edits.wrap(body[0], body[ms.upto], make)
        ctx.report(self.code, ms.loop, f"gradients all-reduced once per optimizer step, on the last micro-step ({model}.no_sync() on the others)")

    def _loop(self, ctx: Context, bl, wrapped) -> None:
        body = list(bl.loop.body.body)
        if _controls_sync(bl.loop.body):
            return
        found = _accumulation_if(ctx, body)
        if found is None:
            return
        step_if, steps_when = found
        k = _backward_index(body)
        if k is None or k >= body.index(step_if):
            return
        # the condition must not depend on names the micro-batch itself changes
        assigned = _assigned_names(body[: body.index(step_if)])
        if names_in(steps_when) & assigned:
            ctx.warn(
                self.code,
                step_if,
                "accumulation condition depends on values computed in the loop: no no_sync added; "
                "gradients are reduced on every micro-batch (correct, slower)",
            )
            return
        models = self._models_here(ctx, bl.loop, bl.scope, wrapped)
        if len(models) != 1:
            return
        model = models[0]
        if ctx.backend == FSDP_BACKEND:
            # sync when this micro-batch steps, and on the pass's last one: FSDP keeps unsynced
            # gradients in buffers of its own that optimizer.zero_grad() does not clear, so a
            # micro-batch left over at the end of the pass would leak into the next pass's step
            last = _last_micro_batch(ctx, bl.loop)
            if last is None:
                ctx.report(
                    self.code,
                    bl.loop,
                    "gradients reduced on every micro-batch (correct): the loop's last micro-batch cannot be told "
                    "(not `for i, batch in enumerate(loader)`), and FSDP would carry an unsynced remainder into the next step",
                    kind="info",
                )
                return
            steps = ctx.code(steps_when)
            if last.replace(" ", "") not in steps.replace(" ", ""):  # `... or step + 1 == len(loader)` already
                steps = f"{steps} or {last}"
            ctx.edits.insert_before(body[0], ctx.stmts(f"{model}.set_requires_gradient_sync({steps})"))
            ctx.report(
                self.code,
                bl.loop,
                f"gradients reduced once per optimizer step and on the pass's last micro-batch "
                f"({model}.set_requires_gradient_sync({steps}))",
            )
            return
        cond = _negate(ctx, steps_when)
        contextlib = ctx.imported("contextlib", None, "contextlib")
        item = f"{model}.no_sync() if {cond} else {contextlib}.nullcontext()"

        def make(stmts: List[cst.CSTNode], item=item) -> cst.CSTNode:
            return cst.With(items=[cst.WithItem(cst.parse_expression(item))], body=cst.IndentedBlock(body=stmts))

        ctx.edits.wrap(body[0], body[k], make)
        ctx.report(self.code, bl.loop, f"gradients all-reduced once per optimizer step ({model}.no_sync() on the other micro-batches)")

    def _models_here(self, ctx: Context, loop, scope, wrapped) -> List[str]:
        """Names of wrapped models the loop calls, in the loop's own scope."""
        called = set()

        class V(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> None:
                d = dotted(node.func)
                if d:
                    called.add(d)

        walk(loop.body, V())
        out = []
        for model, anchor in wrapped:
            for (scope_id, name), _ in reaching_scopes(ctx, model, anchor).items():
                if scope_id == id(scope) and name in called and name not in out:
                    out.append(name)
        return out


def _calls(node: cst.CSTNode, name: str) -> bool:
    """`node` calls `name(...)` (the model's forward)."""
    return any(isinstance(n, cst.Call) and dotted(n.func) == name for n in all_nodes(node))


def _controls_sync(body) -> bool:
    """The loop already controls gradient sync (in code, not a comment that says so)."""
    return any(isinstance(n, cst.Attribute) and n.attr.value in SYNC_CONTROLS for n in all_nodes(body))


def _last_micro_batch(ctx: Context, loop: cst.For) -> Optional[str]:
    """`i + 1 == len(loader)` for `for i, batch in enumerate(loader):` (None for other loops)."""
    it = loop.iter
    if not (isinstance(it, cst.Call) and len(it.args) == 1 and it.args[0].keyword is None):
        return None
    row = row_of(ctx.anatomy.qualname, it.func)
    if row is None or row.name != "builtins.enumerate":
        return None
    target = loop.target
    if not (isinstance(target, cst.Tuple) and target.elements and isinstance(target.elements[0].value, cst.Name)):
        return None
    return f"{target.elements[0].value.value} + 1 == len({ctx.code(it.args[0].value)})"


def _accumulation_if(ctx: Context, body) -> Optional[Tuple[cst.If, cst.BaseExpression]]:
    """The ``if`` of the loop body that steps an optimizer on the accumulation condition, with
    that condition as it can be evaluated where the micro-batch starts (``Facts.step_condition``:
    `(i + 1) % n == 0`, `... or i + 1 == len(loader)`, a name bound to either)."""
    for stmt in body:
        if isinstance(stmt, cst.If) and method_calls_in(stmt.body, "step"):
            found = ctx.anatomy.facts.step_condition(stmt.test, stmt)
            if found is not None:
                return stmt, found[0]
    return None


def _backward_index(body) -> Optional[int]:
    index = None
    for i, stmt in enumerate(body):
        if method_calls_in(stmt, "backward"):
            index = i
    return index


def _assigned_names(stmts) -> set:
    names = set()

    class V(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            names.update(names_in(node.target))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            names.update(names_in(node.target))

    for s in stmts:
        walk(s, V())
    return names


def _negate(ctx: Context, test: cst.BaseExpression) -> str:
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        op = test.comparisons[0].operator
        flipped = {cst.Equal: "!=", cst.NotEqual: "=="}.get(type(op))
        if flipped is not None:
            return f"{ctx.code(test.left)} {flipped} {ctx.code(test.comparisons[0].comparator)}"
    return f"not ({ctx.code(test)})"


RULE = AccumulationNoSync()
