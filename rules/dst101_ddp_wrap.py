"""DST101 wrap trained models in DistributedDataParallel."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from distify.model_build import module_container, moves_to_device, through_compile, through_data_parallel
from distify.records import DDP, assigned_name
from distify.syntax import dotted
from distify.model_contract import forward_gaps, training_freezes
from distify.model_state import moved
from distify.rules.base import DDP_BACKEND, Context, Rule, note_batch_norm


class WrapDDP(Rule):
    """Wrap every trained model in ``DistributedDataParallel``.

    What it does:
        Finds each model whose parameters an optimizer receives and wraps it right after it
        reaches its device and before the optimizer is built:
        ``model = runtime.DDP(Net().to(device), device_ids=runtime.device_ids())`` in place, or a
        ``model = runtime.DDP(model, device_ids=...)`` line after a separate ``model.to(device)``
        – or after the last statement that changes the model before training, when that comes
        later (``distify.model_state``): ``.apply(init_fn)``, ``load_state_dict``, a replaced head
        (``model.fc = nn.Linear(...)``), frozen parameters, ``model = torch.compile(model)``, also
        under ``if``/``else`` (the wrap follows the whole statement) or in a function of the
        script handed the model. ``find_unused_parameters=True`` is added when the model's class in
        this file can leave a parameter without a gradient (``distify.model_contract``): a
        submodule defined in ``__init__`` and never reached from ``forward``, one reached only
        under a condition (``if y is not None:``, ``if random.random() < p:``), or parameters
        frozen inside the training loop.
        ``device_ids`` is ``[local_rank]`` on GPU and ``None`` on CPU. ``runtime.DDP(...)`` returns
        torch's ``DistributedDataParallel`` whenever the job has more than one process; in a
        one-process run (plain ``python``) it returns a pass-through with the same ``.module``,
        ``state_dict`` keys and ``no_sync()``, because DDP's reducer would only add cost there.

    Why:
        DDP averages gradients across processes during ``backward()``, so every rank takes the
        same optimizer step – the step of the big batch made of all ranks' batches. Without it
        the ranks train separate models. DDP broadcasts rank 0's parameters when it wraps, and
        registers the parameters that require a gradient then: an initialisation drawn after the
        wrap gives each rank its own weights, a head replaced after it is never averaged.

    Example:
        model = Net().to(device)
        optimizer = optim.SGD(model.parameters(), lr=0.1)

        becomes

        model = runtime.DDP(Net().to(device), device_ids=runtime.device_ids())
        optimizer = optim.SGD(model.parameters(), lr=0.1)
    """

    code = "DST101"
    name = "wrap-ddp"
    backends = frozenset({DDP_BACKEND})
    summary = "wrap trained models in DistributedDataParallel"

    def apply(self, ctx: Context) -> None:
        wrapped = ctx.plan.wrapped
        for model in ctx.anatomy.models:
            if model.value is not None and _wraps_in(ctx, model.value, DDP):
                wrapped.append((model, model.assign))  # wrapped already (incremental run)
                continue
            rewrap = _rewrapped(ctx, model)
            if rewrap is not None:
                wrapped.append((model, rewrap))  # `model = runtime.DDP(model, ...)` below (an earlier run's)
                continue
            container = module_container(ctx.anatomy.qualname, model.value)
            if container is not None:
                ctx.block(
                    self.code,
                    model.assign,
                    f"{model.name} is a {container.name}, which has no forward of its own: DDP averages gradients only "
                    "when its forward runs, and the script calls the modules it holds, so every rank would step on its "
                    "own gradients and the replicas drift apart with no error; file not migrated to DDP (use --backend "
                    "fsdp or horovod, or give the model a class whose forward calls these modules)",
                )
                continue
            ddp = ctx.ddp
            # a model that is never moved to a device stays on the CPU: no device_ids then
            value = through_data_parallel(ctx.anatomy.qualname, model.value)  # DST902 drops DataParallel
            value = through_compile(ctx.anatomy.qualname, value)  # DDP(torch.compile(Net().to(device)))
            placed = moves_to_device(value) or moved(ctx.anatomy.facts, ctx.anatomy.qualname, model.name, model.assign, model.place)
            ids = f", device_ids={ctx.runtime}.device_ids()" if placed else ""
            skips = self._skips(ctx, model)
            if skips is not None:
                ids += ", find_unused_parameters=True"
            if model.place is model.assign and model.value is not None and model.assign_node is not None:
                def wrap(node: cst.Assign, ddp=ddp, ids=ids) -> cst.Assign:
                    call = cst.parse_expression(f"{ddp}(_model_{ids})")
                    return node.with_changes(
                        value=call.with_changes(args=[call.args[0].with_changes(value=node.value), *call.args[1:]])
                    )

                ctx.edits.replace(model.assign_node, wrap)
                anchor = model.assign
            else:
                ctx.edits.insert_after(model.place, ctx.stmts(f"{model.name} = {ddp}({model.name}{ids})"))
                anchor = model.place
            wrapped.append((model, anchor))
            ctx.report(
                self.code,
                model.assign,
                f"{model.name} wrapped in DistributedDataParallel (runtime.DDP: a pass-through when there is one process)",
            )
            note_batch_norm(ctx, self.code, model.name, model.value, "(the running statistics kept are rank 0's)",
                            f"convert it before the wrap: {model.name} = "
                            f"torch.nn.SyncBatchNorm.convert_sync_batchnorm({model.name})")

    def _skips(self, ctx: Context, model):
        """The first reason a backward pass can leave a parameter of `model` without a gradient
        (``distify.model_contract``), reported; None when there is none."""
        a = ctx.anatomy
        cls = a.model_class(model)
        gaps = forward_gaps(cls, a.classes, a.qualname, ctx.code) if cls is not None else []
        gaps += training_freezes(a.facts, a.qualname, model.scope, model.name)
        for g in gaps:
            if g.kind == "unused":
                why = f"{g.what} is defined in __init__ and never reached from forward: it never gets a gradient"
            elif g.kind == "conditional":
                why = f"{g.what} is reached only when `{g.why}`: the steps that skip it leave it without a gradient"
            elif g.kind == "freeze":
                why = "parameters stop requiring a gradient during training"
            else:
                continue
            ctx.report(self.code, g.node, f"{model.name} wrapped with find_unused_parameters=True: {why}")
            return g
        return None


def _rewrapped(ctx: Context, model) -> Optional[cst.CSTNode]:
    """The statement `name = runtime.DDP(name, ...)` in the model's scope, if there is one (written by an
    earlier run after a compound statement that both moves the model and builds its optimizer)."""
    for site in ctx.anatomy.calls_to(DDP):
        args = site.call.args
        if (
            site.scope is model.scope
            and args
            and dotted(args[0].value) == model.name
            and assigned_name(site.stmt, site.call) == model.name
        ):
            return site.stmt
    return None


def _wraps_in(ctx: Context, expr: cst.BaseExpression, names) -> bool:
    return isinstance(expr, cst.Call) and ctx.anatomy.qualname(expr.func) in names


RULE = WrapDDP()
