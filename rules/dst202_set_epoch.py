"""DST202 sampler.set_epoch(epoch) in the epoch loop."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from distify.syntax import dotted
from distify.training import endless_loop
from distify.rules.base import Context, Rule
from distify.walk import walk


class SetEpoch(Rule):
    """Call ``sampler.set_epoch(epoch)`` at the top of the loop that runs the epochs.

    What it does:
        For every DataLoader that DST201 gave a DistributedSampler, inserts
        ``train_sampler.set_epoch(epoch)`` as the first statement of the epoch loop – also when the
        batch loop lives in a ``train(...)`` function or a ``Trainer`` method called from that loop
        (then it goes into the caller, through ``loader.sampler`` if the sampler is out of reach).
        A loader built in a helper is followed to where the caller binds what the helper returns
        (``train_loader, val_loader = get_loaders(args)``, ``loader = make_loader(ds)``,
        ``loaders = build_loaders()`` read as ``loaders["train"]``) and gets
        ``train_loader.sampler.set_epoch(epoch)``; a loader built afresh each epoch gets it right
        after it is built.

    Why:
        The sampler seeds its shuffle with the epoch number. Without ``set_epoch`` every epoch
        uses the same order – the most common silent mistake in DDP scripts.

    Example:
        for epoch in range(1, args.epochs + 1):
            train(args, model, device, train_loader, optimizer, epoch)

        becomes

        for epoch in range(1, args.epochs + 1):
            train_sampler.set_epoch(epoch)
            train(args, model, device, train_loader, optimizer, epoch)
    """

    code = "DST202"
    name = "set-epoch"
    summary = "call set_epoch on the sampler every epoch"

    def apply(self, ctx: Context) -> None:
        done = set()
        for loader, sname in ctx.plan.samplers.items():
            # a loader built in another module (DST201 re-shards it): the loops that run its passes
            eps = ctx.anatomy.epoch_loops.get(loader) or ctx.plan.foreign_epoch_loops.get(loader, [])
            for ep in eps:
                if ep.counted is not None and ep.loop not in done:
                    done.add(ep.loop)
                    self._count_passes(ctx, loader, ep, samplers=ctx.plan.samplers)
                    continue
                if ep.var is None:
                    continue
                f = ctx.anatomy.facts
                obj = None
                if sname is not None and ep.scope is loader.call.scope:
                    obj = sname
                elif sname is not None and loader.target is not None and f.instance_attr(loader.call.scope, loader.target) is not None:
                    # a sampler held on the instance, as the epoch loop's method spells the instance
                    # (None where that scope holds no instance of the class)
                    obj = f.respell(sname, loader.call.scope, ep.scope)
                if obj is None and ep.loader_ref is not None:
                    obj = f"{ep.loader_ref}.sampler"
                elif obj is None:
                    continue
                body = ep.loop.body
                if (ep.loop, obj) in done:
                    continue  # several batch loops of one loader in one epoch loop
                if not isinstance(body, cst.IndentedBlock) or not body.body or _calls_set_epoch(ep.loop, obj):
                    continue
                first = body.body[0]
                loader_stmt = loader.call.stmt
                binding = _binding_in(body, obj.split(".")[0].split("[")[0]) if obj != sname else None
                # where this epoch loop gets its loader: built there, or bound there from a helper
                var = _pass_number(ctx, ep, loader_stmt if binding is None else binding)
                if var is None:
                    continue  # no number counts the passes here: DST952 reports the sampler
                line = ctx.stmts(f"{obj}.set_epoch({var})")
                if ep.loop in ctx.anatomy.stmt_parent.get(loader_stmt, ()):
                    # the loader (and its sampler) is built inside the epoch loop: right after it
                    ctx.edits.insert_before(loader_stmt, line)
                elif binding is not None:
                    # a helper builds a fresh loader every epoch: set the epoch of that one
                    ctx.edits.insert_after(binding, line)
                else:
                    ctx.edits.insert_before(first, line)
                done.add((ep.loop, obj))
                ctx.report(self.code, ep.loop, f"{obj}.set_epoch({var}) reshuffles the shards every epoch")


    def _count_passes(self, ctx: Context, loader, ep, samplers) -> None:
        """A generator hands out the loader's batches pass after pass (`while True: for b in loader:
        yield b`): number the passes and give each one its epoch, where the generator starts a pass."""
        a = ctx.anatomy
        fn = ep.scope
        whiles = [p for p in a.stmt_parent.get(ep.loop, ()) if endless_loop(p, a.qualname)]
        if not isinstance(fn, cst.FunctionDef) or not whiles or _calls_set_epoch(whiles[-1]):
            return
        # every caller must hand the generator a loader that now has a DistributedSampler, else
        # `.sampler.set_epoch` would fail on the others (an evaluation loader's SequentialSampler)
        sharded = set()
        for other in samplers:
            sharded.update(r for r in (other.target, *other.bound) if r)
        params = [p.name.value for p in fn.params.params]
        index = params.index(ep.loader_ref) if ep.loader_ref in params else None
        sites = [c for c in a.calls if c.call.func is not None and isinstance(c.call.func, cst.Name) and c.call.func.value == fn.name.value]
        handed = []
        for c in sites:
            arg_node = next((x for x in c.call.args if x.keyword is not None and x.keyword.value == ep.loader_ref), None)
            if arg_node is None and index is not None:
                positional = [x for x in c.call.args if x.keyword is None and not x.star]
                arg_node = positional[index] if index < len(positional) else None
            handed.append(ctx.code(arg_node.value) if arg_node is not None else None)
        if not sites or not all(h in sharded for h in handed):
            ctx.warn(
                "DST903",
                ep.loop,
                f"{fn.name.value}() hands out batches pass after pass, but not only from sharded training "
                f"loaders: call {ep.loader_ref}.sampler.set_epoch(<pass number>) before each pass",
            )
            return
        counter = ctx.fresh("epoch")
        obj = f"{ep.loader_ref}.sampler"
        ctx.edits.insert_before(whiles[-1], ctx.stmts(f"{counter} = 0"))
        ctx.edits.insert_before(ep.loop, ctx.stmts(f"{obj}.set_epoch({counter})\n{counter} += 1"))
        ctx.report(
            self.code, ep.loop, f"{obj}.set_epoch({counter}) before each pass of {fn.name.value}() reshuffles the shards"
        )


def _pass_number(ctx: Context, ep, loader_stmt) -> Optional[str]:
    """The number to give ``set_epoch``: the epoch loop's variable, unless the loader is built (or a
    helper's loader bound) inside a loop over a collection (``for text in texts: loader =
    DataLoader(...)`` or ``loader = make_loader(text)``, one loader per file),
    whose variable is an item, not a number: then the variable of the nearest enclosing loop over a
    call (``range(epochs)``, ``tqdm(range(...))``), or None when there is none."""
    built_inside = ep.loop in ctx.anatomy.stmt_parent.get(loader_stmt, ())
    if not built_inside or isinstance(ep.loop.iter, cst.Call):
        return ep.var
    for outer in reversed(ctx.anatomy.stmt_parent.get(ep.loop, ())):
        if isinstance(outer, cst.For) and isinstance(outer.iter, cst.Call) and isinstance(outer.target, cst.Name):
            return outer.target.value
    return None


def _binding_in(body: cst.IndentedBlock, name: str):
    """The last statement of the loop body (top level) that assigns `name`, if any."""
    found = None
    for stmt in body.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign) and any(name in _target_names(t.target) for t in small.targets):
                    found = stmt
    return found


def _target_names(t: cst.BaseExpression):
    if isinstance(t, cst.Name):
        return {t.value}
    if isinstance(t, (cst.Tuple, cst.List)):
        return set().union(*(_target_names(e.value) for e in t.elements)) if t.elements else set()
    if isinstance(t, cst.StarredElement):
        return _target_names(t.value)
    return set()


def _calls_set_epoch(loop: cst.For, obj: Optional[str] = None) -> bool:
    """The loop body calls ``set_epoch`` – on `obj` (a sampler's dotted name) when given: the
    script's own ``sampler.set_epoch(epoch)`` for one loader says nothing of another loader's."""
    found = []

    class V(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "set_epoch":
                if obj is None or dotted(node.func.value) in (None, obj):
                    found.append(node)

    walk(loop.body, V())
    return bool(found)


RULE = SetEpoch()
