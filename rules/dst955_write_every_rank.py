"""DST955 a file written by every rank."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from distify.anatomy import Anatomy, arg
from distify.audit import SAVES
from distify.writes import library_method_write, own_method_names
from distify.rules.base import AuditCheck, Context


class WriteEveryRank(AuditCheck):
    """Checkpoints, images and result files need one writer.

    What it does:
        Part of the output audit (and of ``distify lint``). Reports ``torch.save``,
        ``save_pretrained``/``push_to_hub``, ``torchvision.utils.save_image``, ``savefig``,
        ``numpy.save*``, ``to_csv`` and ``open(path, "w"/"a"/"x")`` calls that run on every rank:
        not under a rank condition, not after an early ``return`` of the other ranks, not in a
        function called only under one, and with a path that does not depend on the rank.

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
            what = _writes(c, own)
            if what is None or a.call_on_some_ranks(c) or a.mentions_rank(c.call):
                continue
            ctx.warn(
                self.code,
                c.call,
                f"{what} runs on every rank: N processes write the same file at once; write on rank 0 only "
                "(if runtime.is_main_process(): / if rank == 0:) or give each rank its own file name",
            )


def _writes(c, own) -> Optional[str]:
    call = c.call
    if c.qualname in SAVES:
        return c.qualname.rsplit(".", 1)[-1] + "()"
    f = call.func
    method = library_method_write(call, own, checkpoints_only=False) if c.qualname is None else None
    if method is not None:
        return f".{method}()"
    if isinstance(f, cst.Name) and f.value == "open" and c.qualname is None:
        mode = arg(call, 1, "mode")
        if mode is not None and isinstance(mode.value, cst.SimpleString):
            m = mode.value.evaluated_value
            if isinstance(m, str) and any(k in m for k in "wax"):
                return "open(..., " + repr(m) + ")"
    return None


RULE = WriteEveryRank()
