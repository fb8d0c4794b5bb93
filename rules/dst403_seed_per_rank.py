"""DST403 per-rank random seed once the models are built (--seed-per-rank)."""

from __future__ import annotations

from functools import cmp_to_key
from typing import List, Optional

import libcst as cst

from distify.records import CallSite, EpochLoop
from distify.syntax import arg
from distify.rules.base import HOROVOD_BACKEND, Context, Rule, call_statement

SEEDERS = {"torch.manual_seed"}


class SeedPerRank(Rule):
    """With ``--seed-per-rank``, give each rank its own random stream after the models are built.

    What it does:
        Without the flag, reports (info) that ``torch.manual_seed(seed)`` stays the same on every
        rank. With the flag, and when the seed, every model and every optimizer are set up in the
        function that runs the epochs, inserts ``torch.manual_seed(seed + rank)`` right before the
        epoch loop, with a comment saying why. Anything else is reported and left alone.

    Why:
        Model initialisation must be identical on every rank, so the shared seed before the
        models is correct and is never changed (DDP and Horovod also broadcast rank 0's weights,
        but a per-rank seed before construction would still desynchronise buffers and any random
        state used before the broadcast). During training, though, a shared seed gives every rank
        the same dropout masks and the same random augmentations on its shard; re-seeding with
        ``seed + rank`` after construction makes them independent, as N separate GPUs would be.
        The data order is not affected: ``DistributedSampler`` has its own seed. It is opt-in
        because it changes the random numbers of a one-process run too.

    Example:
        torch.manual_seed(args.seed)
        model = Net().to(device)
        optimizer = optim.SGD(model.parameters(), lr=args.lr)
        for epoch in range(args.epochs):
            ...

        with --seed-per-rank becomes

        torch.manual_seed(args.seed)
        model = runtime.DDP(Net().to(device), device_ids=runtime.device_ids())
        optimizer = optim.SGD(model.parameters(), lr=args.lr)
        # distify --seed-per-rank: models are built; from here each rank draws its own random numbers
        torch.manual_seed(args.seed + dist.get_rank())
        for epoch in range(args.epochs):
            ...
    """

    code = "DST403"
    name = "seed-per-rank"
    summary = "re-seed each rank after the models are built (--seed-per-rank)"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        seeds = [s for s in a.calls_to(SEEDERS) if call_statement(s.stmt, s.call) and arg(s.call, 0, "seed") is not None]
        if not seeds or not a.models:
            return
        if any(_rank_seeded(ctx, s) for s in seeds):
            return  # done by an earlier run (or by hand)
        if not ctx.options.seed_per_rank:
            ctx.report(
                self.code, seeds[0].call,
                "torch.manual_seed kept the same on every rank (model initialisation must match); "
                "--seed-per-rank re-seeds each rank once the models are built",
                kind="info",
            )
            return
        placed = _place(ctx, seeds)
        if placed is None:
            ctx.warn(
                self.code, seeds[0].call,
                "--seed-per-rank: the seed, models, optimizers and epoch loop are not in one function "
                "in that order; re-seed with seed + rank by hand after the models are built",
            )
            return
        seed, loop = placed
        rank = f"{ctx.hvd}.rank()" if ctx.backend == HOROVOD_BACKEND else f"{ctx.dist}.get_rank()"
        value = arg(seed.call, 0, "seed").value
        text = ctx.code(value)
        if isinstance(value, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr, cst.Comparison)):
            text = f"({text})"
        call = f"{ctx.code(seed.call.func)}({text} + {rank})"
        comment = "# distify --seed-per-rank: models are built; from here each rank draws its own random numbers"
        ctx.edits.insert_before(loop.loop, ctx.stmts(f"{comment}\n{call}\n"))
        ctx.report(self.code, loop.loop, f"each rank re-seeded with {text} + its rank before the epoch loop")


def _rank_seeded(ctx: Context, site: CallSite) -> bool:
    return ctx.anatomy.reads_rank(arg(site.call, 0, "seed").value)


def _place(ctx: Context, seeds: List[CallSite]) -> Optional[tuple]:
    """The seed call and the epoch loop to re-seed before: one scope, seed < models < optimizers < loop."""
    a = ctx.anatomy
    loops: List[EpochLoop] = [ep for eps in a.epoch_loops.values() for ep in eps]
    for seed in seeds:
        candidates = {id(ep.loop): ep for ep in loops if ep.scope is seed.scope}.values()
        for loop in sorted(candidates, key=cmp_to_key(lambda x, y: -1 if a.is_before(x.loop, y.loop) else 1)):
            if not a.is_before(seed.stmt, loop.loop):
                continue
            setup = [m.place for m in a.models] + [m.assign for m in a.models] + [o.call.stmt for o in a.optimizers]
            if all(a.stmt_scope.get(s) is seed.scope and a.is_before(seed.stmt, s) and a.is_before(s, loop.loop) for s in setup):
                return seed, loop
    return None


RULE = SeedPerRank()
