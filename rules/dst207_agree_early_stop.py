"""DST207 one early-stop decision for every rank."""

from __future__ import annotations

import libcst as cst

from distify.early_stop import per_rank_scheduler_metrics, per_rank_stops
from distify.rules.base import Context, Rule


class AgreeEarlyStop(Rule):
    """Take an early stop on every rank at once.

    What it does:
        Finds each ``break`` (``return``, ``sys.exit()``) that leaves a loop that trains under a
        condition reading a value each rank computes from its own shard (``distify.early_stop``: a
        loss, a validation metric, a running reward, a patience counter they feed, the flag an
        early-stopping object of the script keeps) and wraps that condition in
        ``runtime.agree(...)``: true on every rank when it is true on any. The conditions around
        the exit are agreed too, outermost first, so every rank reaches the inner one. The test of
        a ``while`` loop that trains is wrapped in ``runtime.agree_all(...)``: the loop goes on
        only while it would on every rank. The metric a scheduler decides from
        (``ReduceLROnPlateau.step(val_loss)``) that each rank measures on its own data becomes
        ``runtime.reduce_mean(val_loss)``: every rank cuts its learning rate at the same step.

    Why:
        Each rank evaluates the condition on its own numbers. One rank leaves the loop while the
        others go on into the next backward pass, whose gradient all-reduce then waits for the rank
        that left: the job hangs without an error. A value that is the same on every rank (reduced
        already) agrees with itself, at the cost of one small all-reduce.

    Example:
        if val_loss > best_loss:
            patience += 1
            if patience >= args.patience:
                break

        becomes

        if runtime.agree(val_loss > best_loss):
            patience += 1
            if runtime.agree(patience >= args.patience):
                break
    """

    code = "DST207"
    name = "agree-early-stop"
    summary = "one early-stop decision for every rank"

    def apply(self, ctx: Context) -> None:
        for metric in per_rank_scheduler_metrics(ctx.anatomy, ctx.plan.reduced):
            ctx.edits.call_around(metric, f"{ctx.runtime}.reduce_mean")
            ctx.report(
                self.code, metric,
                "the scheduler decides from a value each rank measures on its own data: runtime.reduce_mean "
                "hands every rank the average, so their learning rates (and weights) do not part",
            )
        done = set()
        for stop in per_rank_stops(ctx.anatomy):
            for test in stop.tests:
                if id(test) in done:
                    continue
                done.add(id(test))
                helper = "agree_all" if isinstance(test, cst.While) else "agree"
                ctx.edits.call_around(test.test, f"{ctx.runtime}.{helper}")
            if isinstance(stop.exit, cst.While):
                ctx.report(
                    self.code,
                    stop.exit,
                    "the test of this loop reads a value of each rank's own shard: runtime.agree_all goes on only "
                    "while it would on every rank, so no rank leaves the loop while the others wait for it",
                )
                continue
            ctx.report(
                self.code,
                stop.exit,
                f"the condition{'s' if len(stop.tests) > 1 else ''} of this early stop "
                f"(line{'s' if len(stop.tests) > 1 else ''} "
                f"{', '.join(str(ctx.anatomy.position(t)[0]) for t in stop.tests)}) read a value of each rank's own "
                "shard: runtime.agree takes one decision for every rank (true when any rank's is), so no rank "
                "leaves the loop while the others wait for it",
            )


RULE = AgreeEarlyStop()
