"""DST921 weights tied across modules that FSDP shards separately (FSDP)."""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from distify.instance import instance_name

from distify.syntax import dotted
from distify.rules.base import FSDP_BACKEND, Context, Rule


class TiedAcrossBlocks(Rule):
    """Refuse a model that ties a parameter across modules sharded as separate units (FSDP).

    What it does:
        For a model class of this file whose repeated blocks DST121 shards one by one
        (``for block in model.blocks: fully_shard(block)``, then the root), an assignment in its
        ``__init__`` that makes two modules share a parameter (``self.head.weight =
        self.blocks[0].proj.weight``) where one side is inside a block and the other is not (or in
        another block) leaves the file unchanged, with this warning: the sharded script would stop
        with an error at its first ``fully_shard``. Ties between modules of the same unit – the usual
        ``self.head.weight = self.emb.weight``, both outside the blocks – shard correctly and are
        left alone.

    Why:
        Each ``fully_shard`` call manages the parameters of its module as one group. A parameter
        that belongs to two groups cannot be sharded twice: ``fully_shard`` raises ``ValueError:
        Parameter ... is shared with a parameter already managed by another FSDP group``. The fix
        is to shard the modules that share it together – ``fully_shard([module_a, module_b])`` –
        or to leave the block that holds it to the root's unit.

    Example:
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        self.head.weight = self.blocks[0].proj.weight

        is refused

        DST921 self.head.weight is tied to self.blocks[0].proj.weight across fully_shard units ...
    """

    code = "DST921"
    name = "tied-across-blocks"
    backends = frozenset({FSDP_BACKEND})
    summary = "refuse weights tied across separately sharded blocks"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        done = set()
        for model, _anchor in ctx.plan.sharded():
            cls = _model_class(ctx, model)
            if cls is None or id(cls) in done:
                continue
            done.add(id(cls))
            blocks = [b.path for b in a.repeated_blocks(model) if b.owner == cls.name.value]  # DST121's units
            if not blocks:
                continue
            init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
            if init is None:
                continue
            me = instance_name(init)  # the instance, whatever __init__ calls it
            for node in _assigns(init):
                target, value = node.targets[0].target, node.value
                left, right = _self_path(ctx, target, me), _self_path(ctx, value, me)
                if left is None or right is None:
                    continue
                if _unit(left, blocks) == _unit(right, blocks):
                    continue
                ctx.block(
                    self.code,
                    node,
                    f"{ctx.code(target)} is tied to {ctx.code(value)} across fully_shard units (the blocks are "
                    "sharded one by one, then the root): fully_shard would raise ValueError for a parameter in "
                    "two groups, so the file is not migrated; shard the modules that share it together "
                    "(fully_shard([a, b])) or leave that block to the root",
                )


def _model_class(ctx: Context, model) -> Optional[cst.ClassDef]:
    value = model.value
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):  # Net().to(device)
        value = value.func.value
    if isinstance(value, cst.Call):
        return ctx.anatomy.classes.named(dotted(value.func))
    return None


def _assigns(fn: cst.FunctionDef) -> List[cst.Assign]:
    out = []

    class V(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            if len(node.targets) == 1:
                out.append(node)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is fn

    fn.visit(V())
    return out


def _self_path(ctx: Context, expr: cst.BaseExpression, me: Optional[str]) -> Optional[str]:
    """`self.a.b[0].weight` -> "a.b[0].weight" for an attribute chain ending in a parameter name, on
    the instance `me` (``__init__``'s first parameter, whatever it is spelled)."""
    if not (isinstance(expr, cst.Attribute) and expr.attr.value in ("weight", "bias")):
        return None
    node = expr
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    if me is None or not (isinstance(node, cst.Name) and node.value == me):
        return None
    text = "".join(ctx.code(expr).split())
    return text[len(me) + 1:]


def _unit(path: str, blocks: List[str]) -> str:
    """Which fully_shard unit a parameter path falls in: one block of a container, or the root."""
    for b in blocks:
        if path.startswith(b + "["):
            return path[: path.index("]", len(b)) + 1]
        if path.startswith(b + "."):
            rest = path[len(b) + 1 :].split(".")
            return f"{b}.{rest[0]}"  # nn.Sequential's `blocks.0` or a ModuleDict key
    return "root"


RULE = TiedAcrossBlocks()
