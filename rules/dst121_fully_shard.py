"""DST121 shard trained models with FSDP2's fully_shard: repeated blocks first, then the root."""

from __future__ import annotations

from typing import List, Optional, Sequence, Set, Tuple

import libcst as cst

from distify.model_build import COMPILE, compiled_module, compiles_model, module_container
from distify.parallel import sharded_root
from distify.forward_methods import runs_forward
from distify.records import Model, assigned_name
from distify.syntax import arg, dotted, all_nodes, names
from distify.facts import stmt_bindings
from distify.rules.base import FSDP_BACKEND, Context, Rule, note_batch_norm, reaching_scopes

# FSDP2's sharding call (public since torch 2.6; `_composable.fsdp` is where it lived before)
FULLY_SHARD = {
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed.fsdp._fully_shard.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard.fully_shard",
}
SCHEDULER_PREFIX = "torch.optim.lr_scheduler."
# a one-line comment above the shard calls with --bf16
BF16_COMMENT = "bf16 mixed precision: parameters gathered and computed in bfloat16, gradients reduced in float32"


# Optimizers whose step views every parameter as one flat tensor (torch's LBFGS): on DTensor shards
# that view fails at the first step.
FLATTENING_OPTIMIZERS = frozenset({"torch.optim.LBFGS", "torch.optim.lbfgs.LBFGS"})


