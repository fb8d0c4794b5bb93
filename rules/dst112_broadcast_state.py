"""DST112 broadcast initial state from rank 0 (Horovod)."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import dotted
from distify.rules.base import HOROVOD_BACKEND, Context, Rule


class BroadcastState(Rule):
    """Start every rank from rank 0's weights and optimizer state (Horovod).

    What it does:
        Adds ``hvd.broadcast_parameters(model.state_dict(), root_rank=0)`` after the optimizer is
        built – and after any ``load_state_dict`` that follows it in the same function, so a
        resumed checkpoint is what gets broadcast. When the optimizer's state is loaded there too,
        ``hvd.broadcast_optimizer_state(optimizer, root_rank=0)`` follows. A fresh optimizer's
        state is not broadcast: it is identical everywhere, and Horovod would create it with a
        zero-gradient step that shifts Adam's step count and applies weight decay once.

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
        for opt in [*ctx.state.get("hvd_optimizers", []), *ctx.state.get("hvd_averaged", [])]:
            anchor = ctx.state.get("hvd_anchor", {}).get(opt, opt.call.stmt)
            loads_optimizer = False
            siblings = a.stmt_parent.get(anchor, ())
            # loads after the first loop that follows the optimizer (the training loop) come after
            # training – reloading the best weights at the end – and must not delay the broadcast
            loops_after = [
                level[0]
                for loop, scope, _cls, _outer in a.fors
                if scope is opt.call.scope
                for level in [[s for s in (*a.stmt_parent.get(loop, ()), loop) if a.stmt_parent.get(s, ()) == siblings]]
                if level and a.is_before(anchor, level[0])
            ]
            # the last load_state_dict after the optimizer, at the optimizer's block level
            for site in a.calls:
                if site.scope is not opt.call.scope or not isinstance(site.call.func, cst.Attribute):
                    continue
                if site.call.func.attr.value != "load_state_dict":
                    continue
                owner = dotted(site.call.func.value) or ""
                if owner not in opt.models and owner != opt.target and not any(owner.startswith(m + ".") for m in opt.models):
                    continue
                chain = (*site.parents, site.stmt)
                level = [s for s in chain if a.stmt_parent.get(s, ()) == siblings]
                if any(a.is_before(loop, level[0]) for loop in loops_after if level):
                    continue
                if level and a.is_before(anchor, level[0]) and not _inside_loop(level[0]):
                    anchor = level[0]
                    loads_optimizer = loads_optimizer or owner == opt.target
            lines = [f"{hvd}.broadcast_parameters({m}.state_dict(), root_rank=0)" for m in opt.models]
            if loads_optimizer:
                # only a loaded state needs broadcasting: on a fresh optimizer Horovod creates the
                # state with a zero-gradient step, which shifts Adam's step count and applies weight
                # decay once – the run would no longer match the single-process one
                lines.append(f"{hvd}.broadcast_optimizer_state({opt.target}, root_rank=0)")
            ctx.edits.insert_after(anchor, ctx.stmts("\n".join(lines)))
            ctx.report(self.code, opt.call.call, "rank 0's parameters and optimizer state are broadcast before training")


def _inside_loop(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, (cst.For, cst.While))


RULE = BroadcastState()
