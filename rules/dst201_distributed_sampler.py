"""DST201 DistributedSampler for training DataLoaders."""

from __future__ import annotations

import libcst as cst

from distify.data_sources import foreign_loaders, is_iterable_dataset
from distify import loader_switch
from distify.records import Loader
from distify.syntax import arg, dotted, all_nodes
from distify.rules.base import HOROVOD_BACKEND, Context, Rule, add_kwarg, loader_stem
from distify.rules.eval_plan import eval_plans, shard_eval_enabled


class DistributedSamplerRule(Rule):
    """Give every training DataLoader a ``DistributedSampler``.

    What it does:
        Builds ``DistributedSampler(dataset, shuffle=...)`` next to each DataLoader that feeds a
        training loop and passes it as ``sampler=``. The loader's ``shuffle=`` moves into the
        sampler (a DataLoader may not get both); a loader without ``shuffle`` gets a sampler with
        ``shuffle=False``, because the sampler shuffles by default. Loaders that already have a
        ``sampler``/``batch_sampler`` are left alone (see DST901). Evaluation loaders that DST203
        cannot shard are left whole, so every rank evaluates the full set; an info line says why.
        A loader built in a helper is judged by how the callers use what the helper returns
        (``train_loader, val_loader = get_loaders(args)``, ``loader = make_loader(ds)``); when one helper builds both the training and the evaluation
        loader (``make_loader(train_ds)``, ``make_loader(val_ds)``) it is left alone, with a warning,
        since a sampler there would shard evaluation as well. A loader built by a function of
        another module (``from utils import get_training_dataloader``), which distify does not
        rewrite, is re-sharded where the script binds it: ``loader = runtime.shard_loader(loader)``
        rebuilds it over the same dataset with a ``DistributedSampler`` (every other argument kept,
        shuffling when it shuffled; it refuses at run time what a sampler cannot split, such as
        a custom sampler or an ``IterableDataset``), and DST202 gives it ``set_epoch``. When that
        module sits next to the script, distify reads it: the report names the ``def`` and its
        line; a loader given a ``DistributedSampler`` there only gets ``set_epoch``; one given its
        own ``sampler=``/``batch_sampler=`` is left with a warning saying what to change there.
        A factory of the project with its own switch (``sampler = DistributedSampler(ds) if
        distributed else None``, ``distributed`` a parameter) is not rebuilt around: its training
        calls that pass a constant false pass ``True`` instead (ddp, fsdp: the process group exists
        in every run) and ``set_epoch`` goes on the sampler it returns; evaluation calls keep theirs.

    Why:
        Without it every process iterates the whole dataset: N ranks do the same work N times and
        the effective batch is not N times larger. The sampler gives each rank a disjoint
        1/N shard of every epoch.

    Example:
        train_loader = DataLoader(train_ds, batch_size=64, shuffle=True)

        becomes

        train_sampler = DistributedSampler(train_ds, shuffle=True)
        train_loader = DataLoader(train_ds, batch_size=64, sampler=train_sampler)
    """

    code = "DST201"
    name = "distributed-sampler"
    summary = "shard training DataLoaders with DistributedSampler"

    def apply(self, ctx: Context) -> None:
        samplers = ctx.plan.samplers
        resharded, switched = self._foreign(ctx, samplers)
        plans = eval_plans(ctx)
        sharding = shard_eval_enabled(ctx)
        for loader in ctx.anatomy.loaders:
            plan = plans.get(loader) if loader.role == "eval" else None
            if plan is not None and not (plan.shard and sharding):
                why = plan.reason or "DST203 (shard-eval) is not selected"
                ctx.report(
                    self.code,
                    loader.call.call,
                    f"{loader.target or 'evaluation DataLoader'} left whole: {why}; every rank evaluates the "
                    "full set, so reported metrics equal the single-process ones",
                    kind="info",
                )
            if loader.role == "shared" and id(loader.call.scope) in resharded:
                how = ("the training calls set its own distributed switch" if id(loader.call.scope) in switched
                       else "the training ones are re-sharded where they are bound")
                ctx.report(
                    self.code, loader.call.call,
                    f"{loader.call.scope.name.value}() builds the loaders of training and of evaluation "
                    f"({', '.join(loader.bound)}): {how}, the others left whole",
                    kind="info",
                )
            elif loader.role == "shared":
                fn = loader.call.scope.name.value if isinstance(loader.call.scope, cst.FunctionDef) else "a helper"
                ctx.warn(
                    self.code,
                    loader.call.call,
                    f"{fn}() builds the loaders of training and of evaluation ({', '.join(loader.bound)}): "
                    "not sharded; give the training loader sampler=DistributedSampler(dataset) and call "
                    "<loader>.sampler.set_epoch(epoch) each epoch",
                )
            if loader.role != "train":
                continue
            if loader.family is not None:
                self._family(ctx, loader, samplers)
                continue
            call = loader.call.call
            existing = ctx.anatomy.sampler_call(loader)
            if existing is not None:
                self._adapt(ctx, loader, existing, samplers)
                continue
            if self._switch_callers(ctx, loader, samplers):
                continue
            if arg(call, 5, "sampler") is not None or arg(call, 6, "batch_sampler") is not None:
                continue  # DST901
            if loader.dataset is None or is_iterable_dataset(ctx.anatomy, loader):
                continue  # DST906 / DST910
            if loader.param is not None and not _once_per_statement(loader.call.stmt, call):
                ctx.warn(
                    self.code, call,
                    f"the DataLoader built in place for {loader.param} feeds the training loop, but it is built "
                    "where a sampler cannot be named before it (a loop condition, a lambda, a comprehension, "
                    "a conditional expression): not sharded; bind it to a name first, with "
                    "sampler=DistributedSampler(dataset), and call the sampler's set_epoch(epoch) each epoch",
                )
                continue
            positional = [x for x in call.args if x.keyword is None and not x.star]
            splats = [x for x in call.args if x.star == "**"]
            if len(positional) > 3 or len(splats) > 1 or any(x.star == "*" for x in call.args):
                continue  # DST906
            shuffle_arg = arg(call, 2, "shuffle")
            if shuffle_arg is not None:
                shuffle_src = ctx.code(shuffle_arg.value)
            elif splats:
                shuffle_src = f'{ctx.code(splats[0].value)}.pop("shuffle", False)'
            else:
                shuffle_src = "False"

            cls = ctx.imported("torch.utils.data.distributed", "DistributedSampler", "DistributedSampler")
            extra = ""
            if ctx.backend == HOROVOD_BACKEND:
                extra = f", num_replicas={ctx.hvd}.size(), rank={ctx.hvd}.rank()"

            ds_src = ctx.code(loader.dataset)
            stmt = loader.call.stmt
            hoist = None
            if dotted(loader.dataset) is None:
                # a dataset built inline must exist once: name it before the sampler uses it
                hoist = ctx.fresh(loader_stem(loader.target) + "_dataset" if loader.target else "train_dataset")
                ds_node = loader.dataset
                ctx.edits.replace(ds_node, lambda n, h=hoist: cst.Name(h))
                ctx.edits.insert_before(stmt, ctx.stmts(f"{hoist} = {ds_src}"))
                ds_src = hoist

            sampler_expr = f"{cls}({ds_src}{extra}, shuffle={shuffle_src})"
            if loader.target is not None and _is_assignment(stmt, call):
                sname = _sampler_name(ctx, loader.target)
                ctx.edits.insert_before(stmt, ctx.stmts(f"{sname} = {sampler_expr}"))
                value = cst.parse_expression(sname)
                samplers[loader] = sname
            elif loader.param is not None:
                # built in place as an argument: a named sampler just before the statement, so that
                # DST202 can give it the epoch (a loader built afresh every epoch gets a fresh sampler)
                sname = ctx.fresh(f"{loader_stem(loader.param)}_sampler")
                ctx.edits.insert_before(stmt, ctx.stmts(f"{sname} = {sampler_expr}"))
                value = cst.parse_expression(sname)
                samplers[loader] = sname
            else:
                value = cst.parse_expression(sampler_expr)
                samplers[loader] = None  # reached through `<loader>.sampler`

            def rewrite(node: cst.Call, value=value, had_shuffle=shuffle_arg is not None) -> cst.Call:
                if had_shuffle:
                    args = []
                    for i, x in enumerate(node.args):
                        if (x.keyword is not None and x.keyword.value == "shuffle") or (
                            x.keyword is None and not x.star and i == 2
                        ):
                            x = x.with_changes(
                                keyword=cst.Name("sampler"),
                                value=value,
                                equal=x.equal
                                if x.keyword is not None
                                else cst.AssignEqual(
                                    whitespace_before=cst.SimpleWhitespace(""),
                                    whitespace_after=cst.SimpleWhitespace(""),
                                ),
                            )
                        args.append(x)
                    return node.with_changes(args=args)
                return add_kwarg(node, "sampler", value)

            ctx.edits.replace(call, rewrite)
            moved = " (shuffle moved into the sampler)" if shuffle_arg is not None else ""
            label = loader.target or (" / ".join(loader.bound) + " (returned by a helper)" if loader.bound else (
                f"the DataLoader built in place for {loader.param}" if loader.param else "DataLoader"))
            ctx.report(self.code, call, f"{label} now shards its dataset with DistributedSampler{moved}")


    def _foreign(self, ctx: Context, samplers) -> None:
        """Training data built by a function of another module (`from utils import
        get_training_dataloader`): distify cannot rewrite that DataLoader, so it re-shards it where
        the script binds it, `loader = runtime.shard_loader(loader)`; DST202 then gives its sampler
        the epoch. Where the value is not bound by a plain assignment: say where, and what to add.
        The same for a factory of this file whose loader one call hands to training and another to
        evaluation (``shared_factory``). Returns the ids of such factories re-sharded at every
        training call, and of those whose own distributed switch a training call sets."""
        done, local, failed = set(), set(), set()
        for f in foreign_loaders(ctx.anatomy):
            fn = ctx.anatomy.functions.named(f.builder)
            local |= {id(fn)} if fn is not None else set()
            if not self._reshard(ctx, f, samplers, done, fn) and fn is not None:
                failed.add(id(fn))
        return local - failed, {k[1] for k in done if k[0] == "switch"}

    def _reshard(self, ctx: Context, f, samplers, done: set, here) -> bool:
        """One foreign loader re-sharded where it is bound (False: it could not be); `here`: the
        factory of this file that builds it, if it is one."""
        key = (id(f.call.call), f.name)
        if f.resharded or key in done:
            return True
        done.add(key)
        from distify.program import loader_subclass  # here: most files never ask

        sub = loader_subclass(ctx.anatomy, ctx.plan.script_path, ctx.options, f.call)
        if sub is not None and not sub.shards_itself:
            ctx.block(
                self.code, f.call.call,
                f"{f.name} feeds the training loop and is a {sub.name} ({sub.where}), a subclass of {sub.base} "
                f"defined in this project: distify cannot give it a DistributedSampler from here "
                f"(runtime.shard_loader rebuilds only a plain DataLoader): not migrated; in its __init__, pass "
                f"sampler=DistributedSampler(dataset, shuffle=...) to the loader it builds, and call "
                f"{f.name}.sampler.set_epoch(epoch) each epoch",
            )
            return False
        module, _, func = f.builder.rpartition(".")
        # the module next to the script, where distify can read it: name the def, see its sampler
        from distify.siblings import find_builder  # only for a loader built in another module

        b = find_builder(ctx.plan.script_path, f.builder) if here is None else None
        where = f"{func}() in {b.where}" if b else (f"{func}() of {module}" if module else f"{func}()")
        if b is not None and b.sampler in ("sampler", "batch_sampler"):
            ctx.warn(
                self.code, f.call.call,
                f"{f.name} feeds the training loop but {where} builds it with its own {b.sampler}=, which "
                f"distify cannot translate: every rank would read all of it. Make that {b.sampler} yield "
                f"this rank's part (by rank and world size) or use "
                f"sampler=DistributedSampler(dataset) there, and call its set_epoch(epoch) each epoch",
            )
            return False
        sw = self._switch_of(ctx, here, f.call.call) if here is not None else None
        reshard = not (b is not None and b.sampler == "distributed") and sw is None
        stmt = f.binding
        small = stmt.body[0] if stmt is not None and len(stmt.body) == 1 else None
        bound = isinstance(small, cst.AnnAssign) or (isinstance(small, cst.Assign) and len(small.targets) == 1)
        bound = bound and small.value is f.call.call
        sname = _returned_sampler(small, sw) if bound and sw is not None else None
        if sw is not None:
            self._switch_on(ctx, sw, f.call, f.name)
            done.add(("switch", id(here)))
        if reshard and not bound:
            ctx.warn(
                self.code, f.call.call,
                f"{f.name} feeds the training loop but is built by {where} in another module, which distify "
                f"does not rewrite: every rank would read all of it. Bind it to a name and pass it through "
                f"{ctx.runtime}.shard_loader({f.name}), or in {module or 'that module'} build its DataLoader with "
                f"sampler=DistributedSampler(dataset, shuffle=...) instead of shuffle=; call "
                f"{f.name}.sampler.set_epoch(epoch) at the start of each epoch",
            )
            return False
        lines = []
        if reshard:
            extra = f", num_replicas={ctx.hvd}.size(), rank={ctx.hvd}.rank()" if ctx.backend == HOROVOD_BACKEND else ""
            lines.append(f"{f.name} = {ctx.runtime}.shard_loader({f.name}{extra})")
        inside = [ep for ep in f.epochs if ep.loop in ctx.anatomy.stmt_parent.get(stmt, ()) and ep.var] if bound else []
        if inside and not _calls_set_epoch_after(ctx, stmt, f.name, sname):
            # built afresh every epoch: the new sampler gets the epoch right away
            lines.append(f"{sname or f.name + '.sampler'}.set_epoch({inside[-1].var})")
        elif not inside:
            pseudo = Loader(call=f.call, target=f.name, dataset=None, role="train", batch_loops=[f.loop])
            samplers[pseudo] = sname  # the sampler the factory returns, else reached through `<loader>.sampler`
            ctx.plan.foreign_epoch_loops[pseudo] = f.epochs
            if not f.epochs:
                ctx.warn(
                    "DST903", f.call.call,
                    f"{f.name}: no loop over epochs found: if it shuffles, call "
                    f"{f.name}.sampler.set_epoch(epoch) at the start of each pass",
                )
        if lines:
            ctx.edits.insert_after(stmt, ctx.stmts("\n".join(lines)))
        if sw is not None:
            pass  # said by _switch_on
        elif reshard:
            why = "which also builds evaluation loaders" if here is not None else "another module, not rewritten"
            said = (f"{f.name} is built by {where} ({why}): re-sharded here with "
                    f"{ctx.runtime}.shard_loader, a DataLoader over the same dataset with a DistributedSampler")
            if sub is not None and ctx.anatomy.classes.named(f.builder) is not None:
                said = (f"{f.name} is a {sub.name} ({sub.where}), a subclass of {sub.base} whose __init__ gives it a "
                        f"DistributedSampler: passed through {ctx.runtime}.shard_loader, which keeps such a loader as it is")
            ctx.report(self.code, f.call.call, said)
        else:
            ctx.report(
                self.code, f.call.call,
                f"{f.name} is built by {where} with a DistributedSampler already: left as it is",
                kind="info",
            )
        return True

    def _switch_of(self, ctx: Context, here, call: cst.Call):
        """The switch of the factory `here` (a function of the view) when `call` sets it to a
        constant (see distify.loader_switch); None otherwise, and under Horovod, whose ranks have
        no torch.distributed group for the factory's DistributedSampler to ask (re-sharded instead)."""
        if ctx.backend == HOROVOD_BACKEND:
            return None
        for loader in ctx.anatomy.loaders:
            sw = loader_switch.switch(ctx.anatomy, loader) if loader.call.scope is here else None
            if sw is not None and loader_switch.setting(ctx.anatomy, sw, call) is not None:
                return sw
        return None

    def _switch_callers(self, ctx: Context, loader, samplers) -> bool:
        """A training loader built by a factory with its own switch (its sampler a DistributedSampler
        only when a parameter is true) and called only with constants for it: every call passes
        True; DST202 gives the sampler the epoch through the loader. False (DST901 refuses) when a
        call passes anything else."""
        a = ctx.anatomy
        sw = loader_switch.switch(a, loader) if ctx.backend != HOROVOD_BACKEND else None  # see _switch_of
        sites = a.callers(sw.fn) if sw is not None else []
        if not sites or any(loader_switch.setting(a, sw, c.call) is None for c in sites):
            return False
        eps = a.epoch_loops.get(loader, [])
        named = []  # (call, the loader's name there, the sampler's name there, its epoch loops)
        for c in sites:
            self._switch_on(ctx, sw, c, ", ".join(loader.bound) or "the loader")
            small = c.stmt.body[0] if isinstance(c.stmt, cst.SimpleStatementLine) and len(c.stmt.body) == 1 else None
            sname = _returned_sampler(small, sw) if isinstance(small, cst.Assign) and small.value is c.call else None
            names = [dotted(e.value) for e in getattr(small.targets[0].target, "elements", [])] if sname else []
            lname = next((n for n in names if n in loader.bound), None)
            named.append((c, lname, sname, [ep for ep in eps if lname and ep.loader_ref == lname]))
        if eps and all(mine for *_, mine in named):
            for c, lname, sname, mine in named:  # set_epoch on the sampler each call binds
                pseudo = Loader(call=c, target=lname, dataset=None, role="train", batch_loops=loader.batch_loops)
                samplers[pseudo] = sname
                ctx.plan.foreign_epoch_loops[pseudo] = mine
        else:
            samplers[loader] = None  # reached through `<loader>.sampler` where the callers bind it
        ctx.plan.switched.append(loader)
        return True

    def _switch_on(self, ctx: Context, sw, site, what: str) -> None:
        """The call `site` of the factory passes True for its switch (a constant false there now:
        distify's setup makes a process group in every run, one process included)."""
        if loader_switch.setting(ctx.anatomy, sw, site.call) != loader_switch.OFF:
            return
        given = loader_switch.passed(ctx.anatomy, sw, site.call)
        if given is not None:
            ctx.edits.replace(given.value, lambda n: cst.Name("True"))
        else:
            ctx.edits.replace(site.call, lambda n, p=sw.param: add_kwarg(n, p, cst.Name("True")))
        ctx.report(
            self.code, site.call,
            f"{what}: {sw.fn.name.value}() gives its loader a DistributedSampler when `{sw.param}` is true; "
            f"passed True here (the process group exists in every run, also with one process)",
        )

    def _family(self, ctx: Context, loader, samplers) -> None:
        """`loaders = {x: DataLoader(ds[x], shuffle=True) for x in ["train", "val"]}` with one training
        key: a DistributedSampler for that key's dataset, built before the dict; the other keys keep
        their loader as it was (evaluated whole on every rank)."""
        call = loader.call.call
        keys, var = loader.train_keys, loader.key_var
        label = f"{loader.family} (built for {', '.join(repr(k) for k in loader.keys)})"
        if len(keys) != 1 or len(keys) == len(loader.keys):
            ctx.warn(
                self.code, call,
                f"{label}: the loaders of {', '.join(map(repr, keys))} all train; not sharded: build each training "
                "loader with sampler=DistributedSampler(dataset) and call its set_epoch(epoch) each epoch",
            )
            return
        if loader.dataset is None or arg(call, 5, "sampler") is not None or arg(call, 6, "batch_sampler") is not None:
            ctx.warn(self.code, call, f"{label}: not sharded (no dataset argument, or a sampler already)")
            return
        if any(x.star for x in call.args) or len([x for x in call.args if x.keyword is None]) > 2:
            ctx.warn(self.code, call, f"{label}: not sharded (shuffle passed by position or arguments unpacked)")
            return
        key = keys[0]
        quoted = '"' + key + '"'
        dataset = _substitute(loader.dataset, var, cst.SimpleString(quoted))
        cls = ctx.imported("torch.utils.data.distributed", "DistributedSampler", "DistributedSampler")
        extra = f", num_replicas={ctx.hvd}.size(), rank={ctx.hvd}.rank()" if ctx.backend == HOROVOD_BACKEND else ""
        shuffle_arg = arg(call, None, "shuffle")
        shuffle_src = ctx.code(shuffle_arg.value) if shuffle_arg is not None else "False"
        sname = ctx.fresh(f"{key}_sampler" if key.isidentifier() else "train_sampler")
        stmt = loader.call.stmt
        ctx.edits.insert_before(stmt, ctx.stmts(f"{sname} = {cls}({ctx.code(dataset)}{extra}, shuffle={shuffle_src})"))
        is_true = shuffle_arg is not None and isinstance(shuffle_arg.value, cst.Name) and shuffle_arg.value.value == "True"
        others = f"{var} != {quoted}"
        new_shuffle = None
        if shuffle_arg is not None:
            new_shuffle = cst.parse_expression(others if is_true else f"({shuffle_src}) and {others}")
        sampler_value = cst.parse_expression(f"{sname} if {var} == {quoted} else None")

        def rewrite(node: cst.Call, new_shuffle=new_shuffle, sampler_value=sampler_value) -> cst.Call:
            if new_shuffle is not None:
                node = node.with_changes(
                    args=[
                        x.with_changes(value=new_shuffle) if x.keyword is not None and x.keyword.value == "shuffle" else x
                        for x in node.args
                    ]
                )
            return add_kwarg(node, "sampler", sampler_value)

        ctx.edits.replace(call, rewrite)
        samplers[loader] = sname
        ctx.report(
            self.code, call,
            f"{loader.family}[{quoted}] now shards its dataset with DistributedSampler; "
            f"{', '.join(repr(k) for k in loader.keys if k != key)} left whole (evaluated on every rank)",
        )

    def _adapt(self, ctx: Context, loader, sampler: cst.Call, samplers) -> None:
        """A DistributedSampler is already there: give it what the backend needs, reuse it."""
        a = arg(loader.call.call, 5, "sampler")
        samplers[loader] = dotted(a.value) if a is not None else None
        if ctx.backend != HOROVOD_BACKEND or arg(sampler, 1, "num_replicas") is not None:
            return
        hvd = ctx.hvd
        ctx.edits.replace(
            sampler,
            lambda n, hvd=hvd: add_kwarg(
                add_kwarg(n, "num_replicas", cst.parse_expression(f"{hvd}.size()")),
                "rank",
                cst.parse_expression(f"{hvd}.rank()"),
            ),
        )
        ctx.report(self.code, sampler, "DistributedSampler shards by Horovod rank and size")


