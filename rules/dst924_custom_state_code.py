"""DST924 model classes with their own state_dict code (FSDP)."""

from __future__ import annotations

import libcst as cst

from distify.rules.base import FSDP_BACKEND, Context, Rule

OVERRIDES = frozenset({"state_dict", "load_state_dict", "_save_to_state_dict", "_load_from_state_dict"})
HOOKS = frozenset({
    "_register_state_dict_hook",
    "register_state_dict_pre_hook",
    "register_state_dict_post_hook",
    "_register_load_state_dict_pre_hook",
    "register_load_state_dict_pre_hook",
    "register_load_state_dict_post_hook",
})


class CustomStateCode(Rule):
    """Warn where a module class of the script overrides or hooks its state dict (FSDP).

    What it does:
        When the script has a model that ``fully_shard`` shards, every class of the file that
        defines ``state_dict``, ``load_state_dict``, ``_save_to_state_dict`` or
        ``_load_from_state_dict``, and every call that registers a state-dict hook
        (``register_state_dict_pre_hook``, ``_register_load_state_dict_pre_hook`` ...), gets a
        warning with its position. Nothing is changed.

    Why:
        ``get_model_state_dict`` and ``set_model_state_dict`` (DST307) call the model's own
        ``state_dict`` / ``load_state_dict``, so the custom code still runs – but on DTensor shards
        (gathered or sharded around it, not inside it). Code that reads values (``.numpy()``,
        shapes, ``torch.equal``), renames keys that the full-state API matches to parameters, or
        builds tensors of its own may break or write partial data. It needs reading by a person.

    Example:
        class Net(nn.Module):
            def state_dict(self, *args, **kwargs):
                ...

        warns

        DST924 Net overrides state_dict: under FSDP it runs on DTensor shards ...
    """

    code = "DST924"
    name = "custom-state-code"
    backends = frozenset({FSDP_BACKEND})
    summary = "warn on custom state_dict code in a sharded model's classes"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        if not ctx.plan.sharded():
            return
        for fn, cls in a.methods.items():
            if fn.name.value in OVERRIDES:
                ctx.warn(
                    self.code,
                    fn,
                    f"{cls.name.value} overrides {fn.name.value}: under FSDP it runs on DTensor shards "
                    "(get_model_state_dict / set_model_state_dict call it); check that it handles them",
                )
        for site in a.calls:
            func = site.call.func
            if isinstance(func, cst.Attribute) and func.attr.value in HOOKS:
                ctx.warn(
                    self.code,
                    site.call,
                    f"{func.attr.value}: the hook runs on DTensor shards under FSDP (get_model_state_dict / "
                    "set_model_state_dict call the model's state_dict); check that it handles them",
                )


RULE = CustomStateCode()
