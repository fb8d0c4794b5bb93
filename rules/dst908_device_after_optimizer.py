"""DST908 model moved to its device after the optimizer is built."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import dotted
from distify.rules.base import Context, Rule


class DeviceAfterOptimizer(Rule):
    """Stop when a trained model is moved to its device after its optimizer is built.

    What it does:
        Reports ``model.to(device)`` / ``model.cuda()`` that follow the optimizer's construction in
        the same function and leaves the file unchanged.

    Why:
        DDP must wrap the model once it sits on its device, and Horovod's DistributedOptimizer
        registers its hooks on the parameters it is given: moving the model afterwards replaces the
        parameters on GPU, so gradients are no longer averaged. Single-GPU PyTorch tolerates the
        order; distributed training does not. Move the ``.to(device)`` above the optimizer.

    Example:
        optimizer = optim.SGD(model.parameters(), lr=0.1)
        model = model.to(device)   # DST908: move this line above the optimizer
    """

    code = "DST908"
    name = "device-after-optimizer"
    summary = "model moved after its optimizer: file left unchanged"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        for opt in a.optimizers:
            for root in opt.models:
                for site in a.calls:
                    if site.scope is not opt.call.scope or not isinstance(site.call.func, cst.Attribute):
                        continue
                    if site.call.func.attr.value not in ("to", "cuda") or dotted(site.call.func.value) != root:
                        continue
                    if a.is_before(opt.call.stmt, site.stmt):
                        ctx.block(
                            self.code,
                            site.call,
                            f"{root} is moved to its device after its optimizer is built: file not migrated; "
                            "move the .to(device) above the optimizer",
                        )


RULE = DeviceAfterOptimizer()
