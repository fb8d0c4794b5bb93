"""DST103 fp16 gradient compression for DDP (--fp16-allreduce)."""

from __future__ import annotations

import libcst as cst

from distify.rules.base import DDP_BACKEND, Context, Rule


class Fp16CommHook(Rule):
    """With ``--fp16-allreduce``, send DDP's gradients as float16.

    What it does:
        After each DDP wrap adds
        ``model.register_comm_hook(None, default_hooks.fp16_compress_hook)``, with a comment.
        Only when the flag is given.

    Why:
        Halves the bytes of every gradient all-reduce – worth it when the network, not the GPU,
        limits the step time (many nodes, slow interconnect). The gradients are averaged in
        float16 and cast back, so small gradients lose precision: measure before keeping it.
        This is the DDP counterpart of Horovod's ``compression=hvd.Compression.fp16``.

    Example:
        model = runtime.DDP(Net().to(device), device_ids=runtime.device_ids())

        is followed by

        # distify --fp16-allreduce: gradients are all-reduced in float16 (half the bytes)
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    """

    code = "DST103"
    name = "fp16-comm-hook"
    backends = frozenset({DDP_BACKEND})
    summary = "compress DDP gradients to float16 (--fp16-allreduce)"

    def apply(self, ctx: Context) -> None:
        if not ctx.options.fp16_allreduce:
            return
        for model, anchor in ctx.plan.wrapped:
            if any(
                isinstance(site.call.func, cst.Attribute)
                and site.call.func.attr.value == "register_comm_hook"
                and ctx.code(site.call.func.value) == model.name
                for site in ctx.anatomy.calls
            ):
                continue  # a comm hook is registered already
            hooks = ctx.imported("torch.distributed.algorithms.ddp_comm_hooks", "default_hooks", "default_hooks")
            stmts = ctx.stmts(
                "# distify --fp16-allreduce: gradients are all-reduced in float16 (half the bytes)\n"
                f"{model.name}.register_comm_hook(None, {hooks}.fp16_compress_hook)"
            )
            ctx.edits.insert_after(anchor, stmts)
            ctx.report(self.code, model.assign, f"{model.name}'s gradients are all-reduced in float16")


RULE = Fp16CommHook()
