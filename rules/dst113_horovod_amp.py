"""DST113 AMP GradScaler with Horovod."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import dotted
from distify.rules.base import HOROVOD_BACKEND, Context, Rule, call_statement

GRAD_SCALER = {"torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"}


class HorovodAmp(Rule):
    """Let Horovod finish the all-reduce before a GradScaler unscales and steps (Horovod).

    What it does:
        For ``scaler.step(optimizer)`` (and ``scaler.unscale_(optimizer)`` before it) on a Horovod
        optimizer, inserts ``optimizer.synchronize()`` before the first of the two and puts the
        step under ``with optimizer.skip_synchronize():``.

    Why:
        ``hvd.DistributedOptimizer.step()`` waits for the gradient all-reduce. The GradScaler
        must see the averaged gradients when it unscales them and checks for inf/NaN, so the wait
        has to happen before ``unscale_``; ``skip_synchronize`` then stops ``step`` from waiting a
        second time. Without it the scaler inspects half-reduced gradients and ranks can disagree
        about skipping a step.

    Example:
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
    summary = "synchronize before GradScaler unscale_/step with Horovod"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        optimizers = {o.target for o in ctx.plan.hvd_optimizers if o.target}
        scalers = set()
        for site in a.calls:
            if site.qualname in GRAD_SCALER and isinstance(site.stmt, cst.SimpleStatementLine):
                small = site.stmt.body[0]
                if isinstance(small, cst.Assign) and small.value is site.call:
                    scalers.add(dotted(small.targets[0].target))
        if not scalers:
            return
        synced = set()
        for site in a.calls:
            func = site.call.func
            if not isinstance(func, cst.Attribute) or dotted(func.value) not in scalers:
                continue
            if func.attr.value not in ("step", "unscale_") or not site.call.args:
                continue
            opt = dotted(site.call.args[0].value)
            if opt not in optimizers or not call_statement(site.stmt, site.call):
                continue
            parents = a.stmt_parent.get(site.stmt, ())
            key = (opt, parents[-1] if parents else None)
            if key not in synced:
                synced.add(key)
                ctx.edits.insert_before(site.stmt, ctx.stmts(f"{opt}.synchronize()"))
            if func.attr.value == "step":
                def with_skip(node, opt=opt):
                    return cst.With(
                        items=[cst.WithItem(cst.parse_expression(f"{opt}.skip_synchronize()"))],
                        body=cst.IndentedBlock(body=[node.with_changes(leading_lines=())]),
                        leading_lines=node.leading_lines,
                    )

                ctx.edits.replace(site.stmt, with_skip)
            ctx.report(self.code, site.call, f"{opt} all-reduces before the GradScaler {func.attr.value}")


RULE = HorovodAmp()
