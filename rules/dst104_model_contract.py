"""DST104 the model's own code against DDP's contract: checkpointing, unfreezing, unread models."""

from __future__ import annotations

import libcst as cst

from distify.model_contract import dtype_flips, forward_gaps, training_freezes
from distify.retained_graph import retained_backwards
from distify.rules.base import DDP_BACKEND, FSDP_BACKEND, Context, Rule, add_kwarg


class ModelContract(Rule):
    """Make the model keep DDP's contract, or refuse: reentrant checkpoints, unfreezing, unread code.

    What it does:
        Reads the trained model's class in this file (``__init__``, ``forward`` and the classes of
        this file it is built from; ``distify.model_contract``). An activation checkpoint run with
        reentrant autograd – ``torch.utils.checkpoint.checkpoint(block, x)`` without
        ``use_reentrant=False`` – gets ``use_reentrant=False`` (every backend). A training loop
        that makes parameters require a gradient again (``requires_grad_(True)``,
        ``p.requires_grad = True``, or a value it cannot read) leaves the file unchanged, with the
        line (every backend: hvd.DistributedOptimizer also registers only the parameters that
        require a gradient when it is built); under DDP and FSDP so does one that changes the
        parameters' dtype (``model.half()`` / ``model.float()``, ``model.to(torch.float16)``, or a
        function of the script handed the model that rebinds ``p.data`` over its parameters: the
        fp16/fp32 flip of CLIP fine-tunes). Under DDP, a model whose class is not in this file
        (torchvision, ``from_pretrained``) is reported with what was assumed: that every parameter
        gets a gradient in every step.
        Under FSDP a forward that reaches parameters only under a condition leaves the file
        unchanged, with the line: ``fully_shard`` has no ``find_unused_parameters``. Under DDP and
        FSDP a backward that runs through a wrapped model's forward whose graph an earlier backward
        kept (``retain_graph=True``: a GAN whose discriminator loss reads the generator's undetached
        output, a hidden state carried into the next step with its graph) leaves the file unchanged,
        with both lines (``distify.retained_graph``): the gradients that pass adds are not averaged. (Under DDP,
        parameters a forward can skip, and parameters frozen during training, are DST101's:
        ``find_unused_parameters=True``; a member never reached from ``forward`` gets no gradient
        on any rank, which FSDP2 handles.)

    Why:
        DDP expects each parameter's gradient once per backward, in the order its hooks were
        registered; reentrant checkpointing computes a segment's gradients in a nested backward,
        which DDP (with ``find_unused_parameters`` or shared weights) rejects ("marked ready twice")
        and under which Horovod's per-parameter hooks fire out of step. ``use_reentrant=False`` is
        PyTorch's recommended mode and gives the same gradients. DDP and FSDP register the
        parameters that require a gradient when they wrap: one unfrozen later is never averaged,
        and the ranks drift apart with no error. FSDP2 reduce-scatters, after each backward, the
        gradients a rank holds (measured with torch 2.13 on gloo, 2 ranks): when one rank skips a
        parameter the others use, the collectives differ in size – the root-only shard aborts
        ("collective mismatch"), a separately sharded submodule hangs. Skipped on every rank alike
        (a member never used) it trains correctly.

    Example:
        x = torch.utils.checkpoint.checkpoint(block, x)

        becomes

        x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    """

    code = "DST104"
    name = "model-contract"
    summary = "non-reentrant checkpoints; refuse parameters unfrozen during training"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        done = set()
        scopes = set()
        for model in a.models:
            cls = a.model_class(model)
            if cls is None and ctx.backend == DDP_BACKEND and model.value is not None:
                ctx.report(
                    self.code,
                    model.assign,
                    f"{model.name}: its class is not defined in this file; assumed that every parameter that "
                    "requires a gradient gets one in every backward (else pass find_unused_parameters=True to DDP)",
                    kind="info",
                )
            for gap in forward_gaps(cls, a.classes, a.qualname, ctx.code) if cls is not None else []:
                if gap.kind == "conditional" and ctx.backend == FSDP_BACKEND:
                    ctx.block(
                        self.code,
                        gap.node,
                        f"{gap.what} is reached only when `{gap.why}`: file not migrated; fully_shard "
                        "reduce-scatters the gradients each rank has, so a step where one rank skips these "
                        "parameters and another does not sends collectives of different sizes (gloo aborts, "
                        "a nested fully_shard hangs) and FSDP2 has no find_unused_parameters. Make forward "
                        "reach every parameter in every step (e.g. multiply the skipped branch by a 0/1 mask "
                        "instead of skipping it), or use --backend ddp",
                    )
                    break
                if gap.kind != "reentrant" or id(gap.node) in done:
                    continue
                done.add(id(gap.node))
                ctx.edits.replace(gap.node, _non_reentrant)
                ctx.report(
                    self.code,
                    gap.node,
                    f"activation checkpoint in {gap.what} runs with use_reentrant=False: reentrant autograd "
                    "computes its gradients in a nested backward the gradient averaging sees out of step",
                )
            for gap in training_freezes(a.facts, a.qualname, model.scope, model.name):
                if gap.kind == "unfreeze":
                    ctx.block(
                        self.code,
                        gap.node,
                        f"parameters of {model.name} may start requiring a gradient during training: file not "
                        "migrated; the wrapper (hvd.DistributedOptimizer too) registers the parameters that "
                        "require a gradient when it is built and would never average these. Set requires_grad "
                        "before the model is wrapped, or wrap it again (with a new optimizer) after the change",
                    )
            if ctx.backend not in (DDP_BACKEND, FSDP_BACKEND):
                continue
            if model.scope not in scopes:
                scopes.add(model.scope)
                for r in retained_backwards(a.facts, a.qualname, model.scope, [m.name for m in a.models]):
                    line = a.position(r.first)[0]
                    ctx.block(
                        self.code,
                        r.backward,
                        f"this backward runs through the forward of {r.model} at line {a.position(r.forward)[0]} a "
                        f"second time (the backward at line {line} kept its graph with retain_graph): file not "
                        "migrated; the wrapper averages a parameter's gradient once per forward, so the gradients "
                        "this pass adds stay each rank's own and the ranks drift apart with no error. Compute this "
                        "loss from a fresh forward (or .detach() what the first loss reads), or add the losses and "
                        "call backward once",
                    )
            for gap in dtype_flips(a.facts, a.qualname, model.scope, model.name):
                ctx.block(
                    self.code,
                    gap.node,
                    f"the dtype of {model.name}'s parameters changes inside the training loop: file not migrated; "
                    "the wrapper's gradient buckets are built for the dtypes it wrapped, and gradients of another "
                    "dtype are not averaged as the original trains. Keep the parameters in one dtype and use "
                    "torch.autocast for half-precision compute",
                )
                break


def _non_reentrant(node: cst.Call) -> cst.Call:
    args = [a for a in node.args if not (a.keyword is not None and a.keyword.value == "use_reentrant")]
    if len(args) != len(node.args):
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return add_kwarg(node.with_changes(args=args), "use_reentrant", cst.Name("False"))


RULE = ModelContract()
