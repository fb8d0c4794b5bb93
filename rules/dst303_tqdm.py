"""DST303 progress bars on rank 0 only."""

from __future__ import annotations

import libcst as cst

from distify.records import TQDM
from distify.rules.base import HOROVOD_BACKEND, Context, Rule, add_kwarg, kwarg_value


class Rank0Tqdm(Rule):
    """Show progress bars on the main process only.

    What it does:
        Adds ``disable=not runtime.is_main_process()`` to ``tqdm(...)``/``trange(...)``; an
        existing ``disable=x`` becomes ``disable=x or not runtime.is_main_process()``.

    Why:
        N bars redrawing the same terminal line garble the output. Disabling (rather than not
        creating) the bar keeps the loop code identical on every rank.

    Example:
        for x, y in tqdm(train_loader):

        becomes

        for x, y in tqdm(train_loader, disable=not runtime.is_main_process()):
    """

    code = "DST303"
    name = "rank0-tqdm"
    summary = "disable tqdm off rank 0"

    def apply(self, ctx: Context) -> None:
        for site in ctx.anatomy.calls_to(TQDM):
            if ctx.in_rank_guard(site.stmt):
                continue
            cond = f"not {ctx.main_process}" if ctx.backend != HOROVOD_BACKEND else f"{ctx.hvd}.rank() != 0"
            existing = kwarg_value(site.call, "disable")
            if existing is not None:
                if ctx.anatomy.reads_rank(existing):  # already differs between ranks
                    continue
                old = ctx.code(existing)
                if isinstance(existing, (cst.IfExp, cst.Lambda, cst.NamedExpr)):
                    old = f"({old})"
                new_src = f"{old} or {cond}"

                def rewrite(node: cst.Call, new_src=new_src) -> cst.Call:
                    return node.with_changes(
                        args=[
                            x.with_changes(value=cst.parse_expression(new_src))
                            if x.keyword is not None and x.keyword.value == "disable"
                            else x
                            for x in node.args
                        ]
                    )
            else:
                def rewrite(node: cst.Call, cond=cond) -> cst.Call:
                    return add_kwarg(node, "disable", cst.parse_expression(cond))

            ctx.edits.replace(site.call, rewrite)
            ctx.report(self.code, site.call, "progress bar shown on the main process only")


RULE = Rank0Tqdm()