def _substitute(expr: cst.BaseExpression, name: str, value: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` with every Name `name` replaced by `value` (image_datasets[x] -> image_datasets["train"])."""

    class T(cst.CSTTransformer):
        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            return value if updated.value == name else updated

        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
            return updated.with_changes(attr=original.attr)  # `ds.x` keeps its attribute name

        def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
            return updated.with_changes(keyword=original.keyword)

    return expr.visit(T())


def _calls_set_epoch_after(ctx: Context, stmt, name: str, sampler=None) -> bool:
    """The block holding `stmt` already calls `<name>.sampler.set_epoch(...)` (or `sampler`'s: an
    earlier run's, or the script's own)."""
    parents = ctx.anatomy.stmt_parent.get(stmt, ())
    block = parents[-1] if parents else ctx.anatomy.module
    wanted = {f"{name}.sampler.set_epoch", f"{sampler}.set_epoch"}
    return any(isinstance(n, cst.Call) and dotted(n.func) in wanted for n in all_nodes(block))


_DEFERRED = (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp, cst.IfExp, cst.BooleanOperation)


def _once_per_statement(stmt: cst.CSTNode, node: cst.CSTNode) -> bool:
    """`node` is evaluated exactly once each time `stmt` runs, with only the names bound before
    `stmt` (not in a loop condition, a lambda, a comprehension or a branch of a conditional
    expression): a statement inserted before `stmt` can build what it needs."""
    if isinstance(stmt, cst.While):
        return False
    head = stmt
    if isinstance(stmt, cst.For):
        head = stmt.iter
    elif isinstance(stmt, cst.If):
        head = stmt.test
    elif isinstance(stmt, cst.With):
        head = cst.List(elements=[cst.Element(value=i.item) for i in stmt.items])
    elif not isinstance(stmt, cst.SimpleStatementLine):
        return False
    path = _path_to(head, node)
    return path is not None and not any(isinstance(n, _DEFERRED) for n in path)


def _path_to(root: cst.CSTNode, node: cst.CSTNode):
    """The nodes from `root` down to `node` (excluded), None when `node` is not below `root`."""
    if root is node:
        return []
    for child in root.children:
        below = _path_to(child, node)
        if below is not None:
            return [root, *below]
    return None


def _returned_sampler(small, sw) -> "str | None":
    """The name the binding gives the sampler the factory returns beside its loader
    (``self.train_loader, self.train_sampler = get_data_loader(...)``), if it gives it one."""
    t = small.targets[0].target if isinstance(small, cst.Assign) else None
    if sw.sampler_item is None or not isinstance(t, (cst.Tuple, cst.List)) or len(t.elements) != sw.size:
        return None
    return dotted(t.elements[sw.sampler_item].value)


def _is_assignment(stmt: cst.CSTNode, call: cst.Call) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Assign)
        and stmt.body[0].value is call
    )


def _sampler_name(ctx: Context, target: str) -> str:
    prefix = target.rsplit(".", 1)[0] + "." if "." in target else ""
    last = target.split(".")[-1]
    stem = loader_stem(target)
    base = f"{stem}_sampler" if stem != last else f"{last}_sampler"
    if prefix:
        return prefix + base  # attributes of self: no clash with local names
    return ctx.fresh(base)


RULE = DistributedSamplerRule()
