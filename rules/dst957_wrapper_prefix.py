"""DST957 a checkpoint saved with the DDP wrapper's `module.` prefix, or as an FSDP model's shards."""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from distify.anatomy import Anatomy
from distify.records import DDP, FULLY_SHARD, SAVE
from distify.syntax import arg, dotted, all_nodes, held_name
from distify.instance_reach import attribute_reach, bound_to, handed_in
from distify.parallel import assigned_to, sharded_models, sharded_root
from distify.rules.base import AuditCheck, Context


class WrapperPrefix(AuditCheck):
    """Saved state carries the original keys, without the wrapper's prefix.

    What it does:
        Part of the output audit (and of ``distify lint``). Reports ``X.state_dict()`` saved by
        ``torch.save`` – inside its arguments, or through a name bound just before
        (``state = {"model": X.state_dict()}``) – when ``X`` is a DistributedDataParallel
        wrapper in that scope (or a parameter every caller passes one to). In an FSDP2 script,
        reports ``X.state_dict()`` saved the same way when ``X`` is a module ``fully_shard`` shards.

    Why:
        A DDP wrapper's ``state_dict`` keys all start with ``module.``. The checkpoint then no
        longer loads into the plain model – for inference, fine-tuning or a one-process run –
        without renaming every key. A sharded model's ``state_dict()`` has the original keys but
        its values are DTensor shards: each rank holds a slice, and the file rank 0 writes is not
        the model (nor loadable into the plain one).

    Example:
        model = DDP(net, device_ids=[local_rank])
        torch.save(model.state_dict(), "model.pt")      # DST957: keys are "module.fc.weight", ...

        fix: torch.save(model.module.state_dict(), "model.pt")

        fully_shard(model)
        torch.save(model.state_dict(), "model.pt")      # DST957: DTensor shards

        fix: state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
        cpu_offload=True)) on every rank, then torch.save(state, "model.pt") on rank 0
    """

    code = "DST957"
    name = "wrapper-prefix"
    summary = "audit: a checkpoint keyed with the wrapper's module. prefix"

    def check(self, ctx: Context, a: Anatomy) -> None:
        if a.flavour == "fsdp":
            self._sharded(ctx, a)
            return
        if a.flavour != "ddp":
            return
        wrappers: Dict[Tuple[int, str], bool] = {}
        classes: Set[Tuple[int, str]] = set()
        for c in a.calls_to(DDP):
            name = assigned_to(c)
            if name is None:
                continue
            if a.facts.instance_attr(c.scope, name) is not None:  # an attribute of the instance
                cls = a.facts.instance(c.scope)[1]
                classes.add((id(cls), a.facts.canonical(c.scope, name)))
                # and outside the class, through an instance of it (`trainer.model`)
                for scope, there, _since, _sure in attribute_reach(a, cls, a.facts.instance_attr(c.scope, name)):
                    wrappers.setdefault((id(scope), there), True)
            else:
                wrappers[(id(c.scope), name)] = True
                if isinstance(c.scope, cst.Module):
                    for fn in a.all_functions():
                        wrappers.setdefault((id(fn), name), True)

        def is_wrapper(scope, cls, name: str, depth: int = 0) -> bool:
            if a.facts.instance_attr(scope, name) is not None:
                return (id(a.facts.instance(scope)[1]), a.facts.canonical(scope, name)) in classes
            if (id(scope), name) in wrappers:
                return True
            if isinstance(scope, cst.FunctionDef) and depth < 3 and name in a.facts.params(scope):
                sites = a.callers(scope)
                return bool(sites) and all(
                    (v := a.bound_value(s.call, scope, name)) is not None
                    and dotted(v) is not None
                    and is_wrapper(s.scope, s.cls, dotted(v), depth + 1)
                    for s in sites
                )
            return False

        for c in a.calls_to(SAVE):
            for n in _state_dict_calls(a, c):
                who = held_name(n.func.value)
                if is_wrapper(c.scope, c.cls, who):
                    ctx.warn(
                        self.code,
                        n,
                        f"{who} is a DistributedDataParallel wrapper: its state_dict keys start with "
                        f"'module.' and will not load into the plain model; save {who}.module.state_dict()",
                    )


    def _sharded(self, ctx: Context, a: Anatomy) -> None:
        """torch.save of a fully_shard-ed model's own state_dict() (DTensor shards)."""
        if not a.calls_to(FULLY_SHARD):
            return  # FSDP1's state_dict() gathers a full dict by default
        sharded = sharded_models(a)
        outside = _sharded_outside(a)
        for c in a.calls_to(SAVE):
            for n in _state_dict_calls(a, c):
                who = held_name(n.func.value)
                since = outside.get((id(c.scope), who), False)
                if who in sharded or since is None or (since is not False and a.is_before(since, c.stmt)):
                    ctx.warn(
                        self.code,
                        n,
                        f"{who} is sharded by fully_shard: its state_dict() values are DTensor shards (a slice per rank), "
                        f"not the model; save get_model_state_dict({who}, options=StateDictOptions(full_state_dict=True, "
                        "cpu_offload=True)), called on every rank, from rank 0",
                    )


def _sharded_outside(a: Anatomy) -> Dict[Tuple[int, str], Optional[cst.CSTNode]]:
    """(scope, name) outside a class that reach a module its methods shard in place
    (``fully_shard(self.model)``) through an instance (``trainer.model`` after ``trainer =
    Trainer(...)``), or that name the module handed to the class to keep (``Trainer(model, ...)``):
    -> the statement they hold it from (None: anywhere). See ``distify.instance_reach``."""
    out: Dict[Tuple[int, str], Optional[cst.CSTNode]] = {}
    for c in a.calls_to(FULLY_SHARD):
        root = sharded_root(a, c)
        attr = a.facts.instance_attr(c.scope, root) if root else None
        if attr is not None:
            cls = a.facts.instance(c.scope)[1]
            for s, n, since, _sure in attribute_reach(a, cls, attr) + handed_in(a, c.scope, bound_to(a, c.scope, root), cls):
                out.setdefault((id(s), n), since)
    return out


def _state_dict_calls(a: Anatomy, c) -> List[cst.Call]:
    """``X.state_dict()`` calls in a save's object, or in the value of a name bound just before."""
    obj = arg(c.call, 0, "obj")
    if obj is None:
        return []
    exprs: List[cst.CSTNode] = [obj.value]
    for n in all_nodes(obj.value):
        if isinstance(n, cst.Name):
            b = a.reaching_binding(c.scope, n.value, c.stmt)
            if b is not None and b.kind == "assign":
                exprs.append(b.stmt)
    return [
        n
        for e in exprs
        for n in all_nodes(e)
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "state_dict"
        and held_name(n.func.value)
    ]


RULE = WrapperPrefix()
