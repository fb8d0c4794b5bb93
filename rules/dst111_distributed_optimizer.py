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
            names = f", named_parameters={opt.models[0]}.named_parameters()" if len(opt.models) == 1 else ""
            line = f"{opt.target} = {hvd}.DistributedOptimizer({opt.target}{names})"
            ctx.edits.insert_after(opt.call.stmt, ctx.stmts(line))
            wrapped.append(opt)
            ctx.report(self.code, opt.call.call, f"{opt.target} averages gradients across ranks (hvd.DistributedOptimizer)")


RULE = DistributedOptimizer()