class FullyShard(Rule):
    """Shard every trained model with ``fully_shard`` (FSDP2): its repeated blocks, then the root.

    What it does:
        Finds each model whose parameters an optimizer receives, at the place DST101 would wrap it
        for DDP (after it is built and moved to its device), and shards it there:
        ``for block in model.blocks: fully_shard(block)`` for each repeated-block container of its
        class (a ``ModuleList`` / ``Sequential`` attribute of a model class of this file built by
        repetition, ``[Block(...) for _ in range(n)]`` or ``*[...]``, or holding two or more
        instances of one module class of this file), then ``fully_shard(model)`` for the root. A
        model whose class is not defined in the file (torchvision, ``from_pretrained``) or has no
        repeated blocks is sharded as one unit (the root only). A model that is a container with no
        forward of its own (``nn.ModuleList``, ``nn.ModuleDict``: ``fully_shard`` refuses it) has
        each module it holds sharded instead (``for layer in model: fully_shard(layer)``); its
        modules own all its parameters. A compiled model is sharded first
        and compiled after (``model = torch.compile(Net())`` becomes ``model = Net()``, the shard,
        then ``model = torch.compile(model)``): its ``state_dict`` keys stay the original's. An
        optimizer built before the shard point is moved after it, with the LR schedulers built from
        it; where moving is unsafe DST912 leaves the file unchanged. With ``--bf16`` every call gets
        ``mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)``.
        Each method other than forward the script calls on the sharded model (``model.decode(z)``,
        ``model.generate(...)``, ``self.model.encode(x)``) that runs the model's computation is
        registered right after the root's shard (a method of the script's class by what it does: it
        calls the model, a submodule or reads a parameter; one of another library's class unless the
        library table calls it housekeeping, ``save_pretrained``; never nn.Module's own methods):
        ``register_fsdp_forward_method(model, "decode")``, and such a call counts as a collective
        for the rank-0 guards. A script with an optimizer that views all parameters as one flat
        tensor (``torch.optim.LBFGS``) is refused: DTensor shards cannot be viewed so.

    Why:
        DDP keeps a full copy of the model, its gradients and the optimizer state on every rank;
        FSDP2 splits every parameter across the ranks (parameters become DTensors in place) and
        gathers a unit's parameters only for its forward and backward. Sharding each block as its
        own unit means only one block is gathered at a time; the root collects what is left
        (embeddings, heads). Gradients are reduce-scattered (averaged), so every rank takes the
        step of the big batch. An optimizer built before sharding holds the old tensors and
        silently updates nothing. FSDP2 all-gathers a unit's parameters only around ``forward``:
        ``model.decode(z)`` would meet DTensor shards ("mixed torch.Tensor and DTensor") unless the
        method is registered to gather them too.

    Example:
        model = GPT(cfg).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

        becomes

        model = GPT(cfg).to(device)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    """

    code = "DST121"
    name = "fully-shard"
    backends = frozenset({FSDP_BACKEND})
    summary = "shard trained models with fully_shard (repeated blocks, then the root)"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        flat = next((o for o in a.optimizers if o.call.qualname in FLATTENING_OPTIMIZERS), None)
        if flat is not None:
            ctx.block(
                self.code,
                flat.call.call,
                f"{flat.target or 'the optimizer'} is {flat.call.qualname}, which views all parameters as one flat "
                "tensor: fully_shard's parameters are DTensor shards that cannot be viewed so (the first step "
                "raises 'Sharding propagation failed'); file not migrated to FSDP (use --backend ddp)",
            )
            return
        wrapped = ctx.plan.wrapped
        ctx.plan.sharding = True  # DST307 and the FSDP advisories follow the sharded models from here
        handled = ctx.plan.sharded_compiles
        refusals = ctx.plan.optimizer_before_shard
        done: Set[Tuple[int, str]] = set()
        for model in a.models:
            key = (id(model.scope), model.name)
            if key in done:
                continue
            done.add(key)
            existing = _existing_shard(ctx, model)
            if existing is not None:
                wrapped.append((model, existing))  # sharded already (incremental run)
                for site in a.calls_to(COMPILE):  # and compiled after the shard, as DST121 writes it
                    small = site.stmt.body[0] if isinstance(site.stmt, cst.SimpleStatementLine) else None
                    if (
                        site.scope is existing_scope(a, existing)
                        and compiles_model(a.qualname, site.call, model.name)
                        and a.is_before(existing, site.stmt)
                        and isinstance(small, cst.Assign)
                    ):
                        handled.add(small)
                continue
            point = _shard_point(ctx, model)
            if isinstance(point, str):
                ctx.block("DST907", model.assign, point)
                continue
            stmt, where, compiled = point
            stale = _list_made_before(ctx, model, stmt, where)
            if stale is not None:
                ctx.block("DST907", stale, (
                    f"the optimizer's parameters are collected into a list here, before {model.name} can be sharded "
                    "(fully_shard replaces every parameter with a sharded one, so the optimizer would step the old "
                    "ones): file not migrated; collect them after the model's last change"
                ))
                continue
            if compiled is not None:
                handled.add(compiled)
            blocks = a.repeated_blocks(model)
            container = module_container(a.qualname, model.value)
            fs = ctx.imported("torch.distributed.fsdp", "fully_shard", "fully_shard")
            mp = ""
            if ctx.options.bf16:
                policy = ctx.imported("torch.distributed.fsdp", "MixedPrecisionPolicy", "MixedPrecisionPolicy")
                torch = ctx.imported("torch", None, "torch")
                mp = f", mp_policy={policy}(param_dtype={torch}.bfloat16, reduce_dtype={torch}.float32)"
            code = f"# {BF16_COMMENT}\n" if mp else ""
            var = None
            for b in blocks:
                var = var or ctx.fresh("block")
                code += f"for {var} in {model.name}.{b.path}:\n    {fs}({var}{mp})\n"
            if container is not None:
                # a ModuleList / ModuleDict has no forward (fully_shard refuses it) and owns no parameter
                # of its own: each module it holds is a unit, whose own forward gathers its parameters
                var = ctx.fresh("layer")
                held = f"{model.name}.values()" if container.modules == "values" else model.name
                code += f"for {var} in {held}:\n    {fs}({var}{mp})\n"
            else:
                code += f"{fs}({model.name}{mp})\n"
            # a container's own methods (append, keys ...) run no forward: nothing to register
            methods = forward_methods(ctx, model, stmt) if container is None else []
            if methods:
                ctx.plan.forward_methods[model.name] = set(methods)
                reg = ctx.imported("torch.distributed.fsdp", "register_fsdp_forward_method", "register_fsdp_forward_method")
                code += "".join(f'{reg}({model.name}, "{m}")\n' for m in methods)
            shard = ctx.stmts(code)
            moved = _move_optimizer(ctx, model, stmt, where)
            if isinstance(moved, str):
                refusals.append((model.optimizer.site.call.call, moved))
                moved = []
            for m in moved:
                ctx.edits.move_after(m, stmt)  # below the shard inserted after `stmt`, edits and all
            if compiled is not None and where == "replace":
                # `model = torch.compile(Net())`: build, shard, then compile the sharded module
                inner = compiled_module(a.qualname, compiled.value)
                text = ctx.code(compiled.value.with_changes(args=[
                    compiled.value.args[0].with_changes(value=cst.Name("_model_")), *compiled.value.args[1:]
                ])).replace("_model_", model.name, 1)
                ctx.edits.replace(compiled, lambda n, inner=inner: n.with_changes(value=inner))
                ctx.edits.insert_after(stmt, [*shard, *ctx.stmts(f"{model.name} = {text}\n")])
            elif where == "before":
                ctx.edits.insert_before(stmt, shard)
            else:
                ctx.edits.insert_after(stmt, shard)
            wrapped.append((model, stmt))
            if blocks:
                parts = "; ".join(
                    f"{model.name}.{b.path} ({b.container} of {b.member}, "
                    + ("built by repetition" if b.how == "repetition" else "instances of one class")
                    + f" in {b.owner}.__init__)"
                    for b in blocks
                )
                why = f"each block of {parts} sharded as its own unit, then the root"
            elif container is not None:
                why = (
                    f"each module it holds sharded as its own unit ({container.name} has no forward of its own, "
                    "which fully_shard refuses; its modules own all its parameters)"
                )
            else:
                cls = a.model_class(model)
                why = (
                    f"sharded as one unit: its class {cls.name.value} has no repeated-block container"
                    if cls is not None
                    else "sharded as one unit: its class is not defined in this file (no repeated blocks known)"
                )
            ctx.report(self.code, model.assign, f"{model.name} sharded with fully_shard: {why}")
            note_batch_norm(ctx, self.code, model.name, model.value,
                            "and keeps running statistics of its own (fully_shard shards parameters, not "
                            "buffers; the saved ones are rank 0's)",
                            f"convert it before the shard: {model.name} = "
                            f"torch.nn.SyncBatchNorm.convert_sync_batchnorm({model.name})")
            if methods:
                ctx.report(
                    self.code,
                    model.assign,
                    f"{model.name}: " + ", ".join(methods) + " registered with register_fsdp_forward_method: "
                    "called outside forward, FSDP gathers the parameters only around forward",
                )
            if mp:
                ctx.report(self.code, model.assign, f"{model.name}: bf16 MixedPrecisionPolicy (--bf16)")


