"""DST003 backend conversion: DDP -> Horovod and Horovod -> DDP, in source.

A script already written for one backend is first *stripped* of what only that backend needs –
its init call, the DDP wrapper and ``.module`` accesses, or Horovod's DistributedOptimizer and
broadcasts – and its rank queries are rewritten to the backend-neutral ``runtime`` helpers. What is
left is a single-process script that still has its DistributedSamplers, set_epoch calls and rank-0
guards; the normal migration then adds the requested backend's pieces and adapts the samplers.
The two steps are two passes over the code (each one transformer), so each rule stays simple.
"""

from __future__ import annotations

from typing import List, Optional, Set, Tuple

import libcst as cst

from distify.anatomy import DDP, DIST_SAMPLER, INIT_PG, Anatomy, CallSite, arg, assigned_name, dotted
from distify.edits import ApplyEdits, EditSet
from distify.rules.base import Context, Finding, Options, Rule, call_statement
from distify.standalone import find_block

CONVERT_CODE = "DST003"


class ConvertBackend(Rule):
    """Convert a script written for one backend to the other (DDP <-> Horovod).

    What it does:
        On a script that already uses DDP, ``--backend horovod`` removes ``init_process_group``,
        the ``DDP(...)`` wrapper, ``.module`` accesses and ``destroy_process_group``, turns
        ``dist.get_rank()``/``os.environ["LOCAL_RANK"]`` into ``runtime`` helpers, and then the
        Horovod rules add ``hvd.init()``, ``hvd.DistributedOptimizer`` and the broadcasts and give
        the existing DistributedSampler Horovod's size and rank. ``--backend ddp`` on a Horovod
        script removes ``hvd.init``, ``DistributedOptimizer``, the broadcasts and
        ``synchronize``/``skip_synchronize``, maps ``hvd.rank()``/``hvd.allreduce`` to ``runtime``,
        and the DDP rules add the process group and the wrapper. Samplers, ``set_epoch`` and rank-0
        guards are kept.

    Why:
        Moving a job between clusters (MPI/Horovod on one, torchrun on the other) should not mean
        rewriting the training script by hand, and the details that differ – who averages the
        gradients, who synchronises the initial state – are exactly the ones that fail silently.

    Example:
        model = DDP(model, device_ids=[local_rank])
        optimizer = optim.SGD(model.parameters(), lr=0.1)

        with --backend horovod becomes

        optimizer = optim.SGD(model.parameters(), lr=0.1)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    """

    code = CONVERT_CODE
    name = "convert-backend"
    summary = "convert a DDP script to Horovod and back"

    def apply(self, ctx: Context) -> None:
        """Conversion runs as the engine's pre-pass (`strip`), before the other rules see the code."""


RULE = ConvertBackend()

TORCH_DIST_RANK = {
    "torch.distributed.get_rank": "rank",
    "torch.distributed.get_world_size": "world_size",
    "torch.distributed.barrier": "barrier",
}
HVD_RANK = {
    "horovod.torch.rank": "rank",
    "horovod.torch.size": "world_size",
    "horovod.torch.local_rank": "local_rank",
    "horovod.torch.join": "barrier",
    "horovod.torch.barrier": "barrier",
}
HVD_DROP = {
    "horovod.torch.init",
    "horovod.torch.shutdown",
    "horovod.torch.broadcast_parameters",
    "horovod.torch.broadcast_optimizer_state",
    "horovod.torch.broadcast_object",
}
DDP_DROP = INIT_PG | {"torch.distributed.destroy_process_group"}
ENV_RANKS = {"LOCAL_RANK": "local_rank", "RANK": "rank", "WORLD_SIZE": "world_size"}
HVD_OPS = {"Sum": "sum", "Average": "mean", "Max": "max", "Min": "min"}


