"""DST922 a sharded model's parameter read outside its forward (FSDP)."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import dotted
from distify.rules.base import FSDP_BACKEND, Context, Rule, reaching_scopes

PARAMETER_ATTRS = frozenset({"weight", "bias"})


class ParameterOutsideForward(Rule):
    """Warn where the script reads a parameter of a sharded model outside its forward (FSDP).

    What it does:
        After ``fully_shard``, a use such as ``model.fc.weight`` (``.bias``) in the training loop,
        an evaluation helper or a logging line gets a warning with its position. Nothing is
        changed: what the use needs (this rank's shard, or the whole tensor through
        ``.full_tensor()``, a collective every rank must call) depends on what it does with it.

    Why:
        FSDP2 replaces every parameter by a DTensor that holds one rank's shard; outside forward
        and backward the full tensor exists nowhere. ``model.fc.weight.norm()`` then computes a
        norm over a DTensor (a collective, on every rank), ``.data`` / ``.numpy()`` see only the
        local rows, and an in-place write changes one shard. Inside forward FSDP gathers the
        parameters, so the model's own code is not affected.

    Example:
        print(model.fc.weight.norm())

        warns

        DST922 model.fc.weight is a DTensor shard after fully_shard: ...
    """

    code = "DST922"
    name = "parameter-outside-forward"
    backends = frozenset({FSDP_BACKEND})
    summary = "warn on parameters of a sharded model read outside forward"

    def apply(self, ctx: Context) -> None:
        from distify.rules.dst307_full_state_dict import sharded_models

        a = ctx.anatomy
        seen = set()
        for model, anchor in sharded_models(ctx):
            targets = reaching_scopes(ctx, model, anchor)
            for attr, scope, _cls, stmt in a.attr_uses:
                if attr.attr.value not in PARAMETER_ATTRS or id(attr) in seen:
                    continue
                # the innermost dotted prefix that names the model: model.fc.weight -> model
                name = _model_prefix(attr.value, scope, targets)
                if name is None:
                    continue
                after, _ = targets[(id(scope), name)]
                if after is not None and not a.is_before(after, stmt):
                    continue  # before fully_shard: a plain tensor (initialisation, weight tying)
                seen.add(id(attr))
                ctx.warn(
                    self.code,
                    attr,
                    f"{ctx.code(attr)} is a DTensor shard after fully_shard: outside forward each rank holds "
                    "part of it; use .full_tensor() (a collective: on every rank) for the whole tensor, "
                    ".to_local() for this rank's part",
                )


def _model_prefix(expr: cst.BaseExpression, scope, targets):
    node = expr
    while True:
        d = dotted(node)
        if d is not None and (id(scope), d) in targets:
            return d
        if isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
            continue
        return None


RULE = ParameterOutsideForward()