def forward_methods(ctx: Context, model: Model, anchor: cst.CSTNode) -> List[str]:
    """The methods other than forward the script calls on the sharded model after ``anchor``
    (``model.decode(z)``, ``self.model.generate(...)``; also in the functions the model reaches)
    that run the model's computation (``distify.forward_methods``): not nn.Module's own, not a
    method of the script's class that only reads or writes state, not a submodule
    (``model.encoder(x)``), not another library's housekeeping (``save_pretrained``)."""
    a = ctx.anatomy
    cls = a.model_class(model)
    foreign = a.class_methods(cls)[1] if cls is not None else True
    found: List[str] = []
    for (sid, name), (after, _) in reaching_scopes(ctx, model, anchor).items():
        scope = next((s for s in (a.module, *a.functions.values(), *a.methods) if id(s) == sid), None)
        if scope is None:
            continue
        for method, site in a.method_calls(scope, name):
            if method in found or method == "forward":  # forward itself is what FSDP gathers around
                continue
            if after is not None and (site.stmt is after or a.is_before(site.stmt, after)):
                continue
            if runs_forward(a.classes, a.qualname, cls, method, foreign):
                found.append(method)
    return found


def existing_scope(a, stmt: cst.CSTNode):
    return a.stmt_scope.get(stmt)


def _existing_shard(ctx: Context, model: Model) -> Optional[cst.CSTNode]:
    """The statement `fully_shard(model)` already in the model's scope (an earlier run's), or for a
    container the loop ``for layer in model: fully_shard(layer)`` that shards what it holds."""
    a = ctx.anatomy
    f = a.facts
    held = f.instance(model.scope) if f.instance_attr(model.scope, model.name) is not None else None
    key = f.canonical(model.scope, model.name)  # the model's key in every method of its class
    for site in a.calls_to(FULLY_SHARD):
        args = site.call.args
        if not args or not (site.scope is model.scope or (held is not None and (f.instance(site.scope) or (0, None))[1] is held[1])):
            continue
        if f.canonical(site.scope, dotted(args[0].value)) == key:
            return site.stmt
        if f.canonical(site.scope, sharded_root(a, site)) == key:
            return next(s for s in reversed(a.stmt_parent[site.stmt]) if isinstance(s, cst.For))
    return None


def _shard_point(ctx: Context, model: Model):
    """(statement, "after" | "before" | "replace", compile Assign or None), or why not.

    The shard goes where DST101 wraps for DDP (after ``model.place``), except around a
    ``torch.compile`` of the model: FSDP shards the plain module and the compiled one calls it."""
    a = ctx.anatomy
    if model.assign_node is not None and model.value is not None and compiled_module(a.qualname, model.value) is not None:
        if model.place is not model.assign:
            return (
                "torch.compile(...) around the model's construction, moved to its device later: file not "
                "migrated; build and move the model first, then shard it and compile: fully_shard(model); "
                "model = torch.compile(model)"
            )
        return model.assign, "replace", model.assign_node
    level = a.stmt_parent.get(model.assign, ())
    for site in a.calls_to(COMPILE):
        if site.scope is not model.scope or not compiles_model(a.qualname, site.call, model.name):
            continue
        if assigned_name(site.stmt, site.call) != model.name:
            continue  # a compiled copy under another name: DST907 refuses it
        if not (a.is_before(model.assign, site.stmt) and (site.stmt is model.place or a.is_before(site.stmt, model.place) or model.place in a.stmt_parent.get(site.stmt, ()))):
            continue
        at = next((s for s in (*a.stmt_parent.get(site.stmt, ()), site.stmt) if a.stmt_parent.get(s, ()) == level), None)
        if at is None:
            return "torch.compile of the model at another level than its construction: file not migrated"
        small = site.stmt.body[0] if isinstance(site.stmt, cst.SimpleStatementLine) else None
        node = small if isinstance(small, cst.Assign) else None
        if at is not model.place and not (model.place in a.stmt_parent and a.is_before(model.place, at)):
            return (
                "the model moves to its device after torch.compile: file not migrated; move it first, "
                "then compile (distify shards it between the two)"
            )
        return at, "before", node
    return model.place, "after", None


