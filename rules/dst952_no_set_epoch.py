"""DST952 a shuffling DistributedSampler that never gets a new epoch."""

from __future__ import annotations

from typing import Set

import libcst as cst

from distify.anatomy import Anatomy
from distify.dataflow import ref_text
from distify.syntax import arg
from distify.parallel import assigned_to, feeding_loaders, sampler_of
from distify.rules.base import AuditCheck, Context


class NoSetEpoch(AuditCheck):
    """A shuffling DistributedSampler must be told the epoch on every pass.

    What it does:
        Part of the output audit (and of ``distify lint``). For each DistributedSampler that
        shuffles (the default) and serves a loader feeding training, looks for
        ``sampler.set_epoch(...)`` – on the sampler's name or on ``<loader>.sampler``, in any
        function the loader reaches – called inside a loop or on the training path. Reports the
        sampler when there is none, or when it is called once outside every loop, or with a
        constant.

    Why:
        ``DistributedSampler`` derives its permutation from ``seed + epoch``. Without
        ``set_epoch`` every epoch replays the first epoch's order on every rank: the data are
        still split, but never reshuffled, which silently changes training dynamics compared
        with the single-process ``shuffle=True`` it replaced.

    Example:
        sampler = DistributedSampler(train_set)
        loader = DataLoader(train_set, sampler=sampler)
        for epoch in range(epochs):        # DST952: the order never changes
            for x, y in loader:
                ...

        fix: call sampler.set_epoch(epoch) at the top of the epoch loop
    """

    code = "DST952"
    name = "no-set-epoch"
    summary = "audit: a shuffling DistributedSampler without set_epoch each pass"

    def check(self, ctx: Context, a: Anatomy) -> None:
        calls = [
            c for c in a.calls if isinstance(c.call.func, cst.Attribute) and c.call.func.attr.value == "set_epoch"
        ]
        for loader in feeding_loaders(a):
            _, sampler = sampler_of(a, loader)
            if sampler is None or not _shuffles(sampler):
                continue
            f = a.facts  # by key: an attribute of the instance is one whatever each method calls the instance
            names: Set[tuple] = {f.key(s, r + ".sampler") for s, r in loader.refs}
            if loader.target:
                names.add(f.key(loader.call.scope, loader.target + ".sampler"))
            site = next((c for c in a.calls if c.call is sampler), None)
            bound = assigned_to(site) if site is not None else None
            if bound:
                names.add(f.key(site.scope, bound))
            mine = [c for c in calls if f.key(c.scope, _spelled(c.call.func.value)) in names]
            good = [c for c in mine if _per_pass(a, c)]
            if good:
                continue
            why = (
                "is never told the epoch" if not mine else "gets set_epoch only once, outside the loops, or with a constant"
            )
            ctx.warn(
                self.code,
                sampler,
                f"the shuffling DistributedSampler of {loader.target or 'a training loader'} {why}: every epoch "
                "repeats the same order; call sampler.set_epoch(epoch) at the start of each epoch",
            )


def _spelled(expr: cst.BaseExpression):
    """`loaders["train"].sampler` -> 'loaders["train"].sampler' (see ref_text), else dotted."""
    if isinstance(expr, cst.Attribute):
        base = ref_text(expr.value)
        return f"{base}.{expr.attr.value}" if base else None
    return ref_text(expr)


def _shuffles(call: cst.Call) -> bool:
    a = arg(call, 3, "shuffle")
    return a is None or not (isinstance(a.value, cst.Name) and a.value.value == "False")


def _per_pass(a: Anatomy, c) -> bool:
    value = arg(c.call, 0, "epoch")
    if value is not None and isinstance(value.value, cst.Integer):
        return False
    return bool(a.loops_around(c.stmt)) or a.on_training_path(c.stmt)


RULE = NoSetEpoch()
