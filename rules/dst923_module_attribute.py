"""DST923 ``.module`` of a model that FSDP shards (FSDP)."""

from __future__ import annotations

import libcst as cst

from distify.instance import instance_name, is_attribute_of
from distify.syntax import all_nodes, dotted, flatten_target, held_name
from distify.rules.base import FSDP_BACKEND, Context, Rule, reaching_scopes


class ShardedModule(Rule):
    """Warn where the script reaches ``.module`` of a model that ``fully_shard`` shards (FSDP).

    What it does:
        A ``model.module`` written in the input (code that expected a DataParallel or DDP wrapper)
        on a model distify shards with ``fully_shard`` gets a warning with its position, unless
        another rule already rewrites it (DST902 dropping ``nn.DataParallel``). Scripts that are
        distributed already are converted by DST003 instead.

    Why:
        ``fully_shard`` shards the module in place and returns it: there is no wrapper and no
        ``.module`` attribute, so ``model.module.state_dict()`` raises ``AttributeError`` unless
        the model itself has a submodule called ``module``. The sharded model is used directly:
        ``model.fc``, and for checkpoints ``get_model_state_dict(model, ...)`` (DST307).

    Example:
        torch.save(model.module.state_dict(), "model.pt")

        warns

        DST923 model.module: a model sharded with fully_shard is not wrapped; ...
    """

    code = "DST923"
    name = "sharded-module-attribute"
    backends = frozenset({FSDP_BACKEND})
    summary = "warn on .module of a sharded model"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        if a.flavour is not None:
            return  # a distributed script: DST003 converts its wrapper
        replaced = ctx.edits.replacements
        for model, anchor in ctx.plan.sharded():
            targets = reaching_scopes(ctx, model, anchor)
            for attr, scope, _cls, stmt in a.attr_uses:
                if attr.attr.value != "module" or attr in replaced or attr.value in replaced:
                    continue
                name = held_name(attr.value)
                if name is None or (id(scope), name) not in targets:
                    continue
                if _has_module_attribute(a, model) or _tested(ctx, stmt, name):
                    continue
                ctx.warn(
                    self.code,
                    attr,
                    f"{ctx.code(attr)}: a model sharded with fully_shard is not wrapped and has no .module "
                    f"(AttributeError); use {name} itself",
                )


def _has_module_attribute(a, model) -> bool:
    """The model's class (of this file) assigns the instance's ``module`` attribute in one of its
    methods (``self.module = ...``, whatever the method calls its instance): a real submodule FSDP keeps."""
    value = model.value
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):  # Net().to(device)
        value = value.func.value
    cls = a.classes.named(dotted(value.func)) if isinstance(value, cst.Call) else None
    if cls is None:
        return False
    for fn in cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ():
        me = instance_name(fn) if isinstance(fn, cst.FunctionDef) else None
        if me is None:
            continue
        for n in all_nodes(fn.body, skip_nested=True):
            targets = [t.target for t in n.targets] if isinstance(n, cst.Assign) else [n.target] if isinstance(n, cst.AnnAssign) else []
            if any(is_attribute_of(x, me) and x.attr.value == "module" for t in targets for x in flatten_target(t)):
                return True
    return False


def _tested(ctx: Context, stmt, name: str) -> bool:
    """The statement, or an ``if`` around it, asks whether the model is wrapped
    (``hasattr(model, "module")``, ``isinstance(model, nn.DataParallel)``): false under FSDP."""
    a = ctx.anatomy
    for s in (*a.stmt_parent.get(stmt, ()), stmt):
        text = ctx.code(s.test) if isinstance(s, cst.If) else ctx.code(s) if s is stmt else ""
        if f"hasattr({name}," in text or f"isinstance({name}," in text:
            return True
    return False


RULE = ShardedModule()
