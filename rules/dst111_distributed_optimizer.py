"""DST111 hvd.DistributedOptimizer."""

from __future__ import annotations

from distify.rules.base import HOROVOD_BACKEND, Context, Rule


class DistributedOptimizer(Rule):
    """Wrap every optimizer in ``hvd.DistributedOptimizer`` (Horovod).

    What it does:
        After each optimizer is built, adds
        ``optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())``
        with the model whose parameters it optimises (several models: no names, Horovod numbers
        the tensors itself).

    Why:
        Horovod averages gradients inside the wrapped optimizer: hooks start each gradient's
        all-reduce as soon as backward produces it and ``step()`` waits for them. Without the wrapper
        every rank follows its own gradients and the models drift apart. The parameter names make
        Horovod's timeline and error messages readable.

    Example:
        optimizer = optim.SGD(model.parameters(), lr=0.1)

        becomes

        optimizer = optim.SGD(model.parameters(), lr=0.1)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    """

    code = "DST111"
    name = "distributed-optimizer"
    backends = frozenset({HOROVOD_BACKEND})
    summary = "wrap optimizers in hvd.DistributedOptimizer"

    def apply(self, ctx: Context) -> None:
        wrapped = ctx.state.setdefault("hvd_optimizers", [])
        anchors = ctx.state.setdefault("hvd_anchor", {})
        optimizers = [o for o in ctx.anatomy.optimizers if o.target is not None and not _already_wrapped(ctx, o)]
        for opt in optimizers:
            if _backward_passes_before_step(ctx, opt) > 1:
                ctx.block(
                    self.code,
                    opt.call.call,
                    f"{opt.target} steps after several backward() calls (e.g. a GAN discriminator on real and fake "
                    "batches): Horovod counts each as a pass; file not migrated to Horovod (use --backend ddp, or "
                    "set backward_passes_per_step yourself)",
                )
                return
        for opt in optimizers:
            hvd = ctx.hvd
            extra, notes = "", []
            if len(opt.models) == 1 and len(optimizers) == 1:
                extra += f", named_parameters={opt.models[0]}.named_parameters()"
            elif len(opt.models) == 1:
                # several DistributedOptimizers: tensor names must be unique across all of them
                m = opt.models[0]
                prefix = m.split(".")[-1]
                extra += f', named_parameters=[("{prefix}." + n, p) for n, p in {m}.named_parameters()]'
            accumulation = _accumulation_steps(ctx, opt)
            anchor = opt.call.stmt
            if accumulation is not None:
                anchor = _after_assignments(ctx, anchor, accumulation)
                extra += f", backward_passes_per_step={accumulation}"
                notes.append(f"# gradient accumulation: all-reduce once every {accumulation} backward passes")
            if ctx.options.fp16_allreduce:
                extra += f", compression={hvd}.Compression.fp16"
                notes.append("# distify --fp16-allreduce: gradients are all-reduced in float16 (half the bytes)")
            if ctx.options.adasum:
                extra += f", op={hvd}.Adasum"
                notes.append("# distify --adasum: Adasum combines gradients instead of averaging them")
            line = f"{opt.target} = {hvd}.DistributedOptimizer({opt.target}{extra})"
            ctx.edits.insert_after(anchor, ctx.stmts("\n".join([*notes, line])))
            anchors[opt] = anchor
            _drop_set_to_none(ctx, opt)
            wrapped.append(opt)
            ctx.report(self.code, opt.call.call, f"{opt.target} averages gradients across ranks (hvd.DistributedOptimizer)")


def _already_wrapped(ctx: Context, opt) -> bool:
    """`opt = hvd.DistributedOptimizer(opt, ...)` exists already (distify's earlier output)."""
    return any(
        site.qualname == "horovod.torch.DistributedOptimizer"
        and site.call.args
        and ctx.code(site.call.args[0].value) == opt.target
        for site in ctx.anatomy.calls
    )


def _after_assignments(ctx: Context, anchor, expr_src: str):
    """The optimizer's statement, or a later one at its level that assigns a name `expr_src` uses
    (`accum_steps = args.accum_steps` after the optimizer): the wrap must see the value."""
    import libcst as cst

    a = ctx.anatomy
    names = set(expr_src.replace(".", " ").split())
    level = a.stmt_parent.get(anchor, ())
    for stmt, scope in a.stmt_scope.items():
        if scope is not a.stmt_scope.get(anchor) or a.stmt_parent.get(stmt, ()) != level:
            continue
        if not isinstance(stmt, cst.SimpleStatementLine) or not a.is_before(anchor, stmt):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and any(ctx.code(t.target) in names for t in small.targets):
                anchor = stmt
    return anchor


def _drop_set_to_none(ctx: Context, opt) -> None:
    """Horovod's DistributedOptimizer.zero_grad() takes no arguments: set_to_none=True is the
    default of torch >= 2.0 anyway, so the argument can go."""
    import libcst as cst

    for site in ctx.anatomy.calls:
        func = site.call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "zero_grad" and ctx.code(func.value) == opt.target):
            continue
        arg_ = next((x for x in site.call.args if x.keyword is not None and x.keyword.value == "set_to_none"), None)
        if arg_ is None:
            continue
        if isinstance(arg_.value, cst.Name) and arg_.value.value == "True":
            ctx.edits.replace(site.call, lambda n: n.with_changes(args=[]))
        else:
            ctx.warn("DST111", site.call, "hvd.DistributedOptimizer.zero_grad() takes no set_to_none argument: call p.grad = None yourself")


def _backward_passes_before_step(ctx: Context, opt) -> int:
    """How many backward() calls a batch loop makes before it steps `opt` (loop body level)."""
    import libcst as cst

    a = ctx.anatomy
    worst = 0
    for loop, scope, cls, outer in a.fors:
        if not isinstance(loop.body, cst.IndentedBlock):
            continue
        count = 0
        for stmt in loop.body.body:
            code = ctx.code(stmt)
            if f"{opt.target}.step(" in code or f".step({opt.target})" in code:
                worst = max(worst, count)
                break
            count += code.count(".backward(")
    return worst


def _accumulation_steps(ctx: Context, opt):
    """N for `if (i + 1) % N == 0: optimizer.step()` – the gradient-accumulation idiom."""
    import libcst as cst

    a = ctx.anatomy
    for site in a.calls:
        func = site.call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step" and a.qualname(func) is None):
            continue
        # optimizer.step() or scaler.step(optimizer)
        stepped = ctx.code(func.value) == opt.target or any(
            a_.keyword is None and ctx.code(a_.value) == opt.target for a_ in site.call.args
        )
        if opt.target is None or not stepped:
            continue
        parents = a.stmt_parent.get(site.stmt, ())
        for p in reversed(parents):
            if isinstance(p, cst.For):
                break
            if isinstance(p, cst.If) and isinstance(p.test, cst.Comparison):
                left = p.test.left
                if isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Modulo):
                    return ctx.code(left.right)
    return None


RULE = DistributedOptimizer()
