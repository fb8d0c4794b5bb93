"""DST925 a copy of a sharded model (EMA, SWA, deepcopy): not possible under FSDP."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from distify.syntax import dotted, all_nodes, held_name
from distify.rules.base import FSDP_BACKEND, Context, Rule, reaching_scopes
from distify.library import EXPORTS
from distify.meaning import copies_argument
from distify.pickled import handed, pickled, pickled_elsewhere, saved_whole


class CopyOfShardedModel(Rule):
    """Refuse a file that copies a model after ``fully_shard`` (EMA, SWA, ``copy.deepcopy``).

    What it does:
        Under ``--backend fsdp``, a ``copy.deepcopy(model)``, ``AveragedModel(model)``, timm's
        ``ModelEma(model)``, ``ema.update(model)`` / ``swa.update_parameters(model)``, or a class or
        function of the script that deep-copies the model it is given (``ModelEMA(model)``), made
        of a sharded model, leaves the file unchanged with this warning. So does a save that pickles
        the sharded model or its optimizer whole (``state = {'model': model, 'optimizer':
        optimizer}; torch.save(state, path)``, also through a helper: ``distify.pickled``).

    Why:
        FSDP2 refuses to deep-copy a sharded module ("FSDP does not support deepcopy"): the script
        would crash at the copy. With DDP distify copies the unwrapped module instead; under FSDP
        there is no unsharded module to copy. Keep such copies from a full state dict
        (``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))``) or
        shard the copy too, by hand.

    Example:
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))   # DST925
    """

    code = "DST925"
    name = "copy-of-sharded-model"
    backends = frozenset({FSDP_BACKEND})
    summary = "a copy (EMA, SWA, deepcopy) of a sharded model: file not migrated"

    def apply(self, ctx: Context) -> None:
        if self._optimizer_pickled(ctx):
            return
        a = ctx.anatomy
        for model, anchor in ctx.plan.wrapped:
            targets = reaching_scopes(ctx, model, anchor)
            for site in a.calls:
                found = pickled(a, site)
                if not found and any((id(site.scope), held_name(v)) in targets for v in handed(a, site)):
                    found = pickled_elsewhere(a, site, ctx.plan.script_path, ctx.options)
                for p in found:
                    member = p.expr
                    how = targets.get((id(site.scope), held_name(member)))
                    # fully_shard changes the module in place: a dict built before it holds it sharded too
                    if how is not None and (how[0] is None or a.is_before(how[0], site.stmt)):
                        ctx.block(
                            self.code,
                            member,
                            f"torch.save() pickles the sharded model {held_name(member)} whole: its parameters are "
                            "this rank's shards, so the file would hold one rank's part of the weights; file not "
                            "migrated. Save get_model_state_dict(model, options=StateDictOptions("
                            "full_state_dict=True)) instead",
                        )
                        return
                for i, x in enumerate(site.call.args):
                    if x.keyword is not None or x.star:
                        continue
                    how = targets.get((id(site.scope), held_name(x.value)))
                    if how is None:
                        continue
                    after, _ = how
                    if after is not None and not a.is_before(after, site.stmt):
                        continue
                    what = _copy_of(ctx, site, i)
                    if what is None:
                        continue
                    if site.qualname in EXPORTS:
                        why = ("an export traces this rank's DTensor shards (the script would fail here, or export "
                               "one rank's part of the weights)")
                        fix = ("Export an unsharded copy on rank 0, loaded from get_model_state_dict(model, "
                               "options=StateDictOptions(full_state_dict=True))")
                    else:
                        why = ("pickles the whole module, whose parameters are this rank's shards: the file would "
                               "hold one rank's part of the weights" if site.qualname == "torch.save" else
                               "FSDP cannot deep-copy a sharded module (the script would crash here)")
                        fix = ("Keep the copy from get_model_state_dict(model, options=StateDictOptions("
                               "full_state_dict=True)) or shard it by hand")
                    ctx.block(self.code, site.call, f"{what} of the sharded model {held_name(x.value)}: {why}; "
                              f"file not migrated. {fix}")
                    return


    def _optimizer_pickled(self, ctx: Context) -> bool:
        """An optimizer of a sharded model pickled whole by a save (``state['optimizer'] = optimizer``;
        ``torch.save(state, path)``): its parameters and their state are this rank's shards."""
        a = ctx.anatomy
        sharded = {m.name for m, _ in ctx.plan.wrapped}
        names = {(id(o.call.scope), o.target): o for o in a.optimizers if o.target and sharded & set(o.models)}
        if not names:
            return False
        for site, expr, key in saved_whole(a, names, ctx.plan.script_path, ctx.options):
            opt = names[key]
            if a.is_before(opt.call.stmt, site.stmt):
                ctx.block(
                    self.code, expr,
                    f"torch.save() pickles the optimizer {opt.target} of a sharded model whole: its parameters "
                    "and their state are this rank's shards, so the file would hold one rank's part; file not "
                    f"migrated. Save get_optimizer_state_dict(model, {opt.target}, options=StateDictOptions("
                    "full_state_dict=True)) instead",
                )
                return True
        return False


def _copy_of(ctx: Context, site, i: int) -> Optional[str]:
    """How `site` copies its argument `i` (a description), or None."""
    a = ctx.anatomy
    if copies_argument(a, site, i):
        return f"{ctx.code(site.call.func)}()"
    fn = a.callee(site.call, site.scope)
    name = dotted(site.call.func)
    if fn is None and name in a.classes:
        body = a.classes[name].body
        fn = next(
            (s for s in getattr(body, "body", ()) if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"),
            None,
        )
        offset = 1
    else:
        offset = 1 if fn is not None and fn in a.methods else 0
    if fn is None:
        return None
    params = [p.name.value for p in fn.params.params]
    if i + offset >= len(params):
        return None
    param = params[i + offset]
    for node in all_nodes(fn.body):
        if (
            isinstance(node, cst.Call)
            and a.qualname(node.func) in ("copy.deepcopy", "copy.copy")
            and node.args
            and dotted(node.args[0].value) == param
        ):
            return f"{ctx.code(site.call.func)}() (it deep-copies {param})"
    return None


RULE = CopyOfShardedModel()