def strip(anatomy: Anatomy, options: Options) -> Tuple[cst.Module, List[Finding]]:
    """Remove the other backend's constructs; return the re-parsed module and what was done."""
    ctx = Context(anatomy, options)
    a = anatomy
    flavour = a.flavour
    if flavour == "ddp" and not a.calls_to(DDP | DIST_SAMPLER):
        # init_process_group without a DDP wrapper or DistributedSampler: the script shards and
        # reduces by hand; stripping its init would leave that machinery without a process group
        init = a.calls_to(INIT_PG)[0]
        ctx.warn(CONVERT_CODE, init.call, "hand-written data parallelism (no DDP wrapper, no DistributedSampler): not converted")
        return None, ctx.findings
    rt = ctx.runtime
    block = find_block(a.module)
    if block is not None:
        # the inline runtime of a --standalone run speaks the old backend: drop it (with its marker,
        # so that the old backend's imports it used become unused); the engine writes a new one
        ctx.edits.replace(block.node, lambda n: n.with_changes(leading_lines=()))
        ctx.edits.remove(block.node)

    def neutral(node: cst.CSTNode, fn_name: str) -> None:
        ctx.edits.replace(node, lambda n: cst.parse_expression(f"{rt}.{fn_name}()"))

    wrapped: Set[str] = set()
    left: List[CallSite] = []  # calls into the old backend that no branch below rewrites
    for site in a.calls:
        q = site.qualname or ""
        call = site.call
        if flavour == "ddp":
            if q in DDP_DROP and call_statement(site.stmt, call):
                _remove(ctx, site.stmt)
                ctx.report(CONVERT_CODE, call, f"{dotted(call.func)}() removed (DDP only)")
            elif q in DDP and call.args:
                target = assigned_name(site.stmt, call)
                inner = dotted(call.args[0].value)
                if target is not None and inner == target:
                    _remove(ctx, site.stmt)  # model = DDP(model, ...)
                else:
                    ctx.edits.replace(call, lambda n: n.args[0].value)
                if target is not None:
                    wrapped.add(target)
                ctx.report(CONVERT_CODE, call, "DistributedDataParallel wrapper removed (Horovod averages in the optimizer)")
            elif q in TORCH_DIST_RANK and not call.args:
                neutral(call, TORCH_DIST_RANK[q])
            elif q == "torch.distributed.all_reduce" and call_statement(site.stmt, call) and call.args:
                tensor = ctx.code(call.args[0].value)
                op = _ddp_op(ctx, call)
                ctx.edits.replace(
                    site.stmt.body[0],
                    lambda n, t=tensor, op=op: cst.Expr(cst.parse_expression(f'{t}.copy_({rt}.all_reduce({t}, "{op}"))')),
                )
            elif q.startswith("torch.distributed.") and q not in DIST_SAMPLER:
                left.append(site)
        else:  # horovod
            if q in HVD_DROP and call_statement(site.stmt, call):
                _remove(ctx, site.stmt)
                ctx.report(CONVERT_CODE, call, f"{dotted(call.func)}() removed (Horovod only)")
            elif q == "horovod.torch.DistributedOptimizer" and call.args:
                target = assigned_name(site.stmt, call)
                inner = dotted(call.args[0].value)
                if target is not None and inner == target:
                    _remove(ctx, site.stmt)
                else:
                    ctx.edits.replace(call, lambda n: n.args[0].value)
                ctx.report(CONVERT_CODE, call, "hvd.DistributedOptimizer removed (DDP averages in backward)")
            elif (
                q == "horovod.torch.grouped_allreduce_"
                and call_statement(site.stmt, call)
                and call.args
                and ".grad" in ctx.code(call.args[0].value)
                and _hvd_op(ctx, call) == "mean"
            ):
                # averaging gradients before a step (distify's GAN form, DST111): DDP does it in backward;
                # distify's comment above it goes too (remove() keeps comments: they may be the user's)
                ctx.edits.replace(
                    site.stmt,
                    lambda n: n.with_changes(
                        leading_lines=[
                            ln for ln in n.leading_lines
                            if ln.comment is None or "across ranks once, before its step" not in ln.comment.value
                        ]
                    ),
                )
                _remove(ctx, site.stmt)
                ctx.report(CONVERT_CODE, call, "gradient all-reduce removed (DDP averages in backward)")
            elif q in HVD_RANK and not call.args:
                neutral(call, HVD_RANK[q])
            elif q in ("horovod.torch.allreduce", "horovod.torch.allreduce_") and call.args:
                value = ctx.code(call.args[0].value)
                op = _hvd_op(ctx, call)
                ctx.edits.replace(call, lambda n, v=value, op=op: cst.parse_expression(f'{rt}.all_reduce({v}, "{op}")'))
            elif q.startswith("horovod.torch."):
                left.append(site)
            elif isinstance(call.func, cst.Attribute) and call.func.attr.value == "synchronize" and call_statement(site.stmt, call) and not call.args:
                _remove(ctx, site.stmt)
        # both: a DistributedSampler takes its replicas and rank from the backend in place
        if q in DIST_SAMPLER:
            drop = {"num_replicas", "rank"}
            if any(x.keyword is not None and x.keyword.value in drop for x in call.args):
                ctx.edits.replace(
                    call,
                    lambda n, drop=drop: n.with_changes(
                        args=_fix_trailing_comma(
                            [x for x in n.args if not (x.keyword is not None and x.keyword.value in drop)]
                        )
                    ),
                )
        # os.environ["LOCAL_RANK"] and friends only exist under torchrun
        env = a.environ_rank(call)
        if env is not None:
            neutral(call, ENV_RANKS[env[0]])

    if left:
        # left in place they would fail at run time, the old backend being gone: convert nothing
        target = "DDP" if ctx.backend == "ddp" else "Horovod"
        for site in left:
            ctx.warn(
                CONVERT_CODE,
                site.call,
                f"{dotted(site.call.func) or site.qualname}() has no {target} counterpart distify writes: "
                f"file not converted; rewrite it by hand or keep --backend {flavour}",
            )
        return None, [f for f in ctx.findings if f.kind == "warning"]
    if flavour == "horovod":
        _unwrap_skip_synchronize(ctx)
    if flavour == "ddp":
        for attr, scope, cls, stmt in a.attr_uses:
            if attr.attr.value != "module":
                continue
            base = dotted(attr.value)
            if base in wrapped:
                ctx.edits.replace(attr, lambda n: n.value)

    module = a.module.visit(ApplyEdits(ctx.edits))
    module = cst.parse_module(module.bytes)
    module = _drop_unused_imports(module, flavour)
    return module, ctx.findings


