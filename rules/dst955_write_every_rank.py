"""DST955 a file written by every rank."""

from __future__ import annotations

from distify.anatomy import Anatomy
from distify.helper_effects import advice, unguarded_helper_calls
from distify.writes import file_write, own_method_names, per_rank_file
from distify.rules.base import AuditCheck, Context


class WriteEveryRank(AuditCheck):
    """Checkpoints, images and result files need one writer.

    What it does:
        Part of the output audit (and of ``distify lint``). Reports ``torch.save``,
        ``save_pretrained``/``push_to_hub``, ``torchvision.utils.save_image``, ``savefig``,
        ``numpy.save*``, ``to_csv`` and ``open(path, "w"/"a"/"x")`` calls that run on every rank:
        not under a rank condition, not after an early ``return`` of the other ranks, not in a
        function called only under one, and with a path that does not depend on the rank.
        Also a call, on every rank, of a function of another module of the project (not migrated)
        that writes such a file itself or through the project functions it calls.

    Why:
        N processes writing one file at once interleave or truncate each other's bytes; a reader
        (a resumed run, the next epoch's ``torch.load``) may then see a corrupt or half-written
        checkpoint. Saving once, on rank 0, is also N times less I/O.

    Example:
        for epoch in range(epochs):
            train(...)
            torch.save(model.module.state_dict(), "ckpt.pt")    # DST955 in a DDP script

        fix: if dist.get_rank() == 0: torch.save(...)  (or runtime.is_main_process())
    """

    code = "DST955"
    name = "write-every-rank"
    summary = "audit: a checkpoint or file written by every rank"

    def check(self, ctx: Context, a: Anatomy) -> None:
        own = own_method_names(a.methods)
        for c in a.calls:
            what = file_write(c, own)
            if what is None or a.call_on_some_ranks(c) or per_rank_file(a, c):
                continue
            ctx.warn(
                self.code,
                c.call,
                f"{what} runs on every rank: N processes write the same file at once; write on rank 0 only "
                "(if runtime.is_main_process(): / if rank == 0:) or give each rank its own file name",
            )
        for c, t, found in unguarded_helper_calls(a, ctx.plan.script_path, ctx.options):
            first = next((e for e in found if e.kind == "write"), None)
            if first is not None:
                ctx.warn(self.code, c.call, advice(c, t, first))


RULE = WriteEveryRank()
