"""DST922 a sharded model's parameter read outside its forward (FSDP)."""

from __future__ import annotations

import libcst as cst

from distify.names import qualname_or_builtin
from distify.records import SAVE
from distify.syntax import all_nodes, dotted, held_name, sole_statement
from distify.forward_methods import runs_submodule, takes_gradients
from distify.rules.base import FSDP_BACKEND, Context, Rule, reaching_scopes

PARAMETER_ATTRS = frozenset({"weight", "bias"})
# calls that hold what they are handed (``dict(model.named_parameters())``)
_CONTAINERS = frozenset({"builtins.dict", "builtins.list", "builtins.tuple", "collections.OrderedDict"})


class ParameterOutsideForward(Rule):
    """Warn where the script reads a parameter of a sharded model outside its forward (FSDP).

    What it does:
        After ``fully_shard``, a use such as ``model.fc.weight`` (``.bias``) in the training loop,
        an evaluation helper or a logging line gets a warning with its position. Nothing is
        changed: what the use needs (this rank's shard, or the whole tensor through
        ``.full_tensor()``, a collective every rank must call) depends on what it does with it.

    Why:
        FSDP2 replaces every parameter by a DTensor that holds one rank's shard; outside forward
        and backward the full tensor exists nowhere. ``model.fc.weight.norm()`` then computes a
        norm over a DTensor (a collective, on every rank), ``.data`` / ``.numpy()`` see only the
        local rows, and an in-place write changes one shard. Inside forward FSDP gathers the
        parameters, so the model's own code is not affected. Where the value computed from such a
        read reaches ``.backward()`` (``loss = ce + 1e-3 * model.fc.weight.pow(2).sum()``), the loss
        becomes a DTensor and backward crashes ("mixed torch.Tensor and DTensor"): the file is left
        unchanged (blocked) instead of written to crash.

    Example:
        print(model.fc.weight.norm())

        warns

        DST922 model.fc.weight is a DTensor shard after fully_shard: ...
    """

    code = "DST922"
    name = "parameter-outside-forward"
    backends = frozenset({FSDP_BACKEND})
    summary = "warn on parameters of a sharded model read outside forward"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        seen = set()
        for model, anchor in ctx.plan.sharded():
            targets = reaching_scopes(ctx, model, anchor)
            if self._submodule_trained(ctx, model, targets) or self._parameters_saved(ctx, targets):
                return
            for attr, scope, _cls, stmt in a.attr_uses:
                if attr.attr.value not in PARAMETER_ATTRS or id(attr) in seen:
                    continue
                # the innermost dotted prefix that names the model: model.fc.weight -> model
                name = _model_prefix(attr.value, scope, targets)
                if name is None:
                    continue
                after, _ = targets[(id(scope), name)]
                if after is not None and not a.is_before(after, stmt):
                    continue  # before fully_shard: a plain tensor (initialisation, weight tying)
                seen.add(id(attr))
                if a.facts.reaches_backward(scope, stmt) and not _root_gathered(a, model, name, attr, scope, stmt):
                    ctx.block(
                        self.code,
                        attr,
                        f"{ctx.code(attr)} is a DTensor shard after fully_shard, and the value computed from it "
                        "reaches .backward() while the parameter is sharded (read before this step's forward, "
                        "or in a separately sharded block): the loss becomes a DTensor and backward crashes "
                        "('mixed torch.Tensor and DTensor'); file not migrated. Compute the term after the "
                        "forward of the step (the root's parameters stay gathered until backward) or inside "
                        "the model's forward",
                    )
                    continue
                ctx.warn(
                    self.code,
                    attr,
                    f"{ctx.code(attr)} is a DTensor shard after fully_shard: outside forward each rank holds "
                    "part of it; use .full_tensor() (a collective: on every rank) for the whole tensor, "
                    ".to_local() for this rank's part",
                )


    def _parameters_saved(self, ctx: Context, targets) -> bool:
        """``torch.save`` of what ``model.named_parameters()`` / ``parameters()`` yields after the
        shard (in the save's arguments, or bound to a name the save reads: ``trained = {n: p for n, p
        in model.named_parameters() if p.requires_grad}``): DTensor shards, refused (True)."""
        a = ctx.anatomy
        saves = [c for c in a.calls if c.qualname in SAVE]
        if not saves:
            return False
        for attr, scope, _cls, stmt in a.attr_uses:
            if attr.attr.value not in ("named_parameters", "parameters"):
                continue
            name = held_name(attr.value)
            how = targets.get((id(scope), name)) if name is not None else None
            if how is None or (how[0] is not None and not a.is_before(how[0], stmt)):
                continue
            small = sole_statement(stmt)
            # the tensors themselves, gathered into a container (not handed to a constructor: an optimizer)
            holds = isinstance(small, cst.Assign) and len(small.targets) == 1 and (
                isinstance(small.value, (cst.DictComp, cst.ListComp, cst.SetComp, cst.GeneratorExp))
                or (isinstance(small.value, cst.Call) and qualname_or_builtin(a, small.value.func) in _CONTAINERS
                    and any(n is attr for n in all_nodes(small.value))))
            bound = dotted(small.targets[0].target) if holds else None
            for c in saves:
                if c.scope is not scope:
                    continue
                held = c.stmt is stmt and any(n is attr for x in c.call.args for n in all_nodes(x.value))
                read = bound is not None and a.is_before(stmt, c.stmt) and any(
                    dotted(n) == bound for x in c.call.args for n in all_nodes(x.value))
                if held or read:
                    ctx.block(
                        self.code, attr,
                        f"{name}.{attr.attr.value}() yields DTensor shards after fully_shard, and torch.save "
                        "writes them: the file would hold one rank's part of each tensor; file not migrated. "
                        f"Gather get_model_state_dict({name}, options=StateDictOptions(full_state_dict=True, "
                        "cpu_offload=True)) on every rank and keep the entries you save",
                    )
                    return True
        return False

    def _submodule_trained(self, ctx: Context, model, targets) -> bool:
        """`model.encoder(x)` on the training path, its value differentiated, after the shard and
        with no forward of the model before it in the step: refused (True)."""
        a = ctx.anatomy
        cls = a.model_class(model)
        if cls is None:
            return False
        called = {id(c.call.func): c for c in a.calls if isinstance(c.call.func, cst.Attribute)}
        for attr, scope, _cls, stmt in a.attr_uses:
            site = called.get(id(attr))
            if site is None:
                continue
            name = held_name(attr.value)
            how = targets.get((id(scope), name)) if name is not None else None
            if how is None or (how[0] is not None and not a.is_before(how[0], stmt)):
                continue
            method = attr.attr.value
            if not runs_submodule(a.classes, cls, method):
                continue
            if not takes_gradients(a, site) or _root_gathered(a, model, name, attr, scope, stmt):
                continue
            ctx.block(
                self.code, attr,
                f"{name}.{method}() runs a submodule of the sharded model on its own where the loss is "
                "differentiated: FSDP gathers the parameters around the model's forward (or a unit's own), so "
                "here they are DTensor shards and the step crashes ('mixed torch.Tensor and DTensor'); file not "
                f"migrated. Run the submodules inside the model's forward (call {name}(...)), or migrate with "
                "--backend horovod",
            )
            return True
        return False


