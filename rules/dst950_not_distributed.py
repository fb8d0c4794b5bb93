"""DST950 a script that trains but came out (or is) not distributed at all."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import Anatomy
from distify.facts import training_call
from distify.syntax import all_nodes
from distify.rules.base import AuditCheck, Context


class NotDistributed(AuditCheck):
    """Say so when a training script is left single-process without a word.

    What it does:
        Part of the output audit. When a script that trains – a loop reaches ``backward()`` or an
        optimizer ``step()``, and the module builds its optimizer from some ``.parameters()`` –
        comes out with no distributed code at all (no process group, no ``hvd.init()``, no DDP
        wrapper or ``DistributedOptimizer``), and no other warning says why, reports the training
        call instead of leaving the file unchanged in silence.

    Why:
        A user who ran distify believes the script is ready for N processes. Launched that way, a
        script that is not distributed trains N independent copies on the same data: the job
        runs, the numbers look plausible, and the extra hardware bought nothing. A loud refusal
        is better than a silent non-migration.

    Example:
        model = AutoModelForSequenceClassification.from_pretrained(name)
        optimizer = AdamW(model.parameters(), lr=5e-5)   # not torch.optim: not recognised
        for batch in train_loader:
            loss = model(**batch).loss
            loss.backward()                              # DST950: trains, not distributed
            optimizer.step()

        fix: wrap the model in DDP and shard the loader by hand (or report the shape to distify)
    """

    code = "DST950"
    name = "not-distributed"
    summary = "audit: a training script left without any distributed code"
    needs_distributed = False

    def check(self, ctx: Context, a: Anatomy) -> None:
        if a.flavour is not None or ctx.plan.prior_warnings:
            return
        if not _builds_optimizer(a):
            return
        for loop in a.facts.training_loops():
            site = next((n for n in all_nodes(loop) if training_call(n)), None)
            node = site if site is not None else loop
            ctx.warn(
                self.code,
                node,
                "this script trains but has no distributed code (no process group, no DDP or "
                "DistributedOptimizer): launched on N processes it trains N copies on the same data; "
                "migrate it (by hand where distify cannot: see distify --explain DST950)",
            )
            return


def _builds_optimizer(a: Anatomy) -> bool:
    """An optimizer is constructed here: a torch.optim class, or any call handed ``.parameters()``."""
    if a.optimizers:
        return True
    for c in a.calls:
        for x in c.call.args[:1]:
            for n in all_nodes(x.value):
                if (
                    isinstance(n, cst.Call)
                    and isinstance(n.func, cst.Attribute)
                    and n.func.attr.value in ("parameters", "named_parameters")
                ):
                    return True
    return False


RULE = NotDistributed()
