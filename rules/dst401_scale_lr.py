"""DST401 linear learning-rate scaling (--scale-lr)."""

from __future__ import annotations

import libcst as cst

from distify.syntax import arg, contains_node
from distify.library import WORLD_SIZE
from distify.loss_scale import SAMPLE, backward_kind
from distify.rules.base import HOROVOD_BACKEND, Context, Rule


class ScaleLearningRate(Rule):
    """With ``--scale-lr``, multiply the optimizer's learning rate by the number of processes.

    What it does:
        ``lr=args.lr`` becomes ``lr=args.lr * dist.get_world_size()`` (``hvd.size()`` with
        Horovod), with a comment saying why. Only when the flag is given; an optimizer without an
        explicit ``lr`` is reported instead, and so is a script whose loss sums over the batch
        (``distify.loss_scale``): its gradient already grows with the batch, and DST131 keeps
        that across the ranks, so the learning rate is left alone.

    Why:
        With N processes each step averages N batches: the effective batch is N times larger.
        The linear scaling rule (Goyal et al., 2017) keeps the per-sample update size by scaling
        the learning rate with it; combine it with a warm-up for large N. Without the flag the
        learning rate is left alone – the other way to keep training identical is to divide the
        per-process batch size by N.

    Example:
        optimizer = optim.SGD(model.parameters(), lr=args.lr)

        with --scale-lr becomes

        # distify --scale-lr: linear scaling rule, lr x number of processes
        optimizer = optim.SGD(model.parameters(), lr=args.lr * dist.get_world_size())
    """

    code = "DST401"
    name = "scale-lr"
    summary = "scale the learning rate with the world size (--scale-lr)"

    def apply(self, ctx: Context) -> None:
        if not ctx.options.scale_lr:
            return
        size = f"{ctx.hvd}.size()" if ctx.backend == HOROVOD_BACKEND else f"{ctx.dist}.get_world_size()"
        summed = next((s for s in ctx.anatomy.calls if backward_kind(ctx.anatomy, s)[1].kind == SAMPLE), None)
        if summed is not None:
            ctx.warn(self.code, summed.call, "--scale-lr: this loss sums over the batch, so its gradient already grows "
                     "with the batch (DST131 keeps that across the ranks): scaling the learning rate too would make the "
                     "step N times the single process's at the whole batch; the learning rate is left alone")
            return
        for opt in ctx.anatomy.optimizers:
            lr = arg(opt.call.call, 1, "lr")
            if lr is None:
                ctx.warn(self.code, opt.call.call, "--scale-lr: this optimizer uses its default lr; pass lr=... to scale it")
                continue
            if any(c.qualname in WORLD_SIZE and contains_node(lr.value, c.call) for c in ctx.anatomy.calls):
                continue
            value = lr.value
            needs_parens = isinstance(value, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp, cst.Lambda))

            def scale(node, size=size, needs_parens=needs_parens):
                v = node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if needs_parens else node
                return cst.BinaryOperation(left=v, operator=cst.Multiply(), right=cst.parse_expression(size))

            ctx.edits.replace(value, scale)
            ctx.comment_above(opt.call.stmt, "distify --scale-lr: linear scaling rule, lr x number of processes")
            ctx.report(self.code, lr.value, f"learning rate scaled by the number of processes ({size})")


RULE = ScaleLearningRate()
