"""DST953 evaluation on a DistributedSampler, which pads the last shard (FSDP: on uneven shards)."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import Anatomy
from distify.syntax import arg, dotted
from distify.parallel import loader_loops, sampler_of, sharded_models
from distify.rules.base import AuditCheck, Context


class PaddedEval(AuditCheck):
    """Evaluation must not run on a padding DistributedSampler.

    What it does:
        Part of the output audit (and of ``distify lint``). Reports a DataLoader that is only
        iterated by loops that do not train (an evaluation loader) and whose sampler is a
        ``DistributedSampler`` without ``drop_last=True``. In an FSDP script (a model sharded
        with ``fully_shard`` or FSDP1), also an evaluation loader sharded with
        ``runtime.ShardSampler``.

    Why:
        ``DistributedSampler`` makes every shard the same length by repeating samples from the
        start of the set: with 10 samples on 4 ranks, 2 samples are evaluated twice. Summed or
        averaged over ranks, the metrics are then those of a slightly different set, and on one
        rank alone they describe a quarter of it. distify's own evaluation sharding uses
        ``runtime.ShardSampler`` (every N-th sample, no padding) and sums the metrics. That is
        right for DDP, not for FSDP: ShardSampler's shards differ in length by one, so the ranks
        run different numbers of forward passes, and a sharded model's forward all-gathers its
        parameters with every rank: the rank with one batch more waits forever. Under FSDP each
        rank evaluates the whole set.

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
        sharded = a.flavour == "fsdp" and bool(sharded_models(a))
        for loader in a.loaders:
            if not loops.get(loader) or any(trains for _loop, trains in loops[loader]):
                continue
            _, sampler = sampler_of(a, loader)
            uneven = _shard_sampler(a, loader) if sharded else None
            if uneven is not None:
                ctx.warn(
                    self.code,
                    uneven,
                    f"{loader.target or 'this loader'} evaluates a sharded (FSDP) model on uneven shards: ranks run "
                    "different numbers of forward passes and FSDP's forward all-gathers with every rank (hang); "
                    "evaluate the whole set on every rank (no sampler)",
                )
                continue
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


def _shard_sampler(a: Anatomy, loader) -> "cst.Call | None":
    """The ``...ShardSampler(...)`` call a loader's sampler is (inline, or a name bound to one)."""
    s = arg(loader.call.call, 5, "sampler")
    if s is None:
        return None
    value = s.value
    if isinstance(value, cst.Name):
        b = a.reaching_binding(loader.call.scope, value.value, loader.call.stmt)
        if b is not None and b.kind == "assign" and isinstance(b.stmt, cst.SimpleStatementLine):
            small = b.stmt.body[0]
            if isinstance(small, cst.Assign):
                value = small.value
    if isinstance(value, cst.Call) and (dotted(value.func) or "").rsplit(".", 1)[-1] == "ShardSampler":
        return value
    return None


RULE = PaddedEval()
