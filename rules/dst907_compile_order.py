"""DST907 torch.compile and the distributed wrapper."""

from __future__ import annotations

from distify.rules.base import Context, Rule

COMPILE = {"torch.compile"}


class CompileOrder(Rule):
    """Stop at ``torch.compile``: the script is left unchanged.

    What it does:
        Reports each ``torch.compile(...)`` in a training script and leaves the file as it is.

    Why:
        The DDP wrapper must sit between the model and the compiler – ``model =
        torch.compile(DDP(model, device_ids=...))`` – so the compiled graph includes the gradient
        hooks; a model compiled first and wrapped later, or a compiled copy trained while the
        wrapper is bypassed (``raw_model = model; model = torch.compile(model)``) trains
        unsynchronised replicas. Scripts differ too much in how they keep the raw and the
        compiled model apart for a safe automatic rewrite.

    Example:
        model = torch.compile(Net().to(device))   # DST907: wrap with DDP first, then compile
    """

    code = "DST907"
    name = "compile-order"
    summary = "torch.compile: file left unchanged"

    def apply(self, ctx: Context) -> None:
        for site in ctx.anatomy.calls_to(COMPILE):
            ctx.block(
                self.code,
                site.call,
                "torch.compile: file not migrated; wrap the model first, then compile: "
                "model = torch.compile(runtime.DDP(model, device_ids=runtime.device_ids()))",
            )


RULE = CompileOrder()
