"""DST112 broadcast initial state from rank 0 (Horovod)."""

from __future__ import annotations

import libcst as cst

from distify.syntax import all_nodes
from distify.model_state import INIT, LOAD, LOAD_METHODS, before_training, changes_in
from distify.resume import resumed_values, schedulers_loaded, state_from_rank0, sure_under, values_from_rank0
from distify.rules.base import HOROVOD_BACKEND, Context, Rule


class BroadcastState(Rule):
    """Start every rank from rank 0's weights and optimizer state (Horovod).

    What it does:
        Adds ``hvd.broadcast_parameters(model.state_dict(), root_rank=0)`` after the optimizer is
        built – and after the last statement before training that loads or re-initialises the
        model (``load_state_dict``, ``.apply(init_fn)``), also under a condition (``if
        args.resume:``) or inside a function of the script that is handed the model
        (``load_checkpoint(path, model, optimizer)``), so a resumed checkpoint is what gets
        broadcast. When the optimizer's state is loaded there too, rank 0's whole state dict
        follows (``optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))``:
        under the load's own ``if`` when that condition reads only values that are the same on
        every rank, otherwise always), before the parameters. Not
        ``hvd.broadcast_optimizer_state``: it gives an optimizer without state (a fresh one, and
        plain SGD even once loaded) a zero-gradient step, which applies weight decay and shifts
        Adam's step count, and it leaves the param groups, where plain SGD keeps the resumed
        learning rate, as each rank has them. A fresh optimizer is not broadcast: it is identical
        everywhere.
        The values the load binds and the script reads later – the epoch or step to resume from,
        the best metric (``start_epoch = checkpoint["epoch"] + 1``) – follow in one
        ``runtime.broadcast_object``, so a rank that cannot read the checkpoint resumes where rank 0
        does (``distify.resume``).

    Why:
        Unlike DDP, Horovod does not synchronise the initial state: ranks seeded differently (or
        one that loaded a checkpoint while others did not) would train different models.
        Broadcasting before a checkpoint is loaded would be undone by the load – or, when only rank
        0 loads, overwrite the resumed weights with fresh ones.

    Example:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

        is followed by

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    """

    code = "DST112"
    name = "broadcast-state"
    backends = frozenset({HOROVOD_BACKEND})
    summary = "broadcast parameters and optimizer state from rank 0"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        hvd = ctx.hvd
        # wrapped in hvd.DistributedOptimizer, or averaged by an explicit all-reduce (DST111, a GAN): both
        # start from rank 0
        resumed = set()  # loads whose values are broadcast already (two optimizers, one load)
        for opt in [*ctx.plan.hvd_optimizers, *ctx.plan.hvd_averaged]:
            anchor = ctx.plan.hvd_anchor.get(opt, opt.call.stmt)
            loads_optimizer = False
            loaded = None  # the last statement that loads a checkpoint into them
            # the last statement before training that loads or re-initialises the model or loads the
            # optimizer: under a condition (`if args.resume:`) or in a function of the script it is
            # handed to (`load_checkpoint(path, model, optimizer)`); what follows the first loop after
            # the optimizer (the training loop: reloading the best weights at the end) is not waited for
            roots = [*opt.models, *([opt.target] if opt.target else [])]
            for stmt in before_training(a.facts, anchor):
                found = [c for c in changes_in(a.facts, a.qualname, stmt, roots) if c.kind in (LOAD, INIT)]
                if found:
                    anchor = stmt
                    if any(c.kind == LOAD for c in found):
                        loaded = stmt
                    for c in found:
                        if c.kind == LOAD and c.root == opt.target:
                            loads_optimizer = _when_loaded(ctx, stmt, c.node)
                if any(isinstance(n, (cst.For, cst.While)) for n in all_nodes(stmt, skip_nested=True)):
                    break
            lines = [f"{hvd}.broadcast_parameters({m}.state_dict(), root_rank=0)" for m in opt.models]
            if not opt.models and opt.target:
                # the optimizer's model is not known (`optim.SGD(pg, ...)` over a list built from it):
                # the parameters it steps still have to start equal on every rank
                i, p, g = ctx.fresh("index"), ctx.fresh("tensor"), ctx.fresh("param_group")
                lines.append(
                    f"{hvd}.broadcast_parameters([(str({i}), {p}) for {i}, {p} in enumerate({p} for {g} in "
                    f"{opt.target}.param_groups for {p} in {g}[\"params\"])], root_rank=0)"
                )
                ctx.warn(self.code, opt.call.call, f"rank 0's values of the parameters {opt.target} steps are broadcast, "
                         "but distify cannot tell which model they belong to: its frozen parameters and buffers start "
                         "as each rank built them; seed the initialisation or broadcast the model's state_dict() yourself")
            if not lines:
                ctx.warn(self.code, opt.call.call, "distify cannot tell which parameters this optimizer steps: "
                         "broadcast rank 0's model with hvd.broadcast_parameters(model.state_dict(), root_rank=0) "
                         "before training, or the ranks start from different weights")
                continue
            if loads_optimizer:
                # rank 0's whole state dict, param groups included: hvd.broadcast_optimizer_state
                # first gives an optimizer without state (a fresh one; plain SGD even once loaded) a
                # zero-gradient step, which applies weight decay and shifts Adam's step count, and
                # then sends only the state: rank 0's resumed learning rate never reached a rank
                # whose SGD had no momentum. Loading a fresh state dict changes nothing, so a load
                # that may have run on some ranks only (ON_RANK0) is followed by it unconditionally;
                # one under `if args.resume:` (the same on every rank) under that condition
                line = state_from_rank0(ctx.runtime, opt.target)
                lines.insert(0, line if loads_optimizer is True or loads_optimizer is ON_RANK0
                             else f"if {loads_optimizer}:\n    {line}")
            schedulers = schedulers_loaded(a, loaded) if loaded is not None and id(loaded) not in resumed else []
            # a rank that skipped the load would count its epochs from 0 and decay elsewhere
            lines += [state_from_rank0(ctx.runtime, s) for s in schedulers]
            values = resumed_values(a, loaded, roots) if loaded is not None else []
            if values and id(loaded) not in resumed:
                # a rank that could not read the checkpoint resumes where rank 0 does
                resumed.add(id(loaded))
                names = ", ".join(values)
                lines.append(values_from_rank0(ctx.runtime, values))
                ctx.report(self.code, loaded, f"{names} broadcast from rank 0 with the loaded state: a rank that "
                           "cannot read the checkpoint resumes where rank 0 does")
            ctx.edits.insert_after(anchor, ctx.stmts("\n".join(lines)))
            ctx.report(self.code, opt.call.call, "rank 0's parameters and optimizer state are broadcast before training")


ON_RANK0 = object()  # _when_loaded: whether the load ran may differ between ranks


def _when_loaded(ctx: Context, stmt: cst.CSTNode, load: cst.CSTNode):
    """True when the optimizer load `load` in `stmt` runs on every rank whenever `stmt` does; the
    source of the tests it runs under when it runs under ``if`` statements whose tests are the same
    on every rank (``args.resume``); otherwise ON_RANK0: a load under a test that may differ between
    hosts (``os.path.isfile(path)``) or a rank condition, in a ``try``, an ``else`` branch, or in a
    function of the script the statement calls (whose own tests distify does not follow) may have
    run on some ranks only or on none (a resume path found nowhere): rank 0's state then goes to
    every rank, loaded or fresh."""
    direct = isinstance(load, cst.Call) and isinstance(load.func, cst.Attribute) and load.func.attr.value in LOAD_METHODS
    tests = sure_under(ctx.anatomy, stmt, load) if direct else None
    if tests is None:
        return ON_RANK0
    if not tests:
        return True
    return " and ".join(ctx.code(t) if len(tests) == 1 or isinstance(t, (cst.Name, cst.Attribute)) else f"({ctx.code(t)})"
                        for t in tests)


RULE = BroadcastState()
