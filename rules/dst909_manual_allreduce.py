"""DST909 gradients all-reduced by hand."""

from __future__ import annotations

import libcst as cst

from distify.rules.base import FSDP_BACKEND, Context, Rule
from distify.grad_values import gradient_value

COLLECTIVES = {"torch.distributed.all_reduce", "torch.distributed.reduce", "horovod.torch.allreduce", "horovod.torch.allreduce_"}


class ManualAllreduce(Rule):
    """Warn about gradients the script all-reduces itself.

    What it does:
        Reports ``dist.all_reduce(p.grad ...)`` (or Horovod's ``allreduce``) applied to
        gradients; nothing is changed. With FSDP the file is left unchanged: the gradients are
        sharded DTensors there, and ``dist.all_reduce`` of one raises.

    Why:
        After the migration DDP (or ``hvd.DistributedOptimizer``) already averages every
        gradient during ``backward()``. A hand-written reduction on top does the communication a
        second time and, if it sums instead of averaging, multiplies the gradients by the number
        of processes. Remove it once the script is migrated.

    Example:
        for p in model.parameters():
            dist.all_reduce(p.grad)   # DST909: DDP already does this
    """

    code = "DST909"
    name = "manual-allreduce"
    summary = "hand-written gradient all-reduce"

    def apply(self, ctx: Context) -> None:
        for site in ctx.anatomy.calls:
            if site.qualname not in COLLECTIVES or not site.call.args:
                continue
            if gradient_value(ctx.anatomy.facts, site.call.args[0].value):
                if ctx.backend == FSDP_BACKEND:
                    ctx.block(
                        self.code,
                        site.call,
                        "gradients are all-reduced by hand: under FSDP they are sharded DTensors, which "
                        "dist.all_reduce cannot take (the script would crash), and fully_shard already "
                        "averages them; file not migrated: remove this reduction and re-run distify",
                    )
                    continue
                ctx.warn(
                    self.code,
                    site.call,
                    "gradients are all-reduced by hand: DDP/Horovod already average them; remove this reduction",
                )


RULE = ManualAllreduce()
