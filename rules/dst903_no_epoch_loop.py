"""DST903 no epoch loop found for set_epoch."""

from __future__ import annotations

import libcst as cst

from distify.syntax import arg
from distify.rules.base import Context, Rule


class NoEpochLoop(Rule):
    """Warn when a sharded training loader has no epoch loop distify could find.

    What it does:
        Reports the loader; no ``set_epoch`` call is added.

    Why:
        Without ``sampler.set_epoch(epoch)`` at the start of each epoch a shuffling
        DistributedSampler repeats the same order every epoch. Distify looks for the loop around
        the batch loop, also through the functions and methods that contain it and through the
        names a helper's returned loaders are bound to; when the epochs are driven from elsewhere
        (a callback, a scheduler library), or the loader is reached in a way it does not follow
        (``get_loaders(args)[0]``), it cannot place the call.

    Example:
        train_loader.sampler.set_epoch(epoch)   # add at the start of each epoch
    """

    code = "DST903"
    name = "no-epoch-loop"
    summary = "epoch loop not found: set_epoch not added"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        for loader in a.loaders:
            if loader.role != "train" or loader.call.call is None or ctx.plan.samplers.get(loader, 0) == 0:
                continue  # only loaders DST201 gave a sampler
            if a.epoch_loops.get(loader):
                continue
            shuffle = arg(loader.call.call, 2, "shuffle")
            if shuffle is None or (isinstance(shuffle.value, cst.Name) and shuffle.value.value == "False"):
                continue  # a sampler that does not shuffle ignores the epoch
            ctx.warn(
                self.code,
                loader.call.call,
                f"no epoch loop found around {loader.target or 'this loader'}'s batch loop: "
                "call <loader>.sampler.set_epoch(epoch) at the start of each epoch",
            )


RULE = NoEpochLoop()
