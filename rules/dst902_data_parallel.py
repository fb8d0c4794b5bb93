"""DST902 nn.DataParallel is not combined with DDP."""

from __future__ import annotations

from distify.anatomy import DATA_PARALLEL
from distify.rules.base import Context, Rule


class DataParallelAdvisory(Rule):
    """Stop at ``nn.DataParallel``: the script is left unchanged.

    What it does:
        Reports each ``nn.DataParallel(...)`` and leaves the whole file as it is.

    Why:
        DataParallel splits a batch over the GPUs of one process; inside a DDP job each process
        owns one GPU, so the two must not be stacked. Remove the DataParallel line and run distify
        again: the model then gets ``DistributedDataParallel``.

    Example:
        model = nn.DataParallel(model)   # DST902: remove, then re-run distify
    """

    code = "DST902"
    name = "data-parallel"
    summary = "nn.DataParallel: file left unchanged"

    def apply(self, ctx: Context) -> None:
        for site in ctx.anatomy.calls_to(DATA_PARALLEL):
            ctx.block(self.code, site.call, "nn.DataParallel: file not migrated; remove it and re-run distify to get DDP")


RULE = DataParallelAdvisory()
