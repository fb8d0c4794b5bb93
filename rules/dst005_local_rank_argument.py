"""DST005 --local_rank from old launch utilities."""

from __future__ import annotations

import libcst as cst

from distify.rules.base import Context, Rule
from distify.syntax import dotted


ENV_HELPERS = {"RANK": "rank", "LOCAL_RANK": "local_rank", "WORLD_SIZE": "world_size"}


class LocalRankArgument(Rule):
    """Ask the runtime where a process sits, not a ``--local_rank`` argument or torchrun's variables.

    What it does:
        When the script declares ``--local_rank`` / ``--local-rank`` (kept, so old launchers still
        work), every read of ``args.local_rank`` becomes ``runtime.local_rank()``. Reads of torchrun's
        variables, ``int(os.environ["RANK"])`` and ``int(os.environ.get("LOCAL_RANK", 0))`` (also
        ``WORLD_SIZE``), become ``runtime.rank()``, ``runtime.local_rank()``,
        ``runtime.world_size()`` when their default is missing or is the value of a one-process run
        (0, or 1 for the world size); with another default (``-1``: "launched or not?") the read is
        left alone with a warning.

    Why:
        ``torch.distributed.launch`` passed ``--local_rank=N`` to each process; torchrun,
        horovodrun, SLURM and Kubeflow do not, so the argument keeps its default (0) on every
        rank: all processes pick GPU 0 and every rank believes it is the one that saves. Likewise
        horovodrun and ``srun`` set no ``RANK``/``LOCAL_RANK``: a script that guards its saves with
        ``int(os.environ.get("RANK", 0)) == 0`` saves on every rank there. The runtime answers from
        whichever launcher started the process, before and after the process group exists.

    Example:
        torch.cuda.set_device(args.local_rank)
        rank = int(os.environ.get("RANK", 0))

        becomes

        torch.cuda.set_device(runtime.local_rank())
        rank = runtime.rank()
    """

    code = "DST005"
    name = "local-rank-argument"
    summary = "rank and local rank from the runtime, not --local_rank or torchrun's variables"

    def apply(self, ctx: Context) -> None:
        self._environment(ctx)
        self._argument(ctx)

    def _environment(self, ctx: Context) -> None:
        """`int(os.environ.get("RANK", 0))` -> `runtime.rank()` (see the docstring)."""
        a = ctx.anatomy
        if a.flavour is not None:
            return  # a distributed script reads its own launcher's variables (DST003 converts them)
        for site in a.calls:
            env = a.environ_rank(site.call)
            if env is None:
                continue
            key, default = env
            helper = ENV_HELPERS[key]
            single = "1" if key == "WORLD_SIZE" else "0"
            if default is not None and not (isinstance(default, cst.Integer) and default.value == single):
                ctx.warn(
                    self.code,
                    site.call,
                    f"{key} read with default {ctx.code(default)}: horovodrun and srun do not set {key}; "
                    f"use runtime.{helper}() (left unchanged)",
                )
                continue
            rt = ctx.runtime
            ctx.edits.replace(site.call, lambda n, rt=rt, helper=helper: cst.parse_expression(f"{rt}.{helper}()"))
            ctx.report(self.code, site.call, f"{key} now comes from whichever launcher started the process ({rt}.{helper}())")

    def _argument(self, ctx: Context) -> None:
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
            if a.qualname(attr.value) is not None or a.facts.instance_attr(scope, dotted(attr)) is not None:
                continue  # a module's own (dist, hvd, the runtime) or the instance's attribute: no argument
            rt = ctx.runtime
            ctx.edits.replace(attr, lambda n, rt=rt: cst.parse_expression(f"{rt}.local_rank()"))
            ctx.report(self.code, attr, f"{ctx.code(attr)} now comes from the launcher ({rt}.local_rank())")


RULE = LocalRankArgument()
