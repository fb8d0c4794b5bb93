"""DST113 gradients read before a Horovod step: AMP GradScaler, gradient clipping."""

from __future__ import annotations

import libcst as cst

from distify.syntax import dotted
from distify.constructed import made_by
from distify.gradients import gradient_reads_before, reads_gradients
from distify.library import GRAD_SCALERS
from distify.rules.base import HOROVOD_BACKEND, Context, Rule, call_statement


class HorovodAmp(Rule):
    """Let Horovod finish the all-reduce before anything reads the gradients: a GradScaler that
    unscales and steps, gradient clipping, any code between backward() and step() that reads
    ``.grad`` (Horovod).

    What it does:
        For ``scaler.step(optimizer)`` (and ``scaler.unscale_(optimizer)`` before it) on a Horovod
        optimizer, inserts ``optimizer.synchronize()`` before the first of the two and puts the
        step under ``with optimizer.skip_synchronize():``. The same for ``optimizer.step()`` when
        a statement between the backward() and the step reads the gradients
        (``torch.nn.utils.clip_grad_norm_(...)``, a ``p.grad`` read or write, a function of the
        script that does one of these): the synchronize goes before that statement. A read outside
        the block of a conditional step (clipping every pass, stepping every N passes) is refused:
        synchronizing on passes that do not step would average partial accumulations.

    Why:
        ``hvd.DistributedOptimizer.step()`` waits for the gradient all-reduce. The GradScaler
        must see the averaged gradients when it unscales them and checks for inf/NaN, so the wait
        has to happen before ``unscale_``; ``skip_synchronize`` then stops ``step`` from waiting a
        second time. Without it the scaler inspects half-reduced gradients and ranks can disagree
        about skipping a step.

    Example:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

        becomes

        loss.backward()
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with optimizer.skip_synchronize():
            optimizer.step()

        and

        scaler.scale(loss).backward()
        scaler.step(optimizer)

        becomes

        scaler.scale(loss).backward()
        optimizer.synchronize()
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
    """

    code = "DST113"
    name = "horovod-amp"
    backends = frozenset({HOROVOD_BACKEND})
    summary = "synchronize before the gradients are read (GradScaler, clipping) with Horovod"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        facts = a.facts
        # by key: the step in a method reads the optimizer its __init__ built, however each spells `self`
        optimizers = {facts.key(o.call.scope, o.target) for o in ctx.plan.hvd_optimizers if o.target}
        self._reads_before_step(ctx, optimizers)
        if ctx.blocked:
            return
        synced = set()
        for site in a.calls:
            func = site.call.func
            if not isinstance(func, cst.Attribute) or made_by(facts, site.scope, func.value, GRAD_SCALERS) is None:
                continue
            if func.attr.value not in ("step", "unscale_") or not site.call.args:
                continue
            opt = dotted(site.call.args[0].value)
            if facts.key(site.scope, opt) not in optimizers or not call_statement(site.stmt, site.call):
                continue
            parents = a.stmt_parent.get(site.stmt, ())
            key = (opt, parents[-1] if parents else None)
            if key not in synced:
                synced.add(key)
                ctx.edits.insert_before(site.stmt, ctx.stmts(f"{opt}.synchronize()"))
            if func.attr.value == "step":
                ctx.edits.replace(site.stmt, _skipping_synchronize(opt))
            ctx.report(self.code, site.call, f"{opt} all-reduces before the GradScaler {func.attr.value}")

    def _reads_before_step(self, ctx: Context, optimizers) -> None:
        a = ctx.anatomy
        for site in a.calls:
            func = site.call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "step" and not site.call.args):
                continue
            opt = dotted(func.value)
            if a.facts.key(site.scope, opt) not in optimizers or not call_statement(site.stmt, site.call) or not a.loops_around(site.stmt):
                continue
            inner, outer = gradient_reads_before(a, site.stmt)
            if outer is not None:
                ctx.block(
                    self.code,
                    reads_gradients(a, outer, a.scope_of(outer)) or outer,
                    f"the gradients are read here on every pass while {opt}.step() runs only under a condition: "
                    f"hvd.DistributedOptimizer averages them in the background until its step, and synchronizing "
                    f"on passes that do not step would average partial sums; file not migrated to Horovod (move the "
                    f"read next to the step, or use --backend ddp)",
                )
                return
            if inner is None:
                continue
            ctx.edits.insert_before(inner, ctx.stmts(f"{opt}.synchronize()"))
            ctx.edits.replace(site.stmt, _skipping_synchronize(opt))
            ctx.report(self.code, reads_gradients(a, inner, a.scope_of(inner)) or inner,
                       f"{opt} all-reduces before the gradients are read here (its step then skips the wait)")


def _skipping_synchronize(opt: str):
    """An edit putting a step statement under ``with <opt>.skip_synchronize():``."""
    def edit(node):
        return cst.With(
            items=[cst.WithItem(cst.parse_expression(f"{opt}.skip_synchronize()"))],
            body=cst.IndentedBlock(body=[node.with_changes(leading_lines=())]),
            leading_lines=node.leading_lines,
        )

    return edit


RULE = HorovodAmp()
