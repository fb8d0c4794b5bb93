"""DST302 prints happen once."""

from __future__ import annotations

import libcst as cst

from distify.helper_effects import exact_helper_calls
from distify.library import names_of
from distify.rules.base import Context, Rule, call_statement


# tqdm.write and its twins, sys.stdout.write / sys.stderr.write, pprint (distify.library)
PRINT_LIKE = names_of("print")


class Rank0Print(Rule):
    """Print from the main process only.

    What it does:
        Puts ``print(...)`` statements under ``if runtime.is_main_process():`` – merging
        neighbouring prints into one ``if`` and extending a lone ``if`` around a print
        (``if batch_idx % args.log_interval == 0 and runtime.is_main_process():``). The same for
        every other call that writes to the terminal (the ``console`` rows of ``distify.library``):
        ``sys.stdout.write``/``sys.stderr.write`` progress lines, ``tqdm.write``, ``pprint.pprint``;
        ``print(..., file=f)`` is a print too (a file opened for writing goes to ``os.devnull`` on
        the other ranks, DST304). A call of a function of the user's project that only prints
        (``check_accuracy(loader, model)`` printing a score it computes from values it only reads
        would not qualify: a forward is more than a print) is guarded where it is called.

    Why:
        Every rank runs the same code; without a guard each epoch log appears N times, interleaved.
        The statement is guarded, not the stream: replacing ``sys.stdout`` on the other ranks at
        run time would also swallow their tracebacks and the warnings that say why a rank failed,
        and the guard shows in the script what runs where.

    Example:
        print(f"epoch {epoch} loss {loss:.4f}")

        becomes

        if runtime.is_main_process():
            print(f"epoch {epoch} loss {loss:.4f}")

        and ``sys.stdout.write(f"\\r[batch {i}/{n}] loss {loss:.4f}")`` likewise.
    """

    code = "DST302"
    name = "rank0-print"
    summary = "print on rank 0 only"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        if a.entry_owner is None:
            return
        for site in a.calls:
            if not ((site.qualname is None and _is_print(site.call)) or site.qualname in PRINT_LIKE):
                continue
            if not call_statement(site.stmt, site.call) or ctx.in_rank_guard(site.stmt):
                continue
            if ctx.guard_statement(site.stmt):
                ctx.report(self.code, site.call, f"{ctx.code(site.call.func)} runs on the main process only")
        for site, target, found in exact_helper_calls(a, ctx.plan.script_path, ctx.options):
            if ctx.in_rank_guard(site.stmt) or any(e.kind != "print" for e in found):
                continue  # a helper that also writes is DST301's
            if ctx.guard_statement(site.stmt):
                ctx.report(self.code, site.call, f"{target.qualname.rsplit('.', 1)[-1]}() ({target.where}) only prints: "
                                                 "it runs on the main process only")


def _is_print(call) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value == "print"


RULE = Rank0Print()
