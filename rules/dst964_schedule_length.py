"""DST964 a learning-rate schedule sized from the whole training set while each rank reads a shard."""

from __future__ import annotations

from distify.anatomy import Anatomy
from distify.schedule_length import whole_set_schedules
from distify.rules.base import AuditCheck, Context


class ScheduleLength(AuditCheck):
    """A schedule's length must count the batches each rank takes.

    What it does:
        Part of the output audit (and of ``distify lint``). Reports a call that takes the optimizer
        (a learning-rate schedule) when one of its other arguments is computed – directly or through
        names bound once before it – from ``len(dataset)`` of a training loader that a
        DistributedSampler shards (the dataset itself or ``loader.dataset``), and nothing in it reads
        the world size.

    Why:
        ``num_training_steps = len(train_dataset) // batch_size * epochs`` counts the batches of the
        whole set; with the loader sharded each rank takes 1/N of them, so the warmup and the decay
        stretch over N times the steps the run takes: the learning rate never reaches the end of its
        schedule, silently. ``len(train_loader)`` already counts one rank's batches.

    Example:
        num_training_steps = len(train_dataset) // args.batch_size * args.epochs   # DST964
        scheduler = get_linear_schedule_with_warmup(optimizer, 100, num_training_steps)

        fix: num_training_steps = len(train_loader) * args.epochs
    """

    code = "DST964"
    name = "schedule-length"
    summary = "audit: schedule sized from the whole training set"

    def check(self, ctx: Context, a: Anatomy) -> None:
        for site, length, data in whole_set_schedules(a):
            ctx.warn(
                self.code,
                length,
                f"{ctx.code(site.call.func)}() is sized from len({data}), the whole training set, but each rank "
                "takes only its shard's batches: the schedule spans world-size times the steps the run takes; "
                "size it from len() of the training loader (the batches of one rank) or divide by the world size",
            )


RULE = ScheduleLength()
