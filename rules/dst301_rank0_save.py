"""DST301 checkpoints are written by rank 0 only."""

from __future__ import annotations

import libcst as cst

from distify.helper_effects import exact_helper_calls
from distify.records import SAVE
from distify.rules.base import FSDP_BACKEND, Context, Rule, call_statement, reaching_scopes
from distify.writes import per_rank_file


class Rank0Save(Rule):
    """Write checkpoints from the main process only.

    What it does:
        Puts every ``torch.save(...)`` statement (and every ``x.save_pretrained(...)`` /
        ``x.push_to_hub(...)`` of a Hugging Face model or tokenizer) under ``if runtime.is_main_process():`` (or
        ``hvd.rank() == 0``); when the save is the only statement of an ``if``, the condition is
        extended instead: ``if args.save_model and runtime.is_main_process():``. A call of a
        function of the user's project that does nothing but write files and print
        (``save_checkpoint(state, is_best, filename)`` in utils.py: ``torch.save``,
        ``shutil.copyfile``), whose arguments only read values, is guarded the same way where it is
        called; under FSDP one whose arguments read a model's state refuses the file (the state of
        a sharded model is each rank's shard: it must be gathered on every rank first).

    Why:
        All ranks hold identical weights after every step, so N writers produce N copies of the
        same file at best and a corrupted file at worst (concurrent writes to one path).

    Example:
        torch.save(model.state_dict(), "model.pt")

        becomes

        if runtime.is_main_process():
            torch.save(model.module.state_dict(), "model.pt")
    """

    code = "DST301"
    name = "rank0-save"
    summary = "save checkpoints on rank 0 only"

    def apply(self, ctx: Context) -> None:
        for site in ctx.anatomy.save_sites():
            if not call_statement(site.stmt, site.call) or ctx.in_rank_guard(site.stmt):
                continue
            if per_rank_file(ctx.anatomy, site):
                continue  # `torch.save(state, f"ckpt_rank{rank}.pt")`: each rank saves its own file
            what = "torch.save" if site.qualname in SAVE else f"{site.call.func.attr.value}()"
            if ctx.guard_statement(site.stmt):
                ctx.report(self.code, site.call, f"{what} runs on the main process only")
        self._helpers(ctx)

    def _helpers(self, ctx: Context) -> None:
        """Calls of project helpers that only write files (``helper_effects.exact_helper_calls``)."""
        held = {}  # (scope, name) of every reference that may hold a wrapped or sharded model
        for model, anchor in ctx.plan.wrapped:
            held.update(reaching_scopes(ctx, model, anchor))
        for site, target, found in exact_helper_calls(ctx.anatomy, ctx.plan.script_path, ctx.options):
            if ctx.in_rank_guard(site.stmt) or not any(e.kind == "write" for e in found):
                continue
            if _hands_model(site, held):
                continue  # the helper reads the wrapper's state itself (`module.` keys, FSDP shards): DST955 says so
            name = f"{target.qualname.rsplit('.', 1)[-1]}() ({target.where})"
            state = [n for x in site.call.args for n in _calls(x.value) if n.func.attr.value == "state_dict"]
            if ctx.backend == FSDP_BACKEND and state:
                ctx.block(self.code, site.call, f"{name} writes a model's state, which fully_shard splits across the "
                                                "ranks: gather it with get_model_state_dict(..., StateDictOptions("
                                                "full_state_dict=True)) on every rank first; not migrated")
                continue
            if ctx.guard_statement(site.stmt):
                ctx.report(self.code, site.call, f"{name} writes files only: it runs on the main process only")


def _hands_model(site, held) -> bool:
    """`site` passes a wrapped or sharded model itself (not its ``state_dict()``) to the helper."""
    from distify.syntax import all_nodes, held_name

    nodes = [n for x in site.call.args for n in all_nodes(x.value)]
    read = {id(n.value) for n in nodes if isinstance(n, cst.Attribute) and n.attr.value == "state_dict"}
    return any(isinstance(n, (cst.Name, cst.Attribute, cst.Call)) and id(n) not in read
               and (id(site.scope), held_name(n)) in held for n in nodes)


def _calls(expr: cst.BaseExpression):
    from distify.syntax import all_nodes

    return [n for n in all_nodes(expr) if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)]


RULE = Rank0Save()
