"""DST306 torch.load maps onto the rank's device."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import LOAD
from distify.rules.base import Context, Rule, add_kwarg, kwarg_value


class LoadMapLocation(Rule):
    """Give ``torch.load`` a ``map_location`` for the rank's own device.

    What it does:
        Adds ``map_location=runtime.device()`` to ``torch.load(...)`` calls that have none.

    Why:
        A checkpoint saved from ``cuda:0`` is restored onto ``cuda:0`` by default: every rank
        then allocates on GPU 0 (out of memory, or silently slow), and a GPU checkpoint cannot be
        loaded on a CPU-only rank at all.

    Example:
        state = torch.load(args.resume)

        becomes

        state = torch.load(args.resume, map_location=runtime.device())
    """

    code = "DST306"
    name = "load-map-location"
    summary = "torch.load onto the rank's device"

    def apply(self, ctx: Context) -> None:
        for site in ctx.anatomy.calls_to(LOAD):
            positional = [x for x in site.call.args if x.keyword is None]
            if kwarg_value(site.call, "map_location") is not None or len(positional) > 1:
                continue
            dev = f"{ctx.runtime}.device()"
            ctx.edits.replace(site.call, lambda n, dev=dev: add_kwarg(n, "map_location", cst.parse_expression(dev)))
            ctx.report(self.code, site.call, f"torch.load maps tensors onto {dev}")


RULE = LoadMapLocation()
