"""DST966 a training step that runs on some ranks only."""

from __future__ import annotations

from distify.anatomy import Anatomy
from distify.facts import training_call
from distify.syntax import dotted
from distify.rules.base import AuditCheck, Context


class TrainingOnSomeRanks(AuditCheck):
    """Every rank takes every training step.

    What it does:
        Part of the output audit (and of ``distify lint``). Reports a call that trains – a
        ``backward()``, an optimizer's ``step()``, or a call of a function or method of the script
        that trains (``self.train_epoch()``, ``train(model, loader, optimizer)``) – that runs on
        some ranks only: inside an ``if`` on the rank (``if runtime.is_main_process():``,
        ``if rank == 0:``), in a branch of a conditional expression on it, or after a rank test in
        an ``and``. On distify's own output the file is refused rather than written.

    Why:
        Data-parallel training is one step taken together: DDP and FSDP average the gradients in
        ``backward`` and Horovod in ``step``, collectives every rank must join. A step on rank 0
        alone waits for the others until the timeout (a hang), and where no collective is involved
        the ranks that skip it train nothing. A rank-0 guard put around a print or a log line that
        also computes its value by training (``print(epoch, self.train_epoch())``) is the usual
        way this happens.

    Example:
        if runtime.is_main_process():
            print(epoch, self.train_epoch())   # DST966: ranks 1.. never train

        should be

        train_loss = self.train_epoch()
        if runtime.is_main_process():
            print(epoch, train_loss)
    """

    code = "DST966"
    name = "training-on-some-ranks"
    summary = "audit: a training step runs on some ranks only"
    refuses_own_output = True

    def check(self, ctx: Context, a: Anatomy) -> None:
        optimizers = {o.target for o in a.optimizers if o.target}
        for site in a.calls:
            func = site.call.func
            direct = training_call(site.call) and (func.attr.value == "backward" or dotted(func.value) in optimizers)
            callee = None if direct else a.callee(site.call, site.scope)
            if not direct and (callee is None or not a.trains(callee)):
                continue
            if not a.facts.call_under_rank_test(site):
                continue  # (a call inside a function that runs on some ranks is reported at that call)
            what = f"{ctx.code(func)}()"
            ctx.warn(
                self.code, site.call,
                f"{what} trains on some ranks only (it runs under a test of the rank): every rank must take each "
                "step, whose gradients are averaged across the ranks (the others would wait for it, or train "
                "nothing); compute it on every rank and keep only the use of its result under the test",
            )


RULE = TrainingOnSomeRanks()