def _list_made_before(ctx: Context, model: Model, point: cst.CSTNode, where: str):
    """The statement binding the list the optimizer is built over (`params = [p for p in
    model.parameters() if p.requires_grad]`) when it runs before the shard point, else None."""
    a = ctx.anatomy
    opt = model.optimizer  # its construction (one a function of the script builds is in that function's scope)
    p = arg(opt.call.call, 0, "params")
    if p is None or not isinstance(p.value, cst.Name):
        return None
    b = a.facts.reaching_binding(opt.call.scope, p.value.value, opt.call.stmt)
    if b is None or opt.call.scope is not model.scope:
        return None
    if b.stmt is point and where == "after":
        return b.stmt
    return b.stmt if a.is_before(b.stmt, point) else None


def _move_optimizer(ctx: Context, model: Model, point: cst.CSTNode, where: str):
    """The optimizer (and the schedulers built from it) re-written after the shard when it is built
    before it; [] when it already follows; a reason (str) when moving it is not safe."""
    a = ctx.anatomy
    opt = model.optimizer.site  # `optimizer = model.configure_optimizers(...)` moves, not the method's return
    stmt = opt.call.stmt
    if opt.call.scope is not model.scope or not a.is_before(stmt, point) or (where == "before" and stmt is point):
        return []
    # where == "before" (nanoGPT: optimizer, then `if compile: model = torch.compile(model)`): the shard goes
    # before the compile and the optimizer after it; the compiled module holds the sharded parameters
    if opt.target is None or a.stmt_parent.get(stmt, ()) != a.stmt_parent.get(point, ()):
        return "its construction is not a plain `optimizer = ...` line next to where the model is sharded"
    between = [
        s for s in a.facts.statements(model.scope)
        if a.is_before(stmt, s) and not a.is_before(point, s) and s is not point
        and a.stmt_parent.get(s, ()) == a.stmt_parent.get(stmt, ())
    ]
    moved: List[cst.CSTNode] = [stmt]
    carried = {opt.target}
    rest = []
    for s in between:
        value = _scheduler_of(ctx, s, carried)
        if value is not None:
            moved.append(s)
            carried.add(value)
        else:
            rest.append(s)
    model_root = model.name
    read: Set[str] = set()
    for m in moved:
        read |= {n.value for n, how in names(m) if how == "load"}
    for s in rest + [point]:
        mentioned = _dotted_mentions(s)
        used = sorted(carried & mentioned)
        if used:
            return f"{used[0]} is used between its construction and the point where the model is sharded"
        if s is point:
            continue
        bound = {name for name, _, _ in stmt_bindings(s)} - {model_root.split(".")[0]}
        clash = sorted(bound & read)
        if clash:
            return f"{clash[0]}, which its construction reads, is rebound before the model is sharded"
    ctx.report(
        "DST121",
        opt.call.call,
        f"{opt.target} (and the schedulers built from it) built after fully_shard: an optimizer built "
        "before sharding holds the old tensors and would update nothing",
    )
    return moved


def _scheduler_of(ctx: Context, stmt: cst.CSTNode, carried: Set[str]) -> Optional[str]:
    """`name` when `stmt` is `name = <torch.optim.lr_scheduler.X>(<a carried optimizer>, ...)`."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return None
    small = stmt.body[0]
    if len(small.targets) != 1 or not isinstance(small.value, cst.Call):
        return None
    q = ctx.anatomy.qualname(small.value.func) or ""
    target = dotted(small.targets[0].target)
    if not q.startswith(SCHEDULER_PREFIX) or target is None:
        return None
    if any(dotted(x.value) in carried for x in small.value.args):
        return target
    return None


def _dotted_mentions(stmt: cst.CSTNode) -> Set[str]:
    out: Set[str] = set()
    for n in all_nodes(stmt):
        if isinstance(n, (cst.Name, cst.Attribute)):
            d = dotted(n)
            if d:
                out.add(d)
    return out


RULE = FullyShard()
