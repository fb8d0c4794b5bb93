"""DST001 process-group setup."""

from __future__ import annotations

import libcst as cst

from distify.edits import _is_docstring, _is_import
from distify.rules.base import HOROVOD_BACKEND, Context, Rule


class ProcessGroupSetup(Rule):
    """Initialise the process group once, at the start of the entry point.

    What it does:
        Inserts ``dist.init_process_group(**runtime.init_kwargs())`` (DDP) or ``hvd.init()``
        (Horovod) as the first statement of the code that builds the training pieces: the
        ``main()`` called from ``if __name__ == "__main__":``, the guard itself, or the module.

    Why:
        Every collective, DistributedSampler and DDP wrapper needs an initialised process group,
        and it must exist before the first DataLoader or model is built. ``runtime.init_kwargs()``
        only hides the environment plumbing: NCCL on GPU and gloo on CPU; rank and world size from
        torchrun, SLURM, MPI or Kubeflow; a one-process group when run with plain ``python``.

    Example:
        def main():
            args = parser.parse_args()

        becomes

        def main():
            dist.init_process_group(**runtime.init_kwargs())
            args = parser.parse_args()
    """

    code = "DST001"
    name = "process-group-setup"
    summary = "initialise the process group at the start of the entry point"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        if a.entry_owner is None or ctx.plan.incremental:
            return  # incremental: the process group is set up already
        anchor = first_statement(a.entry_owner, a.entry_body)
        if anchor is None:
            return
        if ctx.backend == HOROVOD_BACKEND:
            line = f"{ctx.hvd}.init()"
        else:
            line = f"{ctx.dist}.init_process_group(**{ctx.runtime}.init_kwargs())"
        ctx.edits.insert_before(anchor, ctx.stmts(line))
        ctx.plan.setup_anchor = anchor
        where = "module level" if isinstance(a.entry_owner, cst.Module) else (
            f"{a.entry_owner.name.value}()" if isinstance(a.entry_owner, cst.FunctionDef) else "the __main__ block"
        )
        ctx.report(self.code, anchor, f"process group initialised at the start of {where}")


def first_statement(owner: cst.CSTNode, body) -> cst.CSTNode | None:
    """The statement before which setup goes."""
    for i, stmt in enumerate(body):
        if isinstance(owner, cst.Module):
            if _is_import(stmt) or (i == 0 and _is_docstring(stmt)):
                continue
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(stmt, cst.SimpleStatementLine) and any(
                isinstance(s, cst.ImportFrom) and s.module is not None and getattr(s.module, "value", "") == "__future__"
                for s in stmt.body
            ):
                continue
            if isinstance(stmt, (cst.Try, cst.If)) and _only_imports_stmt(stmt):
                continue
            return stmt
        if i == 0 and _is_docstring(stmt):
            continue
        return stmt
    return None


def _only_imports_stmt(stmt: cst.CSTNode) -> bool:
    from distify.edits import _only_imports

    return _only_imports(stmt)


RULE = ProcessGroupSetup()