def _root_gathered(a, model, name: str, attr: cst.Attribute, scope, stmt) -> bool:
    """Whether the parameter read in `stmt` sees the gathered (plain) tensor: FSDP2 keeps the ROOT
    unit's parameters unsharded from its forward until backward, so a read of a root parameter after
    the model's forward in the same step (same innermost loop, earlier in source order or in the
    same statement, ``loss = ce(model(x), y) + 1e-4 * model.fc.weight.pow(2).sum()``) is a plain
    tensor and its gradient joins the reduce-scatter. Blocks sharded on their own reshard after
    their forward: a read inside one stays a DTensor."""
    full = dotted(attr) or ""
    if not full.startswith(name + "."):
        return False
    path = full[len(name) + 1:]
    if any(path == b.path or path.startswith(b.path + ".") or path.startswith(b.path + "[") for b in a.repeated_blocks(model)):
        return False
    loops = a.facts.loops_around(stmt)
    for site in a.calls:
        if site.scope is not scope or dotted(site.call.func) != name:
            continue
        if not (site.stmt is stmt or a.is_before(site.stmt, stmt)):
            continue
        if loops and loops[-1] not in a.facts.loops_around(site.stmt):
            continue
        if site.stmt is stmt and not _called_first(site.call, attr, stmt):
            continue
        return True
    return False


def _called_first(call: cst.Call, attr: cst.Attribute, stmt) -> bool:
    """The model call comes before the parameter read in the statement's evaluation (left to right)."""
    order = [n for n in all_nodes(stmt) if n is call or n is attr]
    return bool(order) and order[0] is call


def _model_prefix(expr: cst.BaseExpression, scope, targets):
    node = expr
    while True:
        d = held_name(node)  # `trainer.get_model()` too
        if d is not None and (id(scope), d) in targets:
            return d
        if isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
            continue
        return None


RULE = ParameterOutsideForward()
