"""DST304 directories and files are managed by rank 0."""

from __future__ import annotations

from distify.anatomy import MAKEDIRS
from distify.rules.base import Context, Rule, call_statement


class Rank0Filesystem(Rule):
    """Create, copy and remove directories from the main process only.

    What it does:
        Puts ``os.makedirs``/``os.mkdir`` and ``shutil`` copy/move/rmtree statements, and
        ``Path(...).mkdir(...)``, under the main-process guard.

    Why:
        N processes racing to create or delete the same directory fail with ``FileExistsError``
        (``os.mkdir``) or delete each other's work (``shutil.rmtree``); the other ranks write
        nothing there anyway once saves are rank-0 only.

    Example:
        os.makedirs(args.out_dir, exist_ok=True)

        becomes

        if runtime.is_main_process():
            os.makedirs(args.out_dir, exist_ok=True)
    """

    code = "DST304"
    name = "rank0-filesystem"
    summary = "create directories on rank 0 only"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        if a.entry_owner is None:
            return
        for site in a.calls:
            is_fs = site.qualname in MAKEDIRS or (
                site.qualname is None
                and hasattr(site.call.func, "attr")
                and site.call.func.attr.value == "mkdir"
                and "Path" in ctx.code(site.call.func)
            )
            if not is_fs or not call_statement(site.stmt, site.call) or ctx.in_rank_guard(site.stmt):
                continue
            ctx.guard_statement(site.stmt)
            ctx.report(self.code, site.call, f"{ctx.code(site.call.func)} runs on the main process only")


RULE = Rank0Filesystem()
