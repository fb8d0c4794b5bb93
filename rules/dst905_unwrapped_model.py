"""DST905 a trained model distify cannot wrap."""

from __future__ import annotations

import libcst as cst

from distify.syntax import dotted
from distify.rules.base import DDP_BACKEND, FSDP_BACKEND, Context, Rule


class UnwrappedModel(Rule):
    """Warn about an optimizer whose model distify could not find or wrap.

    What it does:
        Refuses the file (leaves it unchanged) when an optimizer that the script steps trains a
        model that is not built in the same function (or the same class, for ``self.`` attributes)
        before it – a model passed in as an argument, returned by a helper and unpacked, or a layer
        that builds an optimizer over its own ``self.parameters()`` (forward-forward training: no
        wrapper owns those parameters). An optimizer that is never stepped is only reported.

    Why:
        Wrapping in the wrong place is worse than not wrapping: a model wrapped after the
        optimizer, or twice, silently trains wrong. Wrap it yourself right after it is moved to
        its device: ``model = runtime.DDP(model, device_ids=runtime.device_ids())``; with FSDP
        shard it there (``fully_shard(model)``) and build the optimizer after the shard.

    Example:
        optimizer = optim.SGD(build().parameters(), lr=0.1)   # DST905
    """

    code = "DST905"
    name = "unwrapped-model"
    backends = frozenset({DDP_BACKEND, FSDP_BACKEND})
    summary = "trained model not found: not wrapped"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        found = {id(m.optimizer) for m in a.models}
        named = {(id(m.optimizer), n) for m in a.models for n in (m.name, m.stands_for) if n}
        # optimizers whose .step() the script calls anywhere (`self.opt.step()` in a layer's own train_step too)
        # (by key: an optimizer held on the instance is one whatever each method calls the instance)
        steps = {
            a.facts.key(c.scope, dotted(c.call.func.value))
            for c in a.calls
            if isinstance(c.call.func, cst.Attribute) and c.call.func.attr.value == "step"
        }
        for opt in a.optimizers:
            site = opt.site  # built by a function of the script: its model is found where the script obtains it
            missing = [r for r in site.models if (id(opt), r) not in named]
            if not site.models:
                missing = ["its parameters"]
            for m in missing:
                if any(mm.name == m for mm in a.models):
                    continue  # the same model was found through another optimizer
                if ctx.backend == FSDP_BACKEND:
                    how = (
                        "not sharded; shard it with fully_shard(model) yourself (its repeated blocks first) "
                        "and build this optimizer after that"
                    )
                else:
                    how = "not wrapped; wrap it with runtime.DDP(model, device_ids=runtime.device_ids()) yourself"
                if opt.target is not None and a.facts.key(opt.call.scope, opt.target) in steps:
                    # it steps: written with a warning, the ranks would drift apart from the first step
                    whose = (
                        f"the parameters of {m}, which no distributed wrapper owns (it is not built in this scope "
                        "before the optimizer)"
                        if opt.models else
                        "parameters distify cannot trace to a model (not `model.parameters()`, nor a name bound "
                        "once to a value made from it)"
                    )
                    ctx.block(
                        self.code,
                        opt.call.call,
                        f"{opt.target} steps {whose}: file not migrated; its updates would not be "
                        f"averaged across ranks. Build the model and its optimizer in one scope, or {how.split('; ', 1)[1]}",
                    )
                    continue
                ctx.warn(
                    self.code,
                    opt.call.call,
                    f"model for this optimizer ({m}) is not built in this scope before it: {how}",
                )


RULE = UnwrappedModel()
