"""DST305 loggers and TensorBoard writers on rank 0."""

from __future__ import annotations

import libcst as cst

from distify.records import LOGGING_BASIC_CONFIG, SUMMARY_WRITER
from distify.syntax import dotted, all_nodes
from distify.rules.base import Context, Rule, add_kwarg, call_statement, kwarg_value
from distify.writes import per_rank_file


class Rank0Logging(Rule):
    """Log from the main process only.

    What it does:
        ``logging.basicConfig(level=X)`` gets ``level=X if runtime.is_main_process() else
        logging.WARNING`` (other ranks still report warnings and errors). ``wandb.init(...)`` –
        a statement, ``run = wandb.init(...)`` or ``with wandb.init(...) as run:`` – gets
        ``mode=None if runtime.is_main_process() else "disabled"`` (a ``mode=`` of the script's own
        becomes ``mode=X if ... else "disabled"``), and other ``wandb.log/watch/save/...``
        statements run on rank 0 only. A TensorBoard ``SummaryWriter`` is created on rank 0 only
        (``None`` elsewhere) and the statements that use it are guarded.

        W&B's "disabled" mode rather than an ``if`` around ``wandb.init``: the other ranks still
        get a run object whose methods do nothing and a ``wandb.config`` filled from
        ``config=...``, so a ``with`` body, ``run.log(...)`` and ``config.epochs`` work unchanged
        on every rank. Guarding the call instead would leave those ranks without ``wandb.config``
        (an error on first use), and ``with (wandb.init(...) if main else nullcontext()) as run``
        would give them ``run = None``.

    Why:
        Each rank would print the same INFO lines and write its own event file into the same log
        directory, so curves appear N times in TensorBoard.

    Example:
        writer = SummaryWriter(args.log_dir)

        becomes

        writer = SummaryWriter(args.log_dir) if runtime.is_main_process() else None

        and

        with wandb.init(project="demo", config=hparams) as run:

        becomes

        with wandb.init(project="demo", config=hparams, mode=None if runtime.is_main_process() else "disabled") as run:
    """

    code = "DST305"
    name = "rank0-logging"
    summary = "log and write TensorBoard events on rank 0 only"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        cond = ctx.main_process
        for site in a.calls_to(LOGGING_BASIC_CONFIG):
            level = kwarg_value(site.call, "level")
            if level is None or ctx.anatomy.reads_rank(level):
                continue
            logging_name = dotted(site.call.func).rsplit(".", 1)[0]
            new_src = f"{ctx.code(level)} if {ctx.main_process_at(site.stmt)} else {logging_name}.WARNING"

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
            if site.qualname == "wandb.init":
                self._wandb_init(ctx, site)
                continue
            if (site.qualname or "").startswith("wandb.") and call_statement(site.stmt, site.call):
                if not ctx.in_rank_guard(site.stmt):
                    if ctx.guard_statement(site.stmt):
                        ctx.report(self.code, site.call, f"{ctx.code(site.call.func)} runs on the main process only")

        writers = []
        for site in a.calls_to(SUMMARY_WRITER):
            stmt = site.stmt
            if not (
                isinstance(stmt, cst.SimpleStatementLine)
                and isinstance(stmt.body[0], cst.Assign)
                and stmt.body[0].value is site.call
            ) or ctx.in_rank_guard(stmt) or per_rank_file(a, site):
                continue  # already on some ranks, or each rank's own log directory: every rank keeps its writer
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


    def _wandb_init(self, ctx: Context, site) -> None:
        """`wandb.init(...)` runs on every rank, in W&B's "disabled" mode except on rank 0."""
        call = site.call
        if ctx.in_rank_guard(site.stmt) or any(x.star for x in call.args):
            return  # already rank-aware, or a mode hidden in **kwargs
        mode = kwarg_value(call, "mode")
        if mode is not None and ("disabled" in _literals(mode) or ctx.anatomy.reads_rank(mode)):
            return
        cond = ctx.main_process
        if mode is None:
            value = cst.parse_expression(f'None if {cond} else "disabled"')
            ctx.edits.replace(call, lambda n, value=value: add_kwarg(n, "mode", value))
        else:

            def rewrite(node: cst.Call, cond=cond) -> cst.Call:
                args = []
                for x in node.args:
                    if x.keyword is not None and x.keyword.value == "mode":
                        v = x.value
                        if isinstance(v, (cst.IfExp, cst.Lambda, cst.NamedExpr)):
                            v = v.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                        x = x.with_changes(
                            value=cst.IfExp(
                                test=cst.parse_expression(cond), body=v, orelse=cst.SimpleString('"disabled"')
                            )
                        )
                    args.append(x)
                return node.with_changes(args=args)

            ctx.edits.replace(call, rewrite)
        ctx.report(self.code, call, "wandb.init logs from the main process only (mode \"disabled\" on the other ranks)")


def _literals(expr: cst.BaseExpression) -> set:
    """The string values spelled in an expression (`"disabled"` in `mode=... else "disabled"`)."""
    return {n.evaluated_value for n in all_nodes(expr) if isinstance(n, cst.SimpleString)}


RULE = Rank0Logging()
