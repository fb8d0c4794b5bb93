"""DST963 training whose input is the same on every rank."""

from __future__ import annotations

from distify.anatomy import Anatomy
from distify.rank_input import INDEX_DRAWS, training_input
from distify.rules.base import AuditCheck, Context

SAME = "every rank trains on the same data; N processes do the work of one"


class SameInputEveryRank(AuditCheck):
    """Training whose input does not depend on the rank.

    What it does:
        Part of the output audit (and of ``distify lint``). Asks the fact layer whether the
        training input differs between ranks (``distify.rank_input``): a loader feeds the training
        loop, or the loop draws its data from a random stream that differs by rank. When nothing
        does, reports the line: the whole data in every step (full-batch training on one graph,
        LBFGS over one tensor), or data generated from the global random stream the script seeds
        alike on every rank (a regression on batches it makes itself). Index draws (``torch.randint`` batch
        indices) are DST959's.

    Why:
        The wrapper averages N identical gradients: the model trains exactly as on one process,
        at N times the cost, and nothing fails to say so.

    Example:
        for epoch in range(200):
            loss = F.cross_entropy(model(features, adj)[train_mask], labels[train_mask])
            loss.backward()   # DST963: every rank trains on the same data

        fix: split the data by runtime.rank() (nodes, tensors, environments with a per-rank seed),
        seed each rank's generator differently once the model is built, or run on one process
    """

    code = "DST963"
    name = "same-input-every-rank"
    summary = "audit: training input identical on every rank"

    def check(self, ctx: Context, a: Anatomy) -> None:
        fact = training_input(a)
        if fact.varies or fact.node is None:
            return
        if fact.how == "drawn alike":
            if a.qualname(fact.node.func) in INDEX_DRAWS:
                return  # DST959 reports batch indices drawn alike
            ctx.warn(
                self.code,
                fact.node,
                f"{SAME}: {ctx.code(fact.node.func)}() makes the training data from the global random stream, "
                "which the script seeds alike on every rank; seed each rank differently once the model is built "
                "(torch.manual_seed(seed + rank), or distify --seed-per-rank) or pass a per-rank generator=",
            )
            return
        ctx.warn(
            self.code,
            fact.node,
            f"{SAME}: no loader feeds this training loop and nothing in it differs by rank (the whole data in "
            "every step); split the data by runtime.rank(), or run it on one process",
        )


RULE = SameInputEveryRank()
