"""DST307 sharded state leaves and enters the process as a full state dict (FSDP)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

import libcst as cst

from distify.model_build import COMPILE
from distify.records import LOAD, SAVE, assigned_name
from distify.syntax import dotted, held_name
from distify.edits import Put
from distify.rules.base import FSDP_BACKEND, Context, Rule, kwarg_value, reaching_scopes
from distify.facts import optimizer_keeps_tensors
from distify.early_stop import per_rank_branches
from distify.walk import walk

DCP_STATE = "torch.distributed.checkpoint.state_dict"
# writes that take the state out of the process (the first argument is what is written)
WRITES = SAVE | {"safetensors.torch.save_file"}


class FullStateDict(Rule):
    """Save and load the full state of a sharded model and its optimizer (FSDP).

    What it does:
        Where the state of a model ``fully_shard`` shards (or of its optimizer) is written out –
        ``torch.save(model.state_dict(), path)``, inside a dict literal
        (``{"model": model.state_dict(), "optimizer": optimizer.state_dict()}``), through a name
        that is saved later, or through a helper of the script that saves its argument – the
        state comes from ``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
        cpu_offload=True))`` (``get_optimizer_state_dict(model, optimizer, options=...)``), bound
        to a name before the statement that writes it: every rank computes it, only the write is
        under DST301's rank-0 guard. For a name the script binds to ``torch.compile(...)`` the
        gathered keys get back the ``_orig_mod.`` prefix ``get_model_state_dict`` drops, when the
        model is compiled at run time, so the checkpoint keeps the original's keys. ``model.load_state_dict(...)`` / ``optimizer.load_state_dict(...)``
        of a checkpoint (``torch.load``) after sharding become ``set_model_state_dict`` /
        ``set_optimizer_state_dict`` with ``StateDictOptions(full_state_dict=True)`` (every rank
        reads the file, each takes its own shard; no broadcast of rank 0's copy); an optimizer that
        keeps no tensor per parameter (SGD without momentum) has nothing to shard and loads with
        ``StateDictOptions()`` (torch's full-state path fails on it: "Expected device to be set");
        that ``torch.load`` maps onto the CPU (DST306). A load before
        sharding, and in-memory copies (``best = copy.deepcopy(model.state_dict())`` ...
        ``model.load_state_dict(best)``) stay as they are.

    Why:
        After ``fully_shard`` every parameter is a DTensor holding one rank's shard:
        ``model.state_dict()`` is a dict of shards, and a file saved from it does not load into the
        single-GPU model. ``get_model_state_dict`` gathers the full tensors (a collective: every
        rank must call it, rank 0 receives them, on the CPU, with the original keys). A plain
        ``load_state_dict`` of full tensors into a sharded model fails ("mixed torch.Tensor and
        DTensor"); ``set_model_state_dict`` cuts each rank's shard out of the full tensors. The
        optimizer state is saved keyed by parameter names (torch's distributed layout), not by the
        positions a plain ``optimizer.state_dict()`` uses; a plain ``optimizer.load_state_dict`` of
        the original script still loads it (it matches parameters by position). The other way
        round, a position-keyed state (saved by the single-GPU script) given to
        ``set_optimizer_state_dict`` is silently dropped – the optimizer starts afresh – so the load
        re-keys it by name first (``FullyShardedDataParallel.rekey_optim_state_dict``, which
        passes a name-keyed state through).

    Example:
        torch.save({"model": model.state_dict(), "epoch": epoch}, path)

        becomes

        model_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if runtime.is_main_process():
            torch.save({"model": model_state, "epoch": epoch}, path)
    """

    code = "DST307"
    name = "full-state-dict"
    backends = frozenset({FSDP_BACKEND})
    summary = "save and load the full state of a sharded model (get/set_model_state_dict)"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        sharded = ctx.plan.sharded()
        if not sharded:
            return
        model_names: Dict[Tuple[int, str], Tuple] = {}  # (scope id, name) -> (after, model)
        optim_names: Dict[Tuple[int, str], Tuple] = {}
        for model, anchor in sharded:
            for key, (after, _) in reaching_scopes(ctx, model, anchor).items():
                model_names.setdefault(key, (after, model))
            if a.flow_from is not None and not model.name.endswith(".module"):
                # `return model.module` (DataParallel's, which DST902 drops under FSDP): the
                # caller's name for it holds the sharded model itself
                for scope, name in a.flow_from(model.scope, model.name + ".module"):
                    model_names.setdefault((id(scope), name), (None, model))
            opt = model.optimizer
            if opt is not None and opt.target:
                pseudo = SimpleNamespace(name=opt.target, scope=opt.call.scope, cls=opt.call.cls)
                for key, (after, _) in reaching_scopes(ctx, pseudo, opt.call.stmt).items():
                    optim_names.setdefault(key, (None, model))
        savers = _saving_functions(ctx)
        cpu_loads = ctx.plan.cpu_loads
        decided: set = set()  # ids of the per-rank branches that now take rank 0's decision
        for site in a.calls:
            func = site.call.func
            if not isinstance(func, cst.Attribute) or func.attr.value not in ("state_dict", "load_state_dict"):
                continue
            recv = held_name(func.value)  # `trainer.get_model().state_dict()` too
            if recv is None:
                continue
            if recv.endswith(".module") and (id(site.scope), recv[: -len(".module")]) in model_names:
                recv = recv[: -len(".module")]  # DataParallel's .module, which DST902 drops under FSDP
            key = (id(site.scope), recv)
            kind = "model" if key in model_names else "optimizer" if key in optim_names else None
            if kind is None:
                self._submodule(ctx, site, recv, model_names, savers)
                continue
            after, model = (model_names if kind == "model" else optim_names)[key]
            if after is not None and not a.is_before(after, site.stmt):
                continue  # before sharding: the plain module
            model_ref = recv if kind == "model" else _model_in_scope(a, model_names, site.scope, model)
            if func.attr.value == "state_dict":
                if site.call.args:
                    continue
                self._save(ctx, site, kind, recv, model_ref, savers, decided)
            else:
                self._load(ctx, site, kind, recv, model_ref, cpu_loads, model)

    # saves ----------------------------------------------------------------------------------
    def _save(self, ctx: Context, site, kind, recv, model_ref, savers, decided: set) -> None:
        a = ctx.anatomy
        how = _leaves(ctx, site, savers)
        if how is None:
            return
        if model_ref is None:
            ctx.warn(
                self.code,
                site.call,
                f"{recv}.state_dict() of a sharded model's optimizer is saved where the model has no name: "
                "it holds this rank's shards only; save get_optimizer_state_dict(model, optimizer, ...) instead",
            )
            return
        opts = f"{ctx.imported(DCP_STATE, 'StateDictOptions', 'StateDictOptions')}(full_state_dict=True, cpu_offload=True)"
        if kind == "model":
            fn = ctx.imported(DCP_STATE, "get_model_state_dict", "get_model_state_dict")
            expr = f"{fn}({recv}, options={opts})"
        else:
            fn = ctx.imported(DCP_STATE, "get_optimizer_state_dict", "get_optimizer_state_dict")
            expr = f"{fn}({model_ref}, {recv}, options={opts})"
        self._one_decision(ctx, site, decided)
        if how == "in place":
            if kind == "model" and _compiled(a, recv):
                # as below: the original's dict held the compiled module's keys (`_orig_mod.`)
                expr = (f'{{"_orig_mod." + k: v for k, v in {expr}.items()}} '
                        f'if hasattr({recv}, "_orig_mod") else {expr}')
            ctx.edits.replace(site.call, lambda n, e=expr: cst.parse_expression(e))
            ctx.report(self.code, site.call, f"{recv}'s full state gathered on every rank ({fn}): it is saved later")
            return
        # the statement writes it (and is rank 0's only): gather into a name before it, on every rank
        stmt = site.stmt
        guards = a.rank_guards(stmt)
        anchor = guards[0][0] if guards else stmt
        name = ctx.fresh(f"{recv.split('.')[-1].removesuffix('()')}_state")  # `get_model()`: get_model_state
        lines = f"{name} = {expr}"
        if kind == "model" and _compiled(a, recv):
            # get_model_state_dict names a compiled module's parameters without `_orig_mod.`; the
            # original saved them with it
            lines += (
                f'\n{name} = {{"_orig_mod." + k: v for k, v in {name}.items()}} '
                f'if hasattr({recv}, "_orig_mod") else {name}'
            )
        ctx.edits.insert_before(anchor, ctx.stmts(lines))
        ctx.edits.replace(site.call, lambda n, name=name: cst.Name(name))
        ctx.report(
            self.code,
            site.call,
            f"{recv}'s full state gathered on every rank into {name} ({fn} is a collective); only the write is rank 0's",
        )

    def _one_decision(self, ctx: Context, site, decided: set) -> None:
        """The gather is a collective: under an ``if`` whose test each rank computes from its own
        batches (``if losses["val"] < best_val_loss:``) some ranks would gather and the others not,
        and the job hangs. Every rank takes rank 0's decision (``runtime.broadcast_object``): rank 0
        saves exactly when it would alone, the others join its gather."""
        for branch in per_rank_branches(ctx.anatomy, site.stmt):
            if id(branch) in decided:
                continue
            decided.add(id(branch))
            # bool(): the branch reads the test's truth; a device tensor is not what to pickle across
            decide = cst.parse_expression(f"{ctx.runtime}.broadcast_object(bool(_))")
            ctx.edits.replace(branch.test, lambda n, d=decide: d.with_changes(
                args=[d.args[0].with_changes(value=d.args[0].value.with_changes(
                    args=[d.args[0].value.args[0].with_changes(value=n)]))]))
            ctx.report(
                self.code, branch,
                "this test reads a value each rank computes from its own data and its branch gathers the full "
                "state (a collective): every rank takes rank 0's decision (runtime.broadcast_object), so none "
                "waits in a gather the others skipped",
            )

    def _submodule(self, ctx: Context, site, recv, model_names, savers) -> None:
        """`torch.save(model.encoder.state_dict(), path)`: a part of a sharded model, saved."""
        if site.call.func.attr.value != "state_dict" or site.call.args:
            return
        parts = recv.split(".")
        for i in range(len(parts) - 1, 0, -1):
            found = model_names.get((id(site.scope), ".".join(parts[:i])))
            if found is None:
                continue
            after, _ = found
            if (after is None or ctx.anatomy.is_before(after, site.stmt)) and _leaves(ctx, site, savers):
                ctx.warn(
                    self.code,
                    site.call,
                    f"{recv}.state_dict() of a part of a sharded model is saved: it holds this rank's DTensor shards; "
                    f"gather the model's full state (get_model_state_dict({'.'.join(parts[:i])}, options=...)) and "
                    f"keep the keys that start with '{'.'.join(parts[i:])}.'",
                )
            return

    # loads ----------------------------------------------------------------------------------
    def _load(self, ctx: Context, site, kind, recv, model_ref, cpu_loads, model) -> None:
        call = site.call
        if not call.args or call.args[0].keyword is not None or call.args[0].star:
            return
        loads = _checkpoint_loads(ctx, site, call.args[0].value)
        if not loads:
            return  # an in-memory copy of the sharded model's own state: it round-trips as it is
        if model_ref is None:
            ctx.warn(
                self.code,
                call,
                f"{recv}.load_state_dict of a checkpoint where the sharded model has no name: "
                "use set_optimizer_state_dict(model, optimizer, state, options=...)",
            )
            return
        extra = []
        strict = kwarg_value(call, "strict")
        if strict is not None:
            extra.append(f", strict={ctx.code(strict)}")
        if any(x.keyword is not None and x.keyword.value not in ("strict", "state_dict") for x in call.args):
            return
        # every rank has just read the whole file itself: full_state_dict=True lets each take its
        # own shard of it (broadcast_from_rank0 would send rank 0's full tensors to every rank
        # again, N bytes to each where the shards are N/world)
        full = "full_state_dict=True"
        if kind == "optimizer":
            opt = model.optimizer
            keeps = optimizer_keeps_tensors(opt.call.qualname, opt.call.call) if opt is not None else None
            if keeps is False:
                # torch's full-state load of an optimizer state finds its device from the state's
                # tensors and fails ("Expected device to be set") when it has none, as SGD without
                # momentum: there is nothing to shard, the state loads as it is
                full = ""
            elif keeps is None and opt is not None and opt.call.qualname == "torch.optim.SGD":
                ctx.warn(
                    self.code,
                    call,
                    f"{recv}'s state is loaded with set_optimizer_state_dict(full_state_dict=True), which fails "
                    "(\"Expected device to be set\", torch 2.13) for an optimizer that keeps no tensor per "
                    "parameter (SGD without momentum); if yours is one, drop full_state_dict=True there",
                )
        inner = ", ".join(x for x in (full, "".join(extra)[2:]) if x)
        opts = f"{ctx.imported(DCP_STATE, 'StateDictOptions', 'StateDictOptions')}({inner})"
        if kind == "model":
            fn = ctx.imported(DCP_STATE, "set_model_state_dict", "set_model_state_dict")
            head = f"{fn}({recv}, _, options={opts})"
        else:
            fn = ctx.imported(DCP_STATE, "set_optimizer_state_dict", "set_optimizer_state_dict")
            # a state saved by the single-GPU script is keyed by parameter position; given one,
            # set_optimizer_state_dict silently starts the optimizer afresh: re-key it by name first
            # (a state saved by get_optimizer_state_dict is keyed by name already and passes through)
            fsdp = ctx.imported("torch.distributed.fsdp", "FullyShardedDataParallel", "FullyShardedDataParallel")
            key_type = ctx.imported("torch.distributed.fsdp", "OptimStateKeyType", "OptimStateKeyType")
            head = (
                f"{fn}({model_ref}, {recv}, {fsdp}.rekey_optim_state_dict(_, {key_type}.PARAM_NAME, {model_ref}, "
                f"optim={recv}), options={opts})"
            )
        template = cst.parse_expression(head)

        def rewrite(n: cst.Call, template=template) -> cst.Call:

            return template.visit(Put(n.args[0].value))

        ctx.edits.replace(call, rewrite)
        cpu_loads.extend(loads)
        ctx.report(
            self.code,
            call,
            f"checkpoint loaded into the sharded {kind} with {fn} (rank 0's full tensors, sharded onto every rank)",
        )


def _model_in_scope(a, model_names, scope, model) -> Optional[str]:
    """The name `scope` holds `model` under: the function's own (a parameter it is handed, a name it
    binds: ``load_checkpoint(path, net, opt)``'s `net`) before a global it also sees, which may be
    another object where the function is called with another model."""
    names = [name for (scope_id, name), (_, m) in model_names.items() if scope_id == id(scope) and m is model]
    if isinstance(scope, cst.FunctionDef):
        own = [n for n in names if n.split(".")[0] in a.facts.params(scope) or a.facts.local_to(scope, n.split(".")[0])]
        if own:
            return own[0]
    return names[0] if names else None


def _inside(node: cst.CSTNode, root: cst.CSTNode) -> bool:
    found = []

    class V(cst.CSTVisitor):
        def on_visit(self, n) -> bool:
            if n is node:
                found.append(n)
            return not found

    walk(root, V())
    return bool(found)


def _saving_functions(ctx: Context) -> Dict[cst.FunctionDef, List[str]]:
    """Functions of the script that write one of their parameters out (``def save_checkpoint(state,
    path): torch.save(state, path)``): function -> the parameters written."""
    a = ctx.anatomy
    out: Dict[cst.FunctionDef, List[str]] = {}
    for site in a.calls_to(WRITES):
        fn = site.scope
        if not isinstance(fn, cst.FunctionDef) or not site.call.args:
            continue
        params = [p.name.value for p in fn.params.params]
        written = _root(site.call.args[0].value)
        if written in params:
            out.setdefault(fn, []).append(written)
    return out


def _root(expr: cst.BaseExpression) -> Optional[str]:
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    return expr.value if isinstance(expr, cst.Name) else None


def _writes_here(ctx: Context, site, savers) -> List[cst.Call]:
    """The calls of `site`'s statement that write their first argument out."""
    a = ctx.anatomy
    out = []
    for c in a.calls:
        if c.stmt is not site.stmt or not c.call.args:
            continue
        if c.qualname in WRITES:
            out.append(c.call)
        elif a.callee(c.call, c.scope) in savers:
            out.append(c.call)
    return out


def _compiled(a, recv: str) -> bool:
    """`recv = torch.compile(...)` somewhere in the script: the name may hold a compiled module."""
    return any(assigned_name(c.stmt, c.call) == recv for c in a.calls_to(COMPILE))


def _leaves(ctx: Context, site, savers) -> Optional[str]:
    """How the state read at `site` leaves the process: "hoist" when its own statement writes it,
    "in place" when it is bound to a name a later statement of the scope writes; None otherwise."""
    a = ctx.anatomy
    for call in _writes_here(ctx, site, savers):
        if any(_inside(site.call, x) for x in call.args):
            return "hoist"
    stmt = site.stmt
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
    elif isinstance(small, cst.AnnAssign) and small.value is not None:
        target = small.target
    else:
        return None
    name = _root(target)
    if name is None or a.in_rank_guard(stmt):
        return None
    later = [c for c in a.calls if c.scope is site.scope and a.is_before(stmt, c.stmt)]
    written = False
    for c in later:
        if not c.call.args:
            continue
        if c.qualname in WRITES or a.callee(c.call, c.scope) in savers:
            if any(_root(x.value) == name for x in c.call.args):
                written = True
        func = c.call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "load_state_dict":
            if any(_root(x.value) == name for x in c.call.args):
                return None  # also loaded back in memory (best weights): the sharded dict round-trips
    return "in place" if written else None


def _checkpoint_loads(ctx: Context, site, value: cst.BaseExpression) -> List:
    """The torch.load calls the loaded state comes from: in the argument itself, or in the
    statement that bound its root name (``ckpt = torch.load(p)`` ... ``ckpt["model"]``)."""
    a = ctx.anatomy
    loads = [c for c in a.calls_to(LOAD) if c.stmt is site.stmt and _inside(c.call, value)]
    if loads:
        return loads
    name = _root(value)
    if name is None:
        return []
    bound = a.reaching_binding(site.scope, name, site.stmt)
    if bound is None:
        return []
    return [c for c in a.calls_to(LOAD) if c.stmt is bound.stmt and c.scope is site.scope]


RULE = FullStateDict()
