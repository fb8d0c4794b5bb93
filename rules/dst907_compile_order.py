"""DST907 torch.compile and the distributed wrapper."""

from __future__ import annotations

import libcst as cst

from distify.model_build import COMPILE, compiled_module
from distify.records import assigned_name
from distify.syntax import dotted
from distify.rules.base import DDP_BACKEND, FSDP_BACKEND, Context, Rule


class CompileOrder(Rule):
    """Compile the inner module, then wrap it; refuse a compiled model the wrapper would miss.

    What it does:
        ``model = torch.compile(model)`` (also under ``if args.compile:``, also after the optimizer
        is built, nanoGPT's order), ``model = torch.compile(Net().to(device))`` and
        ``model.compile()`` are kept, and the DDP wrap goes around the compiled module, after the
        compile: ``model = runtime.DDP(model, ...)``. With
        ``raw_model = model`` before ``model = torch.compile(model)`` the compiled ``model`` is
        wrapped and ``raw_model`` stays the plain module. A ``model.compile()`` after the wrap
        compiles the inner module (``model.module.compile()``). Checkpoints keep the original's
        keys: ``_orig_mod.`` where the original saved the compiled module, none where it saved the
        plain one, never ``module.``. With FSDP the plain module is sharded first and compiled after
        (``fully_shard(model)`` then ``model = torch.compile(model)``; a ``torch.compile(Net())``
        construction is split in two; an optimizer built before the compile moves after it). The
        full state FSDP gathers (``get_model_state_dict``) names the parameters without
        ``_orig_mod.``; DST307 puts the prefix back when the saved model is compiled. With Horovod nothing changes: its optimizer averages the gradients of the
        parameters, which compiled and plain module share (2 ranks end bit-identical:
        tests/test_e2e_compile_order.py).
        Any other ``torch.compile`` (a compiled copy under a name distify does not wrap, trained
        while the wrapper is bypassed) leaves the file unchanged with this warning.

    Why:
        PyTorch's guidance for DDP is to compile the inner module and wrap it; the compiled module
        shares the plain one's parameters, so the wrapper's gradient hooks see every gradient. A
        compiled copy that training calls while the optimizer's model is wrapped would train
        unsynchronised replicas, silently.

    Example:
        model = Net().to(device)
        model = torch.compile(model)
        optimizer = optim.AdamW(model.parameters())

        becomes

        model = Net().to(device)
        model = torch.compile(model)
        model = runtime.DDP(model, device_ids=runtime.device_ids())
        optimizer = optim.AdamW(model.parameters())
    """

    code = "DST907"
    name = "compile-order"
    summary = "wrap the compiled module; refuse a compiled copy the wrapper would miss"

    def apply(self, ctx: Context) -> None:
        if ctx.backend == FSDP_BACKEND:
            self._fsdp(ctx)
            return
        if ctx.backend != DDP_BACKEND:
            return
        a = ctx.anatomy
        wrapped = ctx.plan.wrapped
        for site in a.calls_to(COMPILE):
            if self._covered(ctx, site, wrapped):
                continue
            ctx.block(
                self.code,
                site.call,
                "torch.compile of a model distify does not wrap: file not migrated; compile the model "
                "the optimizer trains and wrap that one: model = runtime.DDP(torch.compile(model), "
                "device_ids=runtime.device_ids())",
            )

    def _fsdp(self, ctx: Context) -> None:
        """FSDP: the model is sharded, then compiled (DST121 puts the shard before the compile of the
        model it shards); any other torch.compile is refused as with DDP."""
        handled = ctx.plan.sharded_compiles
        for site in ctx.anatomy.calls_to(COMPILE):
            small = site.stmt.body[0] if isinstance(site.stmt, cst.SimpleStatementLine) else None
            if small is not None and small in handled:
                continue
            ctx.block(
                self.code,
                site.call,
                "torch.compile of a model distify does not shard: file not migrated; shard the model the "
                "optimizer trains, then compile that one: fully_shard(model); model = torch.compile(model)",
            )

    def _covered(self, ctx: Context, site, wrapped) -> bool:
        """The compile's result is a wrapped model's name, bound before (or where) the wrap goes."""
        a = ctx.anatomy
        name = assigned_name(site.stmt, site.call)
        for model, anchor in wrapped:
            if name != model.name or site.scope is not model.scope:
                continue
            inner = dotted(compiled_module(a.qualname, site.call))
            if inner is not None and inner != model.name and model.value is not site.call:
                # `model = torch.compile(other)`: only when it is the model's own construction
                continue
            chain = (*a.stmt_parent.get(site.stmt, ()), site.stmt)
            if anchor in chain or not a.is_before(anchor, site.stmt):
                return True
        return False


RULE = CompileOrder()
