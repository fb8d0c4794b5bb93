"""DST901 training DataLoader with its own sampler."""

from __future__ import annotations

from distify.anatomy import arg
from distify.rules.base import Context, Rule


class CustomSampler(Rule):
    """Warn about a training DataLoader that already has a ``sampler`` or ``batch_sampler``.

    What it does:
        Reports the loader and leaves it unchanged.

    Why:
        A custom sampler (weighted, bucketing, a batch sampler) decides which samples a batch
        holds; wrapping it in a DistributedSampler would change its meaning. It has to shard by
        rank itself – e.g. draw indices from ``DistributedSampler(dataset)`` first, or take
        ``rank``/``world_size`` from ``runtime`` – and call ``set_epoch`` if it shuffles.

    Example:
        DataLoader(ds, batch_sampler=BucketSampler(ds, 32))   # DST901: shard it by rank yourself
    """

    code = "DST901"
    name = "custom-sampler"
    summary = "training loader with a custom sampler is not sharded automatically"

    def apply(self, ctx: Context) -> None:
        for loader in ctx.anatomy.loaders:
            if loader.role != "train" or ctx.anatomy.sampler_call(loader) is not None:
                continue
            if arg(loader.call.call, 5, "sampler") is not None or arg(loader.call.call, 6, "batch_sampler") is not None:
                ctx.warn(
                    self.code,
                    loader.call.call,
                    f"{loader.target or 'training DataLoader'} has its own sampler: not sharded; "
                    "make it draw from DistributedSampler or split indices by runtime.rank()",
                )


RULE = CustomSampler()
