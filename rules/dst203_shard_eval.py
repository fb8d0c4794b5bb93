"""DST203 evaluation loops split the set across ranks and sum their metrics."""

from __future__ import annotations

from typing import Set

import libcst as cst

from distify.records import Loader, assigned_name
from distify.syntax import dotted
from distify.rules.base import Context, Rule, add_kwarg, loader_stem
from distify.rules.eval_plan import CODE, eval_plans


class ShardEval(Rule):
    """Split evaluation loaders across the ranks and sum the metrics of the shards.

    What it does:
        For an evaluation DataLoader whose loops only add per-sample sums into counters started
        from number literals before the loop (``correct += (pred == y).sum().item()``,
        ``total += y.size(0)``, ``test_loss += F.nll_loss(out, y, reduction="sum").item()``), gives
        the loader ``sampler=runtime.ShardSampler(dataset)`` (each rank takes every N-th sample, no
        padding) and inserts ``correct, total = runtime.all_reduce_sum(correct, total)`` right
        after each loop. Anything it cannot prove safe (a metric that is not a sum, per-batch
        results collected in a list, ``len(loader)`` as a denominator, prints or ``break`` in the
        loop, a rank check around the evaluation, a DDP forward with gradients enabled) leaves the
        loader whole, and DST201 says why in an info line.

        With FSDP evaluation loaders are left whole (every rank evaluates the full set): each FSDP
        forward is a collective, and uneven shards would give the ranks different numbers of them.

    Why:
        Evaluating the full set on every rank costs N times the work of one shard. Sharding alone
        would report one rank's numbers, and ``DistributedSampler`` pads the last shard with
        repeated samples, which distorts sums; non-padding shards plus one sum over the ranks give
        exactly the single-process totals on every rank.

    Example:
        test_loader = DataLoader(test_set, batch_size=64)
        ...
        for data, target in test_loader:
            correct += model(data).argmax(1).eq(target).sum().item()

        becomes

        test_sampler = runtime.ShardSampler(test_set)
        test_loader = DataLoader(test_set, batch_size=64, sampler=test_sampler)
        ...
        for data, target in test_loader:
            correct += model(data).argmax(1).eq(target).sum().item()
        correct = runtime.all_reduce_sum(correct)
    """

    code = CODE
    name = "shard-eval"
    summary = "shard evaluation loops and sum their metrics over ranks"

    def apply(self, ctx: Context) -> None:
        plans = eval_plans(ctx)
        reduced: Set[int] = set()
        for loader, plan in plans.items():
            if not plan.shard:
                continue
            self._shard_loader(ctx, loader)
            for loop in plan.loops:
                if id(loop.loop) in reduced:
                    continue
                reduced.add(id(loop.loop))
                names = ", ".join(loop.metrics)
                stmt = f"{names} = {ctx.runtime}.all_reduce_sum({names})"
                ctx.edits.insert_after(loop.loop, ctx.stmts(stmt))
                if isinstance(loop.scope, cst.FunctionDef):
                    ctx.gains_collective(loop.scope)  # `print(evaluate(...))` must now run on every rank
                ctx.report(
                    self.code,
                    loop.loop,
                    f"{names} summed over all ranks after the evaluation loop: the reported metrics cover the whole set",
                )

    def _shard_loader(self, ctx: Context, loader: Loader) -> None:
        call = loader.call.call
        ds_src = ctx.code(loader.dataset)
        if dotted(loader.dataset) is None:
            # a dataset built inline must exist once: name it before the sampler uses it
            hoist = ctx.fresh(loader_stem(loader.target) + "_dataset")
            ctx.edits.replace(loader.dataset, lambda n, h=hoist: cst.Name(h))
            ctx.edits.insert_before(loader.call.stmt, ctx.stmts(f"{hoist} = {ds_src}"))
            ds_src = hoist
        sampler = f"{ctx.runtime}.ShardSampler({ds_src})"
        if assigned_name(loader.call.stmt, call) is not None:
            # named on a line of its own, like the training loader's DistributedSampler
            name = ctx.fresh(loader_stem(loader.target) + "_sampler")
            ctx.edits.insert_before(loader.call.stmt, ctx.stmts(f"{name} = {sampler}"))
            sampler = name
        value = cst.parse_expression(sampler)
        ctx.edits.replace(call, lambda n, value=value: add_kwarg(n, "sampler", value))
        ctx.report(
            self.code,
            call,
            f"{loader.target} is sharded for evaluation with runtime.ShardSampler: "
            "each rank evaluates every N-th sample, without padding",
        )


RULE = ShardEval()
