"""DST959 batches drawn from a global random stream seeded alike on every rank."""

from __future__ import annotations

from distify.anatomy import Anatomy
from distify.syntax import arg
from distify.parallel import feeding_loaders
from distify.rank_input import INDEX_DRAWS as DRAWS, seeded_per_rank
from distify.rules.base import AuditCheck, Context


class SameRandomBatches(AuditCheck):
    """Batches drawn without a sampler must come from a per-rank random stream.

    What it does:
        Part of the output audit (and of ``distify lint``). When no DataLoader feeds training
        and a loop that trains (or a function it calls, such as a ``get_batch()``) draws indices
        with ``torch.randint``/``randperm``, ``numpy.random`` or ``random`` from the global
        stream, reports the draw unless some seed call reads the rank
        (``torch.manual_seed(1337 + rank)``) or the draw has its own ``generator=``.

    Why:
        Training scripts usually fix a seed (``torch.manual_seed(1337)``) so that every rank builds
        the same model; then every rank draws the same indices: N processes train on the same
        batches and the job does the work of one process at N times the cost. (A script that seeds
        nothing draws differently on each rank with torch 2.13, which seeds every process from the
        OS, but not on a torch whose default seed is a constant; the check does not rely on either.)

    Example:
        def get_batch():
            ix = torch.randint(len(data) - block, (batch_size,))   # DST959 in a DDP script
            ...

        fix: torch.manual_seed(seed + rank) once the model is built (DDP/Horovod broadcast rank
        0's weights, so a per-rank seed after that is safe)
    """

    code = "DST959"
    name = "same-random-batches"
    summary = "audit: random batches identical on every rank"

    def check(self, ctx: Context, a: Anatomy) -> None:
        if feeding_loaders(a):
            return
        if seeded_per_rank(a):
            return
        for c in a.calls_to(DRAWS):
            if arg(c.call, None, "generator") is not None or not a.on_training_path(c.stmt):
                continue
            ctx.warn(
                self.code,
                c.call,
                f"{ctx.code(c.call.func)}() draws the batch from the global random stream, seeded alike on every "
                "rank: all ranks train on the same samples; seed each rank differently once the model is built "
                "(torch.manual_seed(seed + rank)) or pass a per-rank generator=",
            )
            return


RULE = SameRandomBatches()
