"""DST911 collective calls inside a branch taken by some ranks only."""

from __future__ import annotations

from typing import Dict, List, Set

import libcst as cst

from distify.anatomy import Anatomy
from distify.records import COLLECTIVES, FSDP1
from distify.syntax import dotted
from distify.parallel import assigned_to, sharded_models
from distify.rules.base import Context, Rule


class CollectiveInRankBranch(Rule):
    """Warn about a collective that only some ranks reach.

    What it does:
        Reports (with line and column) an explicit collective call – ``dist.all_reduce``,
        ``all_gather``, ``broadcast``, ``barrier``, ``reduce``, ``gather``, ``scatter``,
        ``all_to_all``; Horovod's ``allreduce``, ``allgather``, ``broadcast*``, ``join``,
        ``barrier``; ``runtime.barrier``/``all_reduce``/``reduce_mean`` – made inside an ``if`` (or
        its ``else``) whose condition depends on the rank: ``if rank == 0``,
        ``if dist.get_rank() == 0``, ``if args.local_rank in (-1, 0)``, ``if hvd.rank() == 0``,
        ``if runtime.is_main_process()``, ``if local_rank == 0``. A test against ``-1`` alone
        (``if args.local_rank != -1``: launched distributed or not) is the same on every rank and
        is not reported, nor is an ``if``/``else`` that calls a collective in both branches.
        Nothing is rewritten; the check also runs on a script that is already distributed (which
        distify otherwise leaves alone). The same check keeps distify's own rank-0 guards (DST301, DST302,
        DST304, DST305) off any collective: in a call statement whose arguments hold it
        (``print(runtime.reduce_mean(loss))``, ``print(f"acc {evaluate(model, loader)}")`` when the
        forward is a collective – DDP's broadcasts the buffers, FSDP's gathers the shards – or when
        DST203 puts a metric sum into ``evaluate``) the arguments are computed on every rank first,
        into a name, and only the call is guarded; any other statement that calls a collective stays
        on every rank, with this warning.

        In an FSDP script the forward of a sharded model is a collective too (it all-gathers the
        parameters of each sharded block): a call of the model (``model(x)``, ``model.generate``)
        or of a function of the script it is handed to (``evaluate(model, loader)``) under a rank
        condition is reported, as are ``get_model_state_dict``/``get_optimizer_state_dict`` and
        their ``set_`` counterparts (they gather or scatter the shards), and the ``state_dict()``
        of an FSDP1 ``FullyShardedDataParallel`` wrapper (it gathers the full state by default).

        Limits: only collectives written in the branch itself are seen – not those reached
        through a function called there (other than a sharded model handed to it), nor a DDP
        model's forward/backward, nor a branch skipped by an early ``return`` on some ranks.

    Why:
        A collective completes only when every rank of the group calls it. Ranks that skip the
        branch never join; the ranks inside wait for them until the timeout (30 minutes by
        default with NCCL) and the job hangs or dies without a useful message.

    Example:
        if dist.get_rank() == 0:
            dist.all_reduce(val_loss)   # DST911: ranks 1.. never call it
            print(val_loss.item() / dist.get_world_size())

        should be

        dist.all_reduce(val_loss)
        if dist.get_rank() == 0:
            print(val_loss.item() / dist.get_world_size())
    """

    code = "DST911"
    name = "collective-in-rank-branch"
    summary = "collective called on some ranks only"
    checks_distributed = True  # also reported for a script that is already distributed

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        sites = a.calls_to(COLLECTIVES)
        forwards = _sharded_forwards(a) if a.flavour == "fsdp" else {}
        sites = sites + [c for c in a.calls if id(c) in forwards]
        branches: Dict[cst.If, Set[str]] = {}
        found = []
        for c in sites:
            guards = a.facts.call_rank_guards(c)
            if guards:
                parent, side = guards[0]  # the outermost rank test: one report per call
                branches.setdefault(parent, set()).add(side)
                found.append((c, parent, side))
        for c, parent, side in found:
            if branches[parent] == {"body", "orelse"}:
                continue  # both sides call a collective: the usual root / non-root split
            cond = " ".join(ctx.code(parent.test).split())
            where = f"`if {cond}`" if side == "body" else f"the else branch of `if {cond}`"
            if id(c) in forwards:
                ctx.warn(
                    self.code,
                    c.call,
                    f"{ctx.code(c.call.func)}() inside {where} gathers the sharded model {forwards[id(c)]}'s state on "
                    "some ranks only (FSDP1's state_dict is a collective: hang); call it on all ranks before the `if`, "
                    "keep only the save inside"
                    if isinstance(c.call.func, cst.Attribute) and c.call.func.attr.value == "state_dict"
                    else f"{ctx.code(c.call.func)}() inside {where} runs a forward of the sharded model {forwards[id(c)]} "
                    "on some ranks only: FSDP's forward all-gathers the parameters with every rank (hang); run it "
                    "on all ranks, keep only the print or save of its result inside",
                )
                continue
            ctx.warn(
                self.code,
                c.call,
                f"{ctx.code(c.call.func)}() inside {where} runs on some ranks only and every rank waits "
                "for it (hang): call it on all ranks before the `if`, keep only the use of its result inside",
            )


def _sharded_forwards(a: Anatomy) -> Dict[int, str]:
    """Calls that run a forward of a module FSDP shards: the model called (``model(x)``,
    ``model.forward``/``generate``), or handed to a function of this script (``evaluate(model)``);
    keyed by id of the call site, with the model's name."""
    sharded = sharded_models(a)
    out: Dict[int, str] = {}
    if not sharded:
        return out
    fsdp1 = {assigned_to(c) for c in a.calls_to(FSDP1)} - {None}
    for c in a.calls:
        f = c.call.func
        name = dotted(f)
        if name in sharded:
            out[id(c)] = name
        elif isinstance(f, cst.Attribute) and f.attr.value in ("forward", "generate") and dotted(f.value) in sharded:
            out[id(c)] = dotted(f.value)
        elif isinstance(f, cst.Attribute) and f.attr.value == "state_dict" and dotted(f.value) in fsdp1:
            out[id(c)] = dotted(f.value)
        elif a.callee(c.call, c.scope) is not None:
            handed: List[str] = [dotted(x.value) for x in c.call.args if dotted(x.value) in sharded]
            if handed:
                out[id(c)] = handed[0]
    return out


RULE = CollectiveInRankBranch()
