"""DST302 prints happen once."""

from __future__ import annotations

import libcst as cst

from distify.library import names_of
from distify.rules.base import Context, Rule, call_statement


PRINT_LIKE = names_of("print")  # tqdm.write and its twins (distify.library)


class Rank0Print(Rule):
    """Print from the main process only.

    What it does:
        Puts ``print(...)`` statements under ``if runtime.is_main_process():`` – merging
        neighbouring prints into one ``if`` and extending a lone ``if`` around a print
        (``if batch_idx % args.log_interval == 0 and runtime.is_main_process():``).

    Why:
        Every rank runs the same code; without a guard each epoch log appears N times, interleaved.

    Example:
        print(f"epoch {epoch} loss {loss:.4f}")

        becomes

        if runtime.is_main_process():
            print(f"epoch {epoch} loss {loss:.4f}")
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
                ctx.report(self.code, site.call, "print runs on the main process only")


def _is_print(call) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value == "print"


RULE = Rank0Print()
