"""DST956 prints, progress bars and trackers that run on every rank."""

from __future__ import annotations

from typing import Optional

from distify.anatomy import Anatomy
from distify.records import SUMMARY_WRITER, TQDM
from distify.syntax import arg
from distify.helper_effects import advice, unguarded_helper_calls
from distify.writes import terminal_print
from distify.rules.base import AuditCheck, Context

TRACKERS = SUMMARY_WRITER | {"wandb.init", "mlflow.start_run", "comet_ml.Experiment", "neptune.init_run"}


class LogEveryRank(AuditCheck):
    """Logs, progress bars and experiment trackers appear once.

    What it does:
        Part of the output audit (and of ``distify lint``). Reports ``print`` (and the other writes to
        the terminal: ``sys.stdout.write``, ``tqdm.write``, ``pprint``) and ``tqdm`` calls on
        the training path (inside a loop that trains, or in a function such a loop calls) and
        experiment trackers (``SummaryWriter``, ``wandb.init``, ``mlflow.start_run``) anywhere,
        when they run on every rank: not under a rank condition, and not saying which rank
        speaks (a rank or device in the message or name). A bar with a ``disable=`` that reads
        the rank, a tracker with a ``mode=`` that does, and a print whose statement also makes
        a collective (DST911 reports it) are fine.
        Also a call on the training path, on every rank, of a function of another module of the
        project (not migrated) that prints itself or through the project functions it calls.

    Why:
        Every rank runs the same loop: each epoch line is printed N times, N progress bars fight
        over one terminal, and N tracker runs (or N event files in one log directory) split or
        duplicate the curves.

    Example:
        for epoch in range(epochs):
            loss = train(...)
            print(f"epoch {epoch} loss {loss:.3f}")      # DST956 in a DDP script

        fix: if runtime.is_main_process(): print(...)  (tqdm: disable=not runtime.is_main_process())
    """

    code = "DST956"
    name = "log-every-rank"
    summary = "audit: prints, progress bars or trackers on every rank"

    def check(self, ctx: Context, a: Anatomy) -> None:
        for c in a.calls:
            what = _kind(a, c)
            if what is None:
                continue
            if what != "tracker" and not a.on_training_path(c.stmt):
                continue
            if a.call_on_some_ranks(c) or a.mentions_rank(c.call) or ctx.collectives_in(c.stmt):
                continue
            if what == "tracker":
                msg = "the tracker starts on every rank (N runs or N event files); create it on rank 0 only"
            elif what == "tqdm":
                msg = "the progress bar shows on every rank; pass disable=not runtime.is_main_process()"
            else:
                msg = "print runs on every rank, each line appears N times; print on rank 0 only"
            ctx.warn(self.code, c.call, msg)
        for c, t, found in unguarded_helper_calls(a, ctx.plan.script_path, ctx.options):
            first = next((e for e in found if e.kind == "print"), None)
            if first is not None and a.on_training_path(c.stmt) and not ctx.collectives_in(c.stmt):
                ctx.warn(self.code, c.call, advice(c, t, first))


def _kind(a: Anatomy, c) -> Optional[str]:
    call = c.call
    q = c.qualname
    if terminal_print(c):
        return "print"
    for kinds, kind, switch in ((TQDM, "tqdm", "disable"), (TRACKERS, "tracker", "mode")):
        if q in kinds:
            off = arg(call, None, switch)
            return None if off is not None and a.mentions_rank(off.value) else kind
    return None


RULE = LogEveryRank()
