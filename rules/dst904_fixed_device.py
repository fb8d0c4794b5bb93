"""DST904 hard-coded device index."""

from __future__ import annotations

import libcst as cst

from distify.records import DEVICE
from distify.rules.base import Context, Rule
from distify.walk import walk


class FixedDevice(Rule):
    """Stop at a device hard-coded to a GPU other than 0 (``"cuda:1"``, ``.cuda(1)``).

    What it does:
        Reports it and leaves the whole file unchanged.

    Why:
        Under a launcher every process must use ``cuda:<local_rank>``; a fixed index puts all
        ranks on one GPU. Index 0 is rewritten automatically (DST002) because it is the
        single-GPU default; any other index expresses an intent distify cannot guess.

    Example:
        device = torch.device("cuda:1")   # DST904: use runtime.device()
    """

    code = "DST904"
    name = "fixed-device"
    summary = "hard-coded GPU index: file left unchanged"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        for site in a.calls:
            c = site.call
            if site.qualname in DEVICE and c.args:
                for v in _strings(c.args[0].value):
                    if v.startswith("cuda:") and v != "cuda:0":
                        ctx.block(self.code, c, f"device {v!r} is fixed: every rank would use it; file not migrated (use runtime.device())")
                        break
                idx = c.args[1].value if len(c.args) > 1 else None
                if isinstance(idx, cst.Integer) and idx.value != "0":
                    ctx.block(self.code, c, f"device index {idx.value} is fixed: every rank would use it; file not migrated (use runtime.device())")
            elif isinstance(c.func, cst.Attribute) and c.func.attr.value == "cuda" and site.qualname is None:
                pos = [x for x in c.args if x.keyword is None]
                if pos and not (isinstance(pos[0].value, cst.Integer) and pos[0].value.value == "0"):
                    ctx.block(self.code, c, ".cuda() with a fixed device index: every rank would use it; file not migrated (use .to(device))")


def _strings(expr: cst.CSTNode):
    """String literals in an expression (e.g. both arms of `"cuda:1" if ok else "cpu"`)."""
    out = []

    class V(cst.CSTVisitor):
        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            if isinstance(node.evaluated_value, str):
                out.append(node.evaluated_value)

    walk(expr, V())
    return out


RULE = FixedDevice()
