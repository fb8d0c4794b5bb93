"""DST306 torch.load maps onto the rank's device."""

from __future__ import annotations

import libcst as cst

from distify.records import LOAD, SAVE, assigned_name
from distify.writes import file_path_use
from distify.syntax import arg, all_nodes
from distify.edits import Put
from distify.rank import follows_barrier
from distify.rules.base import HOROVOD_BACKEND, Context, Rule, add_kwarg, kwarg_value


class LoadMapLocation(Rule):
    """Give ``torch.load`` a ``map_location`` for the rank's own device.

    What it does:
        Adds ``map_location=runtime.device()`` to ``torch.load(...)`` calls that have none.

        When the same function saved that path on rank 0 before (the same string, or the same
        name or expression: ``torch.save(model.state_dict(), best_path)`` in the epoch loop, then
        ``model.load_state_dict(torch.load(best_path))`` after it), a barrier (``dist.barrier()``,
        ``hvd.barrier()``) goes before the load, at the level where the save's and the load's
        code paths meet, so that it runs on every rank.

    Why:
        A checkpoint saved from ``cuda:0`` is restored onto ``cuda:0`` by default: every rank
        then allocates on GPU 0 (out of memory, or silently slow), and a GPU checkpoint cannot be
        loaded on a CPU-only rank at all. Only rank 0 writes checkpoints (DST301): without the
        barrier the other ranks can read the file before rank 0 has finished writing it – a
        missing file, a truncated one, or the previous best – and continue with other weights.

    Example:
        state = torch.load(args.resume)

        becomes

        state = torch.load(args.resume, map_location=runtime.device())

        and a reload of the best checkpoint after training

        model.load_state_dict(torch.load(best_path))

        becomes

        dist.barrier()  # every rank waits for rank 0's torch.save
        model.load_state_dict(torch.load(best_path, map_location=runtime.device()))
    """

    code = "DST306"
    name = "load-map-location"
    summary = "torch.load onto the rank's device, after rank 0's save of that file"

    def apply(self, ctx: Context) -> None:
        private = _per_rank_temporary_loads(ctx)
        for site in private:
            if isinstance(site.stmt, cst.SimpleStatementLine) and any(
                isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "broadcast_object"
                for n in all_nodes(site.stmt)
            ):
                continue  # an earlier run's
            # rank 0 saved the file into its own temporary directory: every other rank has its own,
            # empty one. Rank 0 reads it and hands the object to the others.
            rt = ctx.runtime
            main = ctx.main_process

            def from_rank0(n: cst.Call, rt=rt, main=main) -> cst.BaseExpression:
                if kwarg_value(n, "map_location") is None and len([x for x in n.args if x.keyword is None]) <= 1:
                    n = add_kwarg(n, "map_location", cst.SimpleString('"cpu"'))
                return cst.parse_expression(f"{rt}.broadcast_object(_ if {main} else None)").visit(Put(n))

            ctx.edits.replace(site.call, from_rank0)
            ctx.report(
                self.code,
                site.call,
                f"torch.load of a file in rank 0's own temporary directory: rank 0 reads it, {rt}.broadcast_object "
                "hands it to the other ranks",
            )
        for site in ctx.anatomy.calls_to(LOAD):
            if site in private:
                continue
            positional = [x for x in site.call.args if x.keyword is None]
            if kwarg_value(site.call, "map_location") is not None or len(positional) > 1:
                continue
            if site in ctx.plan.cpu_loads:
                # set_model_state_dict/set_optimizer_state_dict shard rank 0's full tensors onto each
                # rank's device: the full copy stays on the CPU (it may not fit one GPU)
                ctx.edits.replace(site.call, lambda n: add_kwarg(n, "map_location", cst.SimpleString('"cpu"')))
                ctx.report(self.code, site.call, 'torch.load maps tensors onto "cpu" (a full state, sharded by set_*_state_dict)')
                continue
            dev = f"{ctx.runtime}.device()"
            ctx.edits.replace(site.call, lambda n, dev=dev: add_kwarg(n, "map_location", cst.parse_expression(dev)))
            ctx.report(self.code, site.call, f"torch.load maps tensors onto {dev}")
        self._barriers(ctx, private)

    def _barriers(self, ctx: Context, private: list) -> None:
        a = ctx.anatomy
        writes, reads = [], []
        for site in a.calls:
            use = file_path_use(a, site)
            key = _path(ctx, use[1]) if use is not None else None
            if key is None:
                continue
            if not use[0]:
                reads.append((site, key, use[1]))
            elif _rank0_write(ctx, site, use[1]):
                writes.append((site, key))
        placed = set()
        for load, key, where in reads:
            if load in private or ctx.in_rank_guard(load.stmt):
                continue
            chain = (*a.stmt_parent.get(load.stmt, ()), load.stmt)
            if any(s in ctx.edits.guards for s in chain):
                continue  # the load itself runs on rank 0 only: nothing to wait for
            for save, saved in writes:
                if save.scope is not load.scope or saved != key:
                    continue
                save_chain = (*a.stmt_parent.get(save.stmt, ()), save.stmt)
                k = 0
                while k < min(len(chain), len(save_chain)) and chain[k] is save_chain[k]:
                    k += 1
                if k == len(chain) or k == len(save_chain):
                    continue  # one statement holds both (`torch.save(torch.load(p), p)`)
                shared_loop = any(isinstance(s, (cst.For, cst.While)) for s in chain[:k])
                if not (a.is_before(save.stmt, load.stmt) or shared_loop):
                    continue
                # where the two code paths meet: the load's outermost statement not holding the save
                anchor = chain[k]
                if anchor in placed or follows_barrier(chain[k - 1] if k else load.scope, anchor):
                    continue
                placed.add(anchor)
                call = f"{ctx.hvd}.barrier()" if ctx.backend == HOROVOD_BACKEND else f"{ctx.dist}.barrier()"
                writer, reader = ctx.code(save.call.func), ctx.code(load.call.func)
                ctx.edits.insert_before(anchor, ctx.stmts(f"{call}  # every rank waits for rank 0's {writer}"))
                line = a.position(save.call)[0]
                ctx.report(
                    self.code,
                    load.call,
                    f"{call} before {reader}: rank 0 writes {ctx.code(_unwrapped(a, where.value))}"
                    + (f" (line {line})" if line else "")
                    + " and every rank reads it",
                )


