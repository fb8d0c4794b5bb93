"""DST301 checkpoints are written by rank 0 only."""

from __future__ import annotations

from distify.records import SAVE
from distify.rules.base import Context, Rule, call_statement


class Rank0Save(Rule):
    """Write checkpoints from the main process only.

    What it does:
        Puts every ``torch.save(...)`` statement (and every ``x.save_pretrained(...)`` /
        ``x.push_to_hub(...)`` of a Hugging Face model or tokenizer) under ``if runtime.is_main_process():`` (or
        ``hvd.rank() == 0``); when the save is the only statement of an ``if``, the condition is
        extended instead: ``if args.save_model and runtime.is_main_process():``.

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
            target = site.call.args[1:] if site.qualname in SAVE else site.call.args  # where it writes
            if any(ctx.anatomy.reads_rank(x.value) for x in target):
                continue  # `torch.save(state, f"ckpt_rank{rank}.pt")`: each rank saves its own file
            what = "torch.save" if site.qualname in SAVE else f"{site.call.func.attr.value}()"
            if ctx.guard_statement(site.stmt):
                ctx.report(self.code, site.call, f"{what} runs on the main process only")


RULE = Rank0Save()
