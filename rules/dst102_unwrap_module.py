"""DST102 reach the wrapped module for state and custom attributes."""

from __future__ import annotations

from typing import List, Tuple

import libcst as cst

from distify.anatomy import MODULE_API, STATE_API, dotted
from distify.rules.base import DDP_BACKEND, Context, Rule, reaching_scopes


class UnwrapModule(Rule):
    """Go through ``.module`` of a DDP-wrapped model for its state and its own attributes.

    What it does:
        After the wrap, ``model.state_dict()`` / ``model.load_state_dict(...)`` and attributes of
        the user's own module (``model.fc``, ``model.encode(...)``) become
        ``model.module.state_dict()``, ``model.module.fc``. Inside functions that receive the
        model as a parameter it uses ``runtime.unwrap(model)``, which works for wrapped and plain
        models alike.

    Why:
        ``DistributedDataParallel`` stores the model as ``.module``: its own state_dict has every
        key prefixed with ``module.``, so checkpoints would no longer load into the single-GPU
        model, and it does not forward custom attributes (``AttributeError``).

    Example:
        torch.save(model.state_dict(), "model.pt")

        becomes

        torch.save(model.module.state_dict(), "model.pt")
    """

    code = "DST102"
    name = "unwrap-module"
    backends = frozenset({DDP_BACKEND})
    summary = "use model.module for state_dict and custom attributes"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        for model, anchor in ctx.state.get("wrapped", []):
            targets = reaching_scopes(ctx, model, anchor)
            for attr, scope, cls, stmt in a.attr_uses:
                name = dotted(attr.value)
                if name is None or attr.attr.value in MODULE_API:
                    continue
                how = targets.get((id(scope), name))
                if how is None:
                    continue
                after, mode = how
                if after is not None and not a.is_before(after, stmt):
                    continue
                if attr.attr.value.startswith("__"):
                    continue
                if mode == "module":
                    new_value = lambda n: cst.Attribute(value=n.value, attr=cst.Name("module"))
                else:
                    rt = ctx.runtime
                    new_value = lambda n, rt=rt: cst.parse_expression(f"{rt}.unwrap()").with_changes(
                        args=[cst.Arg(n.value)]
                    )
                ctx.edits.replace(attr, lambda n, f=new_value: n.with_changes(value=f(n)))
                what = "state" if attr.attr.value in STATE_API else f"attribute .{attr.attr.value}"
                via = f"{name}.module" if mode == "module" else f"{ctx.runtime}.unwrap({name})"
                ctx.report(self.code, attr, f"{what} of the wrapped model reached through {via}")


RULE = UnwrapModule()
