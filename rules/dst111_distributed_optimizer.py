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
        for opt in ctx.anatomy.optimizers:
            if opt.target is None:
                continue
            hvd = ctx.hvd
            extra, notes = "", []
            if len(opt.models) == 1:
                extra += f", named_parameters={opt.models[0]}.named_parameters()"
            accumulation = _accumulation_steps(ctx, opt)
            if accumulation is not None:
                extra += f", backward_passes_per_step={accumulation}"
                notes.append(f"# gradient accumulation: all-reduce once every {accumulation} backward passes")
            if ctx.options.fp16_allreduce:
                extra += f", compression={hvd}.Compression.fp16"
                notes.append("# distify --fp16-allreduce: gradients are all-reduced in float16 (half the bytes)")
            if ctx.options.adasum:
                extra += f", op={hvd}.Adasum"
                notes.append("# distify --adasum: Adasum combines gradients instead of averaging them")
            line = f"{opt.target} = {hvd}.DistributedOptimizer({opt.target}{extra})"
            ctx.edits.insert_after(opt.call.stmt, ctx.stmts("\n".join([*notes, line])))
            wrapped.append(opt)
            ctx.report(self.code, opt.call.call, f"{opt.target} averages gradients across ranks (hvd.DistributedOptimizer)")


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
