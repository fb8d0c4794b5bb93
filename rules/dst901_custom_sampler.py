"""DST901 a training DataLoader with its own sampler: each rank draws its share of it."""

from __future__ import annotations

import libcst as cst

from distify.records import DIST_SAMPLER
from distify.syntax import arg, all_nodes
from distify.data_sources import built_classes, gated_sampler, splits_itself
from distify.split_draws import written_by_training
from distify.rules.base import Context, Rule

SHARE_SAMPLER = "distify.runtime.ShareSampler"


class CustomSampler(Rule):
    """Give each rank its share of a training DataLoader's own ``sampler`` or ``batch_sampler``.

    What it does:
        Wraps the sampler the script chose (``WeightedRandomSampler``, ``SubsetRandomSampler``, a
        class-balanced, curriculum or bucketing sampler of the script, a ``batch_sampler``) in
        ``runtime.ShareSampler``: every rank draws the sampler's whole sequence from the same seed
        and keeps every N-th index (or batch). The sequence is padded with its first elements to a
        multiple of N, as ``DistributedSampler`` pads, so every rank makes the same number of steps.
        The seed of each pass comes from rank 0's global torch generator (broadcast when the pass
        starts), or from the sampler's own ``generator`` when it has one. A sampler whose class in
        this file asks for the rank or the world size already chooses its own share: it is left as
        it is, with a warning. A sampler built from values the training loop writes from its batches
        (per-sample losses kept by index for hard-example sampling) is refused: each rank would
        learn other weights from its own shard (``split_draws.written_by_training``).

    Why:
        Left whole, every rank draws the same samples and N processes do the work of one. Replaced
        by a ``DistributedSampler``, the weighting or the order the script asked for would be lost.
        Drawn from one seed and dealt out, each rank's share is an independent draw with the
        sampler's weights, the shares are disjoint, and together they are one draw of the original.

    Example:
        loader = DataLoader(train_set, batch_size=32, sampler=WeightedRandomSampler(w, len(w)))

        becomes

        loader = DataLoader(train_set, batch_size=32, sampler=runtime.ShareSampler(WeightedRandomSampler(w, len(w))))
    """

    code = "DST901"
    name = "custom-sampler"
    summary = "each rank draws its share of a training loader's own sampler"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        for loader in a.loaders:
            if loader.role != "train" or a.sampler_call(loader) is not None or loader in ctx.plan.switched:
                continue
            for pos, keyword in ((5, "sampler"), (6, "batch_sampler")):
                given = arg(loader.call.call, pos, keyword)
                what = loader.target or "training DataLoader"
                gate = gated_sampler(a, loader, given.value) if given is not None else None
                if gate is not None:
                    ctx.block(
                        self.code, given.value,
                        f"{what} gets a DistributedSampler only when `{ctx.code(gate.test)}` is true, a flag its "
                        f"callers pass: distify does not set it, and sharing out what is given would wrap None: "
                        f"not migrated; pass a true value where the training loader is built (every rank "
                        f"then reads its shard) and call {what}.sampler.set_epoch(epoch) each epoch",
                    )
                    continue
                if given is None or _shared(a, given.value):
                    continue
                if not isinstance(given.value, (cst.Call, cst.Name, cst.Attribute)):
                    ctx.warn(  # `s if phase == "train" else None`: which sampler it is cannot be read here
                        self.code,
                        given.value,
                        f"{what} has a {keyword} chosen by an expression: not shared out; pass "
                        f"{keyword}={ctx.runtime}.ShareSampler(<sampler>) where the sampler is not distributed",
                    )
                    continue
                if splits_itself(a, given.value):
                    ctx.warn(
                        self.code,
                        given.value,
                        f"{what}'s {keyword} asks for the rank itself: assumed to draw this rank's share; "
                        "left as it is",
                    )
                    continue
                learnt = written_by_training(a, loader, given.value)
                if learnt is not None:
                    ctx.block(
                        self.code, learnt,
                        f"{what}'s {keyword} is built from values this training loop writes from its batches: "
                        "each rank would learn them from its own shard and build another sampler, so shares "
                        "drawn with one seed overlap and miss samples: not migrated; reduce those values across "
                        "the ranks before the sampler is built, or share the sampler out by hand",
                    )
                    continue
                ctx.edits.call_around(given.value, f"{ctx.runtime}.ShareSampler")
                ctx.plan.shared.append(loader)
                ctx.report(
                    self.code,
                    given.value,
                    f"{what}'s {keyword} shared out with runtime.ShareSampler: every rank draws its sequence "
                    "from one seed and keeps every N-th element (padded to a multiple of N)",
                )


def _shared(a, value: cst.BaseExpression) -> bool:
    """Already a share or distributed: a ``runtime.ShareSampler(...)`` or ``DistributedSampler(...)``
    (an earlier run's), inline or through a name, anywhere in the expression given
    (``sampler=train_sampler if x == "train" else None``)."""
    done = {SHARE_SAMPLER, *DIST_SAMPLER}
    for n in all_nodes(value):
        if isinstance(n, cst.Call) and a.qualname(n.func) in done:
            return True
        if isinstance(n, (cst.Name, cst.Attribute)) and not isinstance(value, cst.Call):
            if any(a.qualname(cst.parse_expression(name)) in done for name in built_classes(a, n)):
                return True
    return False


RULE = CustomSampler()
