"""DST912 an optimizer built before fully_shard that distify cannot move."""

from __future__ import annotations

from distify.rules.base import FSDP_BACKEND, Context, Rule


class OptimizerBeforeShard(Rule):
    """Refuse a file whose optimizer is built before the model is sharded and cannot be moved.

    What it does:
        DST121 moves an optimizer built before the point where the model is sharded (and the LR
        schedulers built from it) to right after ``fully_shard``. Where that is not safe – the
        optimizer is used in between (``optimizer.load_state_dict(...)``, a learning rate read), a
        name its construction reads is rebound in between, or it is built in another block or
        scope than the shard – the file is left unchanged with this warning.

    Why:
        ``fully_shard`` replaces every parameter by a sharded DTensor in place. An optimizer built
        before holds the old tensors: it raises no error and updates nothing, so the job trains
        nothing while looking healthy.

    Example:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer.load_state_dict(ckpt["optimizer"])
        model.to(device)                                    # DST912: the shard goes here

        build and load the optimizer after ``model.to(device)``, then re-run distify.
    """

    code = "DST912"
    name = "optimizer-before-shard"
    backends = frozenset({FSDP_BACKEND})
    summary = "optimizer built before fully_shard and not movable: file not migrated"

    def apply(self, ctx: Context) -> None:
        for call, why in ctx.plan.optimizer_before_shard:
            ctx.block(
                self.code,
                call,
                f"optimizer built before the model is sharded and not moved after fully_shard ({why}): file "
                "not migrated; an optimizer built before sharding updates nothing. Build it after the model "
                "is on its device",
            )


RULE = OptimizerBeforeShard()
