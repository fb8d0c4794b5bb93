"""DST005 --local_rank from old launch utilities."""

from __future__ import annotations

import libcst as cst

from distify.rules.base import Context, Rule


class LocalRankArgument(Rule):
    """Read the local rank from the environment, not from a ``--local_rank`` argument.

    What it does:
        When the script declares ``--local_rank`` / ``--local-rank`` (kept, so old launchers still
        work), every read of ``args.local_rank`` becomes ``runtime.local_rank()``.

    Why:
        ``torch.distributed.launch`` passed ``--local_rank=N`` to each process; torchrun,
        horovodrun, SLURM and Kubeflow do not, so the argument keeps its default (0) on every
        rank: all processes pick GPU 0 and every rank believes it is the one that saves.

    Example:
        torch.cuda.set_device(args.local_rank)

        becomes

        torch.cuda.set_device(runtime.local_rank())
    """

    code = "DST005"
    name = "local-rank-argument"
    summary = "local rank from the launcher's environment, not --local_rank"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        declared = any(
            isinstance(site.call.func, cst.Attribute)
            and site.call.func.attr.value == "add_argument"
            and site.call.args
            and isinstance(site.call.args[0].value, cst.SimpleString)
            and site.call.args[0].value.evaluated_value in ("--local_rank", "--local-rank")
            for site in a.calls
        )
        if not declared:
            return
        targets = set()
        for stmt in a.stmt_parent:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Assign):
                        targets.update(id(t.target) for t in small.targets)
        for attr, scope, cls, stmt in a.attr_uses:
            if attr.attr.value != "local_rank" or not isinstance(attr.value, cst.Name) or id(attr) in targets:
                continue
            if attr.value.value in ("runtime", "hvd", "dist", "self"):
                continue
            rt = ctx.runtime
            ctx.edits.replace(attr, lambda n, rt=rt: cst.parse_expression(f"{rt}.local_rank()"))
            ctx.report(self.code, attr, f"{ctx.code(attr)} now comes from the launcher ({rt}.local_rank())")


RULE = LocalRankArgument()
