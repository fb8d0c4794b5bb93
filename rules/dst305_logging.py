"""DST305 loggers and TensorBoard writers on rank 0."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import LOGGING_BASIC_CONFIG, SUMMARY_WRITER, dotted
from distify.rules.base import Context, Rule, call_statement, kwarg_value


class Rank0Logging(Rule):
    """Log from the main process only.

    What it does:
        ``logging.basicConfig(level=X)`` gets ``level=X if runtime.is_main_process() else
        logging.WARNING`` (other ranks still report warnings and errors); ``wandb.init/log/...``
        statements run on rank 0 only. A TensorBoard
        ``SummaryWriter`` is created on rank 0 only (``None`` elsewhere) and the statements that
        use it are guarded.

    Why:
        Each rank would print the same INFO lines and write its own event file into the same log
        directory, so curves appear N times in TensorBoard.

    Example:
        writer = SummaryWriter(args.log_dir)

        becomes

        writer = SummaryWriter(args.log_dir) if runtime.is_main_process() else None
    """

    code = "DST305"
    name = "rank0-logging"
    summary = "log and write TensorBoard events on rank 0 only"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        cond = ctx.main_process
        for site in a.calls_to(LOGGING_BASIC_CONFIG):
            level = kwarg_value(site.call, "level")
            if level is None or "main_process" in ctx.code(level) or "rank" in ctx.code(level):
                continue
            logging_name = dotted(site.call.func).rsplit(".", 1)[0]
            new_src = f"{ctx.code(level)} if {cond} else {logging_name}.WARNING"

            def rewrite(node: cst.Call, new_src=new_src) -> cst.Call:
                return node.with_changes(
                    args=[
                        x.with_changes(value=cst.parse_expression(new_src))
                        if x.keyword is not None and x.keyword.value == "level"
                        else x
                        for x in node.args
                    ]
                )

            ctx.edits.replace(site.call, rewrite)
            ctx.report(self.code, site.call, "INFO logging on the main process only; others log warnings")

        for site in a.calls:
            if (site.qualname or "").startswith("wandb.") and call_statement(site.stmt, site.call):
                if not ctx.in_rank_guard(site.stmt):
                    ctx.guard_statement(site.stmt)
                    ctx.report(self.code, site.call, f"{ctx.code(site.call.func)} runs on the main process only")

        writers = []
        for site in a.calls_to(SUMMARY_WRITER):
            stmt = site.stmt
            if not (
                isinstance(stmt, cst.SimpleStatementLine)
                and isinstance(stmt.body[0], cst.Assign)
                and stmt.body[0].value is site.call
            ) or ctx.in_rank_guard(stmt):
                continue
            name = dotted(stmt.body[0].targets[0].target)
            if name is None:
                continue
            writers.append(name)
            ctx.edits.replace(
                site.call,
                lambda n, cond=cond: cst.IfExp(
                    test=cst.parse_expression(cond), body=n, orelse=cst.Name("None")
                ),
            )
            ctx.report(self.code, site.call, f"{name} is created on the main process only")
        for site in a.calls:
            if not isinstance(site.call.func, cst.Attribute):
                continue
            if dotted(site.call.func.value) in writers and call_statement(site.stmt, site.call):
                if not ctx.in_rank_guard(site.stmt):
                    ctx.guard_statement(site.stmt)


RULE = Rank0Logging()
