"""DST131 a training loss that sums over its batch keeps the single process's gradient."""

from __future__ import annotations

import libcst as cst

from distify.loss_scale import MIXED, SAMPLE, backward_kind, scaled_by_world
from distify.rules.base import HOROVOD_BACKEND, Context, Rule
from distify.sums import fed_only_by


class ScaleSumLoss(Rule):
    """Multiply by the number of processes a training loss that adds up over its batch's samples.

    What it does:
        For each ``backward()`` (``loss.backward()``, ``scaler.scale(loss).backward()``,
        ``torch.autograd.backward(loss)``) whose loss is a sum over the batch's samples
        (``distify.loss_scale``: a library loss with ``reduction="sum"``, ``.sum()`` over the
        model's outputs, the VAE's ``BCE + KLD``, followed into the script's own functions and
        the model's forward), and where every training loop reads a loader the migration shards,
        multiplies the loss the backward runs from by the world size (``dist.get_world_size()``,
        ``hvd.size()`` under Horovod), with a comment saying why. The loss the script prints or
        adds up is left as it was. A loss that adds a sum to a mean (``F.cross_entropy(out, y) +
        kld.sum()``), or a sum divided by a value distify cannot tell for the batch's size, is
        reported instead: no one factor is right for it. So is a loss that compares the batch's
        samples with each other (a similarity matrix ``z @ z.T``, the negatives of SimCLR's
        NT-Xent or CLIP's InfoNCE): each rank's batch holds only its shard, and distify does not
        gather the embeddings for it.

    Why:
        DDP, FSDP and Horovod average the ranks' gradients. A mean loss at B samples per rank
        then gives the single process's gradient at N·B samples; a summed loss gives 1/N of it
        (the sum over N·B samples, divided by N), as if the learning rate were N times smaller.
        PyTorch's DDP notes say as much: a summed loss needs the gradients scaled to be
        equivalent to local training at the whole batch.

    Example:
        loss = F.mse_loss(out, y, reduction="sum")
        loss.backward()

        becomes

        loss = F.mse_loss(out, y, reduction="sum")
        # distify: this loss sums over the batch and the ranks' gradients are averaged: x world size keeps the step of the whole batch
        (loss * dist.get_world_size()).backward()
    """

    code = "DST131"
    name = "scale-sum-loss"
    summary = "a loss summed over the batch is scaled by the world size (gradients are averaged)"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        sites = [(site, *backward_kind(a, site)) for site in a.calls]
        sites = [(site, loss, k) for site, loss, k in sites if loss is not None and (k.has_sum or k.pairs is not None)]
        if not sites:
            return
        sharded = [*ctx.plan.samplers, *ctx.plan.shared]
        training = [bl for bl in a.batch_loops if bl.trains]
        own_shards = bool(training) and all(fed_only_by(a, bl, sharded) for bl in training)
        size = f"{ctx.hvd}.size()" if ctx.backend == HOROVOD_BACKEND else f"{ctx.dist}.get_world_size()"
        said = set()
        for site, loss, k in sites:
            if k.pairs is not None and own_shards and id(k.pairs) not in said:
                said.add(id(k.pairs))
                ctx.warn(
                    self.code, k.pairs,
                    f"this loss compares the batch's samples with each other (`{ctx.code(k.pairs)}`, as a contrastive "
                    "loss's negatives do): each rank now compares only the samples of its own shard, not the whole "
                    "batch one process held, so the loss and its gradient differ from the single process's at N times "
                    "the batch; to keep them, gather the embeddings from every rank before the product "
                    "(torch.distributed.nn.functional.all_gather keeps their gradients)",
                )
            if not k.has_sum:
                continue
            if scaled_by_world(a, loss):
                continue
            if k.kind == SAMPLE and own_shards:
                ctx.edits.replace(loss, lambda node, receiver=_receiver(site.call, loss): _scaled(node, size, receiver))
                ctx.comment_above(
                    site.stmt,
                    "distify: this loss sums over the batch and the ranks' gradients are averaged: "
                    "x world size keeps the step of the whole batch",
                )
                ctx.report(self.code, site.call, f"loss summed over the batch scaled by the number of processes ({size}): "
                           "the gradient averaging would divide it")
            elif k.kind == SAMPLE:
                ctx.warn(self.code, site.call, "this loss sums over the batch, and its training loop does not read a loader "
                         "distify shards: the averaged gradient of N processes is 1/N of what each computes; multiply "
                         f"the loss by {size} where each rank trains on its own samples")
            else:
                part = "adds a sum over the batch to a mean" if k.kind == MIXED else "holds a sum over the batch distify cannot tell apart from a mean"
                ctx.warn(self.code, site.call, f"this loss {part}: the gradient averaging across processes divides the "
                         f"summed part by their number, as if its weight were N times smaller; scale that part by {size} "
                         "to keep the single process's step at the whole batch")


def _receiver(call: cst.Call, loss: cst.BaseExpression) -> bool:
    """`loss` is what ``.backward`` is called on (and needs parentheses once multiplied)."""
    return isinstance(call.func, cst.Attribute) and call.func.value is loss


def _scaled(node: cst.BaseExpression, size: str, receiver: bool) -> cst.BaseExpression:
    left = node
    if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp, cst.Lambda)) and not node.lpar:
        left = node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    out = cst.BinaryOperation(left=left, operator=cst.Multiply(), right=cst.parse_expression(size))
    return out.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if receiver else out


RULE = ScaleSumLoss()