TEMPORARY_DIRS = {"tempfile.TemporaryDirectory", "tempfile.mkdtemp"}


def _per_rank_temporary_loads(ctx: Context) -> list:
    """torch.load calls on every rank of a path inside a temporary directory the same function
    made (``with tempfile.TemporaryDirectory() as tmp:``, ``tmp = tempfile.mkdtemp()``), where a
    torch.save on rank 0 only wrote: each rank's temporary directory is its own."""
    a = ctx.anatomy
    tmp_names = {}  # scope id -> names bound to a temporary directory
    for site in a.calls_to(TEMPORARY_DIRS):
        stmt = site.stmt
        names = set()
        if isinstance(stmt, cst.With):
            for item in stmt.items:
                if item.item is site.call and item.asname is not None and isinstance(item.asname.name, cst.Name):
                    names.add(item.asname.name.value)
        else:
            name = assigned_name(stmt, site.call)
            if name:
                names.add(name)
        tmp_names.setdefault(id(site.scope), set()).update(names)
    # paths built from them: `best_path = os.path.join(tmp, "best.pt")`
    for stmt, scope in a.stmt_scope.items():
        names = tmp_names.get(id(scope))
        if not names or not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            continue
        small = stmt.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
            if _mentions_any(cst.Arg(small.value), names):
                names.add(small.targets[0].target.value)
    out = []
    if tmp_names:
        saved_in = [
            s for s in a.calls_to(SAVE)
            if (s.stmt in ctx.edits.guards or ctx.in_rank_guard(s.stmt))
            and _mentions_any(arg(s.call, 1, "f"), tmp_names.get(id(s.scope), set()))
        ]
        for load in a.calls_to(LOAD):
            names = tmp_names.get(id(load.scope), set())
            if not names or ctx.in_rank_guard(load.stmt) or not _mentions_any(arg(load.call, 0, "f"), names):
                continue
            if any(s.scope is load.scope for s in saved_in):
                out.append(load)
    return out


def _mentions_any(a, names) -> bool:
    if a is None or not names:
        return False
    found = []

    class V(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            if n.value in names:
                found.append(n)

        def visit_Attribute(self, n: cst.Attribute) -> bool:
            n.value.visit(self)
            return False

    a.value.visit(V())
    return bool(found)


def _path(ctx: Context, where: cst.Arg):
    """The file an argument names, as a comparable key (None when it is a buffer etc.); distify's own
    ``path if main else os.devnull`` names `path`."""
    v = _unwrapped(ctx.anatomy, where.value)
    if isinstance(v, cst.SimpleString):
        return ("str", v.evaluated_value)
    if isinstance(v, (cst.Name, cst.Attribute, cst.FormattedString, cst.ConcatenatedString, cst.BinaryOperation, cst.Call)):
        return ("code", "".join(ctx.code(v).split()))
    return None


def _unwrapped(a, v: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(v, cst.IfExp) and _devnull(a, v.orelse):
        return v.body
    return v


def _devnull(a, expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Attribute) and a.qualname(expr) == "os.devnull"


def _rank0_write(ctx: Context, site, where: cst.Arg) -> bool:
    """The write `site` runs on rank 0 alone: under a guard (DST301, DST304), or an open() whose
    path the other ranks see as os.devnull (DST304's edit, or an earlier run's)."""
    if site.stmt in ctx.edits.guards or ctx.in_rank_guard(site.stmt):
        return True
    return where.value in ctx.edits.replacements or where.value is not _unwrapped(ctx.anatomy, where.value)


RULE = LoadMapLocation()