def _remove(ctx: Context, stmt: cst.CSTNode) -> None:
    """Drop a call statement (only the call when other statements share its line)."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) > 1:
        return  # call_statement() matched only single-statement lines; nothing to do here
    ctx.edits.remove(stmt)


def _fix_trailing_comma(args: List[cst.Arg]) -> List[cst.Arg]:
    if args and args[-1].comma is not cst.MaybeSentinel.DEFAULT:
        # keep a trailing comma only if the call is laid out over several lines
        last = args[-1]
        ws = last.comma.whitespace_after if isinstance(last.comma, cst.Comma) else None
        if not isinstance(ws, cst.ParenthesizedWhitespace):
            args[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return args


def _ddp_op(ctx: Context, call: cst.Call) -> str:
    op = arg(call, 1, "op")
    if op is None:
        return "sum"
    text = ctx.code(op.value).upper()
    for key, name in (("SUM", "sum"), ("AVG", "mean"), ("MAX", "max"), ("MIN", "min")):
        if text.endswith(key):
            return name
    return "sum"


def _hvd_op(ctx: Context, call: cst.Call) -> str:
    op = arg(call, None, "op")
    if op is not None:
        q = ctx.anatomy.qualname(op.value) or ""
        return HVD_OPS.get(q.rsplit(".", 1)[-1], "mean")
    avg = arg(call, 1, "average")
    if avg is not None and isinstance(avg.value, cst.Name) and avg.value.value == "False":
        return "sum"
    return "mean"  # hvd.allreduce averages by default


def _unwrap_skip_synchronize(ctx: Context) -> None:
    """`with optimizer.skip_synchronize(): body` -> body (Horovod's AMP idiom)."""
    for stmt in ctx.anatomy.stmt_parent:
        if not isinstance(stmt, cst.With) or len(stmt.items) != 1:
            continue
        item = stmt.items[0].item
        if isinstance(item, cst.Call) and isinstance(item.func, cst.Attribute) and item.func.attr.value == "skip_synchronize":
            if isinstance(stmt.body, cst.IndentedBlock):
                ctx.edits.insert_before(stmt, list(stmt.body.body))
                ctx.edits.remove(stmt)


def _drop_unused_imports(module: cst.Module, flavour: Optional[str]) -> cst.Module:
    """Remove imports of the old backend's names that nothing uses any more."""
    prefixes = ("horovod",) if flavour == "horovod" else ("torch.distributed", "torch.nn.parallel")
    used: Set[str] = set()

    class Uses(cst.CSTVisitor):
        def visit_Import(self, node):
            return False

        def visit_ImportFrom(self, node):
            return False

        def visit_Name(self, node: cst.Name) -> None:
            used.add(node.value)

    module.visit(Uses())

    def keep_aliases(small: cst.BaseSmallStatement):
        """The import without its unused old-backend names (None: drop it)."""
        if isinstance(small, cst.Import):
            names = [
                alias
                for alias in small.names
                if not (
                    (dotted(alias.name) or "").startswith(prefixes)
                    and (dotted(alias.asname.name) if alias.asname else (dotted(alias.name) or "").split(".")[0])
                    not in used
                )
            ]
        elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            module_name = dotted(small.module) if small.module else ""
            if not module_name or not module_name.startswith(prefixes) or module_name.startswith("torch.utils.data"):
                return small
            names = [
                alias
                for alias in small.names
                if (dotted(alias.asname.name) if alias.asname else dotted(alias.name)) in used
            ]
        else:
            return small
        if not names:
            return None
        if len(names) == len(small.names):
            return small
        names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return small.with_changes(names=names)

    def keep_line(stmt: cst.SimpleStatementLine):
        """The line without its unused old-backend imports (`import a; import b` too; None: drop it)."""
        smalls = [keep_aliases(small) if isinstance(small, (cst.Import, cst.ImportFrom)) else small for small in stmt.body]
        kept = [small for small in smalls if small is not None]
        if not kept:
            return None
        if len(kept) < len(stmt.body):
            kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return stmt.with_changes(body=kept)

    class Drop(cst.CSTTransformer):
        def _body(self, body):
            out, carried = [], []
            for stmt in body:
                if isinstance(stmt, cst.SimpleStatementLine) and any(
                    isinstance(small, (cst.Import, cst.ImportFrom)) for small in stmt.body
                ):
                    new = keep_line(stmt)
                    if new is None:
                        carried += list(stmt.leading_lines)
                        continue
                    stmt = new
                if carried:
                    own = list(stmt.leading_lines)
                    stmt = stmt.with_changes(leading_lines=[*carried, *own] if not own else [*own])
                    carried = []
                out.append(stmt)
            return out

        def leave_Module(self, original, updated):
            return updated.with_changes(body=self._body(updated.body))

        def leave_IndentedBlock(self, original, updated):
            body = self._body(updated.body)
            return updated.with_changes(body=body or [cst.SimpleStatementLine(body=[cst.Pass()])])

    return module.visit(Drop())
