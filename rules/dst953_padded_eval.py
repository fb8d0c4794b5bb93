"""DST953 evaluation on a DistributedSampler, which pads the last shard."""

from __future__ import annotations

from distify.anatomy import Anatomy, arg
from distify.audit import loader_loops, sampler_of
from distify.rules.base import AuditCheck, Context


class PaddedEval(AuditCheck):
    """Evaluation must not run on a padding DistributedSampler.

    What it does:
        Part of the output audit (and of ``distify lint``). Reports a DataLoader that is only
        iterated by loops that do not train (an evaluation loader) and whose sampler is a
        ``DistributedSampler`` without ``drop_last=True``.

    Why:
        ``DistributedSampler`` makes every shard the same length by repeating samples from the
        start of the set: with 10 samples on 4 ranks, 2 samples are evaluated twice. Summed or
        averaged over ranks, the metrics are then those of a slightly different set, and on one
        rank alone they describe a quarter of it. distify's own evaluation sharding uses
        ``runtime.ShardSampler`` (every N-th sample, no padding) and sums the metrics.

    Example:
        val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set, shuffle=False))
        for x, y in val_loader:                # DST953
            correct += (model(x).argmax(1) == y).sum()

        fix: sampler=runtime.ShardSampler(val_set), then sum the metrics over ranks (or evaluate
        the whole set on every rank)
    """

    code = "DST953"
    name = "padded-eval-sampler"
    summary = "audit: evaluation on a padding DistributedSampler"

    def check(self, ctx: Context, a: Anatomy) -> None:
        loops = loader_loops(a)
        for loader in a.loaders:
            if not loops.get(loader) or any(trains for _loop, trains in loops[loader]):
                continue
            _, sampler = sampler_of(a, loader)
            if sampler is None:
                continue
            drop = arg(sampler, 5, "drop_last")
            if drop is not None and ctx.code(drop.value) == "True":
                continue
            ctx.warn(
                self.code,
                sampler,
                f"{loader.target or 'this loader'} evaluates on a DistributedSampler, which pads the last shard with "
                "repeated samples (metrics count them twice); use runtime.ShardSampler and sum the metrics over ranks, "
                "or evaluate the whole set",
            )


RULE = PaddedEval()
