"""DST308 a resume that some ranks may skip hands rank 0's loaded state to every rank (DDP)."""

from __future__ import annotations

from typing import Set

import libcst as cst

from distify.model_state import LOAD, before_training, changes_in
from distify.resume import (
    BROADCASTS, broadcast_follows, broadcasts, host_conditions, host_dependent, rank_conditions, resumed_values,
    schedulers_loaded, state_from_rank0, values_from_rank0,
)
from distify.syntax import all_nodes
from distify.rules.base import DDP_BACKEND, FSDP_BACKEND, Context, Rule


class ResumeBroadcast(Rule):
    """Broadcast rank 0's resumed state when the load may run on rank 0 only (DDP; FSDP before the
    shard); otherwise load on every rank or none (FSDP).

    What it does:
        For a checkpoint load before training that runs under an ``if`` whose test asks the host
        (``if os.path.isfile(args.resume):``), inserts right after it:
        ``runtime.broadcast_module(model)`` for each model it loads (rank 0's parameters and
        buffers, in place), ``optimizer.load_state_dict(runtime.broadcast_object(
        optimizer.state_dict()))`` for an optimizer it loads (its param groups too: plain SGD keeps
        the resumed learning rate there and no state),
        ``scheduler.load_state_dict(runtime.broadcast_object(scheduler.state_dict()))`` for an LR
        scheduler it restores (DST112 does the same under Horovod), and one
        ``runtime.broadcast_object`` of the values the load binds and the script reads later
        (``start_epoch, best_acc1``, ``distify.resume``). A load the script itself runs on some
        ranks only (``if rank == 0 and args.resume:``) gets the same broadcasts: the single process
        is rank 0, so every rank must end with what rank 0 loaded. Under FSDP a model loaded so
        before it is sharded gets ``runtime.broadcast_module(model)`` between the load and
        ``fully_shard`` (which broadcasts nothing: each rank cuts its shards from the weights it
        holds); a load under a rank condition after the shard, or one that also loads the
        optimizer, is refused with its line: ``set_model_state_dict`` is a collective the other
        ranks would never join.

    Why:
        On several nodes without a shared disk only rank 0 may see the checkpoint: the other ranks
        skip the load without an error and keep fresh weights (DDP broadcast the parameters when it
        wrapped the model, before the load), a fresh optimizer state and ``start_epoch = 0``. The
        ranks then train different models in silence, or run different numbers of epochs.
        Horovod's broadcasts (DST112) do the same for ``--backend horovod``.

    Example:
        if args.resume and os.path.isfile(args.resume):
            checkpoint = torch.load(args.resume)
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            start_epoch = checkpoint["epoch"] + 1

        is followed by

        runtime.broadcast_module(model)
        optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))
        start_epoch = runtime.broadcast_object(start_epoch)

        Under FSDP the load is ``set_model_state_dict`` on the sharded model (DST307), which each
        rank runs for its own shards: a rank that skipped it would keep fresh shards, or leave the
        others waiting in its collectives. The host-dependent test becomes rank 0's answer,
        ``if runtime.broadcast_object(os.path.isfile(args.resume)):``, so every rank loads or
        none does; on a shared disk that is the single process's resume, and a rank that cannot
        read the file fails with ``FileNotFoundError`` instead of training other weights.
    """

    code = "DST308"
    name = "resume-broadcast"
    backends = frozenset({DDP_BACKEND, FSDP_BACKEND})
    summary = "hand rank 0's resumed state to ranks that may not see the checkpoint"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        done: Set[int] = set()
        rt = ctx.runtime
        if ctx.backend == FSDP_BACKEND:
            self._rank_only_loads(ctx)
        for opt in a.optimizers:
            roots = [*opt.models, *([opt.target] if opt.target else [])]
            loaded, found = None, []
            for stmt in before_training(a.facts, opt.call.stmt):
                if broadcasts(a, stmt):
                    continue  # an earlier run's broadcast of the load before it
                changes = [c for c in changes_in(a.facts, a.qualname, stmt, roots) if c.kind == LOAD]
                if changes:
                    loaded, found = stmt, changes
                if any(isinstance(n, (cst.For, cst.While)) for n in all_nodes(stmt, skip_nested=True)):
                    break
            if loaded is None or id(loaded) in done:
                continue
            ranked = [t for c in found for t in rank_conditions(a, loaded, c.node)]
            if ranked and ctx.backend == FSDP_BACKEND:
                continue  # refused below (_rank_only_loads)
            if not ranked and not any(host_dependent(a, loaded, c.node) for c in found):
                continue
            if ctx.backend == FSDP_BACKEND:
                self._one_decision(ctx, loaded, found)
                done.add(id(loaded))
                continue
            if broadcast_follows(a, loaded):
                continue  # an earlier run's
            done.add(id(loaded))
            lines = [f"{rt}.broadcast_module({m})" for m in opt.models if any(c.root == m for c in found)]
            if opt.target and any(c.root == opt.target for c in found):
                # the whole state dict, whatever rank 0 holds: plain SGD has no state even once
                # loaded, but its param groups carry the resumed learning rate
                lines.append(state_from_rank0(rt, opt.target))
            schedulers = schedulers_loaded(a, loaded)
            lines += [state_from_rank0(rt, s) for s in schedulers]
            values = resumed_values(a, loaded, roots)
            if values:
                lines.append(values_from_rank0(rt, values))
            if not lines:
                continue
            ctx.edits.insert_after(loaded, ctx.stmts("\n".join(lines)))
            ctx.report(
                self.code, loaded,
                (f"the checkpoint is loaded on some ranks only (the rank condition of line {a.position(ranked[0])[0]}): "
                 "its model and optimizer state" if ranked else
                 "the checkpoint may be readable on rank 0 only: its model and optimizer state")
                + (f", the state of {', '.join(schedulers)}" if schedulers else "")
                + (f" and {', '.join(values)}" if values else "") + " are broadcast from rank 0 after the load",
            )


    def _rank_only_loads(self, ctx: Context) -> None:
        """FSDP: a model loaded under a rank condition before it is sharded has rank 0's weights
        broadcast right before ``fully_shard``; any other load under a rank condition is refused."""
        a = ctx.anatomy
        seen: Set[int] = set()
        shards = {id(m): s for m, s in ctx.plan.wrapped}
        for model in a.models:
            opt = model.optimizer.target if model.optimizer and model.optimizer.target else None
            roots = [model.name, *([opt] if opt else [])]
            shard = shards.get(id(model))
            for stmt in before_training(a.facts, model.assign):
                changes = changes_in(a.facts, a.qualname, stmt, roots)
                ranked = [(c, rank_conditions(a, stmt, c.node)) for c in changes if c.kind == LOAD]
                ranked = [(c, t) for c, t in ranked if t and id(c.node) not in seen]
                if not ranked:
                    continue
                seen.update(id(c.node) for c, _ in ranked)
                early = shard is not None and (stmt is shard or a.is_before(stmt, shard))
                if early and all(c.root == model.name for c in changes):
                    self._broadcast_before_shard(ctx, model, stmt, stmt is shard, ranked[0][1][0])
                    continue
                for c, tests in ranked:
                    ctx.block(
                        self.code, c.node,
                        f"{c.root} is loaded under a rank condition (line {a.position(tests[0])[0]}): under FSDP the "
                        "other ranks would keep their own weights (fully_shard broadcasts nothing) or never join the "
                        "load's collectives (set_model_state_dict); load the checkpoint on every rank (each takes "
                        "its own shard), or run set_model_state_dict on every rank with "
                        "StateDictOptions(full_state_dict=True, broadcast_from_rank0=True): file not migrated",
                    )

    def _broadcast_before_shard(self, ctx: Context, model, stmt, at_shard: bool, test) -> None:
        """`runtime.broadcast_module(model)` after the load `stmt` that only some ranks run, before
        the shard (fully_shard cuts each rank's shards from the weights it holds), with the values
        the load binds and the script reads later."""
        a = ctx.anatomy
        if broadcast_follows(a, stmt):
            return  # an earlier run's
        rt = ctx.runtime
        lines = [f"{rt}.broadcast_module({model.name})"]
        values = resumed_values(a, stmt, [model.name])
        if values:
            lines.append(values_from_rank0(rt, values))
        ctx.edits.insert_after(stmt, ctx.stmts("\n".join(lines)), first=at_shard)
        ctx.report(
            self.code, stmt,
            f"{model.name} is loaded on some ranks only (the rank condition of line {a.position(test)[0]}): rank 0's "
            "weights" + (f" and {', '.join(values)}" if values else "") + " are broadcast after the load, before "
            "fully_shard cuts each rank's shards from them",
        )

    def _one_decision(self, ctx: Context, loaded, found) -> None:
        """FSDP: the host-dependent tests around the loads take rank 0's answer."""
        a = ctx.anatomy
        tests = []
        for c in found:
            tests += [n for n in host_conditions(a, loaded, c.node) if n not in tests]
        fresh = [n for n in tests if not any(
            isinstance(x, cst.Call) and a.qualname(x.func) in BROADCASTS for x in all_nodes(n.test))]
        for n in fresh:
            ctx.edits.call_around(n.test, f"{ctx.runtime}.broadcast_object")
        if fresh:
            ctx.report(
                self.code, fresh[0],
                "the checkpoint may be readable on rank 0 only: every rank takes rank 0's answer to whether it "
                "loads (set_model_state_dict loads each rank's own shards), so no rank keeps fresh weights or "
                "waits for another's load; a rank that cannot read the file then stops with an error",
            )


RULE = ResumeBroadcast()
