"""DST908 model moved to its device after the optimizer is built."""

from __future__ import annotations

import libcst as cst

from distify.syntax import dotted
from distify.rules.base import Context, Rule


class DeviceAfterOptimizer(Rule):
    """Wrap a model moved to its device after its optimizer once it is there; refuse a later move.

    What it does:
        ``optimizer = optim.Adam(model.parameters())`` followed by ``model = model.to(device)``
        (or ``model.cuda()``) before the training loops: the DDP wrap (and with Horovod the
        ``DistributedOptimizer``) goes after the move. A move of a trained model inside or after
        a loop that follows the optimizer leaves the file unchanged with this warning.

    Why:
        ``Module.to()`` moves parameters in place: the optimizer keeps the very Parameter objects
        the module holds, on one GPU and with N. DDP must wrap the model once it sits on its device
        (its buckets and ``device_ids`` are the device's), and Horovod's gradient hooks belong on the
        moved parameters; both are set up after the move. A move once training has started is
        something else (a model moved between phases) that distify does not try to follow.

    Example:
        optimizer = optim.SGD(model.parameters(), lr=0.1)
        model = model.to(device)

        becomes

        optimizer = optim.SGD(model.parameters(), lr=0.1)
        model = model.to(device)
        model = runtime.DDP(model, device_ids=runtime.device_ids())
    """

    code = "DST908"
    name = "device-after-optimizer"
    summary = "model moved after its optimizer: wrapped after the move, or file left unchanged"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        for opt in a.optimizers:
            places = {m.place for m in a.models if m.optimizer is opt}
            for root in opt.models:
                for site in a.calls:
                    if site.scope is not opt.call.scope or not isinstance(site.call.func, cst.Attribute):
                        continue
                    if site.call.func.attr.value not in ("to", "cuda") or dotted(site.call.func.value) != root:
                        continue
                    if not a.is_before(opt.call.stmt, site.stmt):
                        continue
                    if site.stmt in places:
                        ctx.report(
                            self.code,
                            site.call,
                            f"{root} reaches its device after its optimizer is built: the distributed "
                            "wrapping follows the move (Module.to keeps the optimizer's Parameter objects)",
                        )
                        continue
                    ctx.block(
                        self.code,
                        site.call,
                        f"{root} is moved to its device once training has started: file not migrated; "
                        "move the .to(device) above the optimizer",
                    )


RULE = DeviceAfterOptimizer()
