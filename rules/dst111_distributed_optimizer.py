"""DST111 hvd.DistributedOptimizer."""

from __future__ import annotations

import libcst as cst

from distify.rules.base import HOROVOD_BACKEND, Context, Rule, method_calls_in, note_batch_norm
from distify.gradients import reads_gradients
from distify.parallel import wrapped_where_built
from distify.syntax import all_nodes, dotted, path_to
from distify.pickled import saved_whole
from distify.transplant import readable_after, spell_in


class DistributedOptimizer(Rule):
    """Average every optimizer's gradients across ranks (Horovod).

    What it does:
        After each optimizer is built, adds
        ``optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())``
        with the model whose parameters it optimises (several models: names prefixed with the
        model's, as Horovod needs them unique across optimizers). An optimizer whose gradients can
        come from several backward passes per step – a GAN, where the discriminator's step follows a
        backward on the real and one on the fake batch, and the generator's loss runs through the
        discriminator after its step – is left unwrapped instead: one
        ``hvd.grouped_allreduce_(..., op=hvd.Average)`` of its gradients goes right after the last
        ``backward()`` before its ``step()``. That applies to every optimizer stepped in a loop that
        calls ``backward()`` more than once per iteration (or in an inner loop), and to several
        optimizers stepped in functions that do not show the loop. A ``step(closure)`` is refused
        with its line, there and everywhere else (LBFGS): the closure recomputes the gradients
        inside the step, where neither the wrapper's hooks nor an all-reduce before the step can
        average them.

    Why:
        Horovod averages gradients inside the wrapped optimizer: hooks start each gradient's
        all-reduce as soon as backward produces it and ``step()`` waits for them. Without averaging
        every rank follows its own gradients and the models drift apart. The parameter names make
        Horovod's timeline and error messages readable. The hooks count backward passes per
        parameter (``backward_passes_per_step``), and which passes reach which model is data flow
        distify does not trace: in a GAN the generator's backward also fires the discriminator's
        hooks after its step, so no fixed count is right on every iteration and Horovod stops with
        "Gradients were computed more than backward_passes_per_step times". Averaging once, after
        all of an update's backward passes and before anything (clipping, the step) reads the
        gradients, is exact whatever reached them, equals what DDP computes, and leaves the script's
        own ``zero_grad`` calls in charge; it only gives up overlapping the all-reduce with backward.

    Example:
        optimizer = optim.SGD(model.parameters(), lr=0.1)

        becomes

        optimizer = optim.SGD(model.parameters(), lr=0.1)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

        and in a GAN loop

        errD_fake.backward()
        optimizerD.step()

        becomes

        errD_fake.backward()
        hvd.grouped_allreduce_([p.grad for g in optimizerD.param_groups for p in g["params"] if p.grad is not None], op=hvd.Average)
        optimizerD.step()
    """

    code = "DST111"
    name = "distributed-optimizer"
    backends = frozenset({HOROVOD_BACKEND})
    summary = "average gradients: hvd.DistributedOptimizer, or one all-reduce before a GAN step"

    def apply(self, ctx: Context) -> None:
        wrapped = ctx.plan.hvd_optimizers
        averaged = ctx.plan.hvd_averaged
        anchors = ctx.plan.hvd_anchor
        # an optimizer a function of the script builds and hands back is wrapped where the script
        # obtains it (`optimizer = model.configure_optimizers(...)`: distify.obtained)
        optimizers = [
            o for o in (o.site for o in ctx.anatomy.optimizers)
            if o.target is not None and not _already_wrapped(ctx, o) and not _already_averaged(ctx, o)
        ]
        backwards = _backward_sites(ctx)
        in_place, refusal = _unnamed(ctx, backwards)
        if refusal is not None:
            ctx.block(self.code, *refusal)
            return
        explicit = {}
        for opt in optimizers:
            reason = _several_passes(ctx, opt, backwards, len(ctx.anatomy.optimizers))
            if reason is None:
                continue
            steps = _step_sites(ctx, opt)
            closure = next((s for s in steps if _has_closure(ctx, s, opt)), None)
            if closure is not None:
                ctx.block(
                    self.code,
                    closure.call,
                    f"{opt.target}.step(closure) cannot be averaged before its step ({reason}): the closure recomputes "
                    "the gradients inside step(); file not migrated to Horovod (use --backend ddp)",
                )
                return
            explicit[opt] = (reason, steps)
        for opt in optimizers:
            closure = None if opt in explicit else next((s for s in _step_sites(ctx, opt) if _has_closure(ctx, s, opt)), None)
            if closure is not None:
                ctx.block(
                    self.code,
                    closure.call,
                    f"{opt.target}.step(closure) runs the closure's backward() inside step(), after the point where "
                    "hvd.DistributedOptimizer waits for the averaged gradients (LBFGS even calls it several times, "
                    "with a loss each rank computes alone): the update would use this rank's gradients and Horovod "
                    "stops at the next zero_grad(); file not migrated to Horovod",
                )
                return
        counts = {}
        for opt in optimizers:
            if opt in explicit:
                continue
            anchor = _wrap_anchor(ctx, opt)
            found = _accumulation_steps(ctx, opt)
            if found is None:
                counts[opt] = (anchor, None)
                continue
            n, where = found
            spelled = spell_in(ctx.anatomy, n, where, ctx.anatomy.stmt_scope.get(anchor))
            if spelled is not None:
                anchor = _after_assignments(ctx, anchor, _code(spelled))
            if spelled is None or not readable_after(ctx.anatomy, spelled, anchor):
                # the count is not readable where the optimizer is wrapped (a local of the training
                # function): averaging once before each step is exact for any count
                reason = f"its accumulation count `{ctx.code(n)}` has no value where {opt.target} is built"
                explicit[opt] = (reason, _step_sites(ctx, opt))
                continue
            counts[opt] = (anchor, _code(spelled))
        hooked = [o for o in optimizers if o not in explicit]
        if self._pickled_whole(ctx, hooked):
            return
        for opt in in_place:
            self._wrap_in_place(ctx, opt, len(hooked) + len(in_place))
            anchors[opt] = opt.call.stmt
            wrapped.append(opt)
        for opt, (reason, steps) in explicit.items():
            self._average_before_step(ctx, opt, reason, steps)
            averaged.append(opt)
        for opt in hooked:
            hvd = ctx.hvd
            extra, notes = "", []
            extra += _named_parameters(opt, len(hooked) + len(in_place))
            anchor, accumulation = counts[opt]
            if accumulation is None:
                unsure = _unrecognised_step_condition(ctx, opt)
                if unsure is not None:
                    ctx.warn(
                        self.code, unsure,
                        f"{opt.target}.step() runs only when `{ctx.code(unsure.test)}`, after a backward() outside that "
                        "condition: if it ever skips a step, Horovod raises \"Gradients were computed more than "
                        "backward_passes_per_step times\"; to accumulate over N backward passes, pass "
                        "backward_passes_per_step=N to hvd.DistributedOptimizer",
                    )
            if accumulation is not None:
                extra += f", backward_passes_per_step={accumulation}"
                notes.append(f"# gradient accumulation: all-reduce once every {accumulation} backward passes")
            if ctx.options.fp16_allreduce:
                extra += f", compression={hvd}.Compression.fp16"
                notes.append("# distify --fp16-allreduce: gradients are all-reduced in float16 (half the bytes)")
            if ctx.options.adasum:
                extra += f", op={hvd}.Adasum"
                notes.append("# distify --adasum: Adasum combines gradients instead of averaging them")
            line = f"{opt.target} = {hvd}.DistributedOptimizer({opt.target}{extra})"
            ctx.edits.insert_after(anchor, ctx.stmts("\n".join([*notes, line])))
            anchors[opt] = anchor
            _drop_set_to_none(ctx, opt)
            wrapped.append(opt)
            ctx.report(self.code, opt.call.call, f"{opt.target} averages gradients across ranks (hvd.DistributedOptimizer)")
            self._note_batch_norm(ctx, opt)

    def _wrap_in_place(self, ctx: Context, opt, n_wrapped: int) -> None:
        """`Schedule(optim.Adam(...), ...)` -> `Schedule(hvd.DistributedOptimizer(optim.Adam(...), ...), ...)`:
        an optimizer with no name of its own is wrapped where it is built."""
        hvd = ctx.hvd
        extra = _named_parameters(opt, n_wrapped)
        if ctx.options.fp16_allreduce:
            extra += f", compression={hvd}.Compression.fp16"
        if ctx.options.adasum:
            extra += f", op={hvd}.Adasum"

        def wrap(node, template=f"{hvd}.DistributedOptimizer(_{extra})"):
            outer = cst.parse_expression(template)
            return outer.with_changes(args=[outer.args[0].with_changes(value=node), *outer.args[1:]])

        ctx.edits.replace(opt.call.call, wrap)
        ctx.report(
            self.code, opt.call.call,
            "the optimizer built here averages gradients across ranks (hvd.DistributedOptimizer, wrapped where it "
            "is built: it has no name of its own)",
        )
        self._note_batch_norm(ctx, opt)

    def _pickled_whole(self, ctx: Context, hooked) -> bool:
        """A checkpoint that pickles a hooked optimizer whole (``torch.save({'optimizer': opt}, path)``,
        also through a dict saved by name or a helper, ``distify.pickled``): the class
        hvd.DistributedOptimizer makes cannot be pickled, so the first save would raise PicklingError
        after a whole epoch of training. Saving its state_dict() instead would change what the file
        holds for the code that loads it, so the file is refused, with the line, before any run."""
        a = ctx.anatomy
        names = {(id(o.call.scope), o.target): o for o in hooked}
        if not names:
            return False
        for site, expr, key in saved_whole(a, names, ctx.plan.script_path, ctx.options):
            opt = names[key]
            if a.is_before(_wrap_anchor(ctx, opt), site.stmt):
                ctx.block(
                    self.code, expr,
                    f"torch.save() pickles the optimizer {opt.target} whole, and the class hvd.DistributedOptimizer "
                    "makes of it cannot be pickled (PicklingError at the first save); file not migrated to "
                    f"Horovod. Save {opt.target}.state_dict() and restore it with load_state_dict(), or migrate "
                    "with --backend ddp",
                )
                return True
        return False

    def _note_batch_norm(self, ctx: Context, opt) -> None:
        """The BatchNorm note for the models `opt` steps, once it averages their gradients."""
        for m in (m for m in ctx.anatomy.models if m.optimizer.site is opt):
            note_batch_norm(ctx, self.code, m.name, m.value,
                            "and keeps running statistics of its own (rank 0's are saved)",
                            f"use {ctx.hvd}.SyncBatchNorm layers")

    def _average_before_step(self, ctx: Context, opt, reason: str, steps) -> None:
        """One grouped all-reduce of `opt`'s gradients after the last backward() before each step."""
        hvd = ctx.hvd
        grads = f'[p.grad for g in {opt.target}.param_groups for p in g["params"] if p.grad is not None]'
        lines = [
            f"# several backward passes may reach {opt.target}'s gradients: average them across ranks once, before its step",
            f"{hvd}.grouped_allreduce_({grads}, op={hvd}.Average)",
        ]
        done = set()
        for step in steps:
            after, before = _average_anchor(ctx, step)
            key = id(after if after is not None else before)
            if key in done:
                continue
            done.add(key)
            if after is not None:
                ctx.edits.insert_after(after, ctx.stmts("\n".join(lines)))
            else:
                ctx.edits.insert_before(before, ctx.stmts("\n".join(lines)))
        for flag, name in ((ctx.options.fp16_allreduce, "--fp16-allreduce"), (ctx.options.adasum, "--adasum")):
            if flag:
                ctx.warn(self.code, opt.call.call, f"{name} does not apply to {opt.target}: its gradients are averaged by hvd.grouped_allreduce_")
        ctx.report(
            self.code,
            opt.call.call,
            f"{opt.target}: {reason}; its gradients are all-reduced before each step (not hvd.DistributedOptimizer, "
            "whose hooks count backward passes)",
        )


def _named_parameters(opt, n_wrapped: int) -> str:
    """The `named_parameters=` argument of the wrap: the model's names, prefixed with the model's
    own when several DistributedOptimizers must keep them unique."""
    if len(opt.models) != 1:
        return ""
    m = opt.models[0]
    if n_wrapped == 1:
        return f", named_parameters={m}.named_parameters()"
    prefix = m.split(".")[-1]
    return f', named_parameters=[("{prefix}." + n, p) for n, p in {m}.named_parameters()]'


# where an optimizer with no name may sit to be wrapped where it is built: handed on as a value,
# evaluated once, exactly where it stands
_PASSING = (cst.Call, cst.Arg, cst.List, cst.Tuple, cst.Element, cst.Dict, cst.DictElement)


def _unnamed(ctx: Context, backwards):
    """The optimizers built inside an expression (`Schedule(optim.Adam(...), ...)`, an argument of
    a call) that can be wrapped where they are built, and the refusal for one that cannot:
    ([optimizers], None) or ([], (node, message)).

    Such an optimizer is stepped through code distify does not see by name (the scheduling class's
    own `self._optimizer.step()`), so what the named path checks between backward() and each step
    is checked on every function that calls backward(): nothing there may read the gradients
    before Horovod has averaged them (clipping would read half-reduced values)."""
    a = ctx.anatomy
    out = []
    for opt in (o.site for o in a.optimizers):
        if opt.target is not None or wrapped_where_built(a, opt.call):
            continue
        path = path_to(opt.call.stmt, opt.call.call)
        where = None
        if (
            path is None
            or not isinstance(opt.call.stmt, cst.SimpleStatementLine)
            or not isinstance(path[1], (cst.Assign, cst.AnnAssign, cst.Expr))
        ):
            where = "in a statement distify cannot add the parameter broadcast after (a return, a header)"
        elif not all(isinstance(n, _PASSING) for n in path[2:-1]):
            where = "inside an expression that may not build it exactly once (a lambda, a condition, a comprehension)"
        if where is None:
            for b in backwards:
                body = b.scope.body if isinstance(b.scope, cst.FunctionDef) else b.scope
                read = reads_gradients(a, body, b.scope)
                if read is not None:
                    where = (
                        f"and stepped through code distify does not follow, while line {a.position(read)[0]} reads "
                        "the gradients, which Horovod may still be averaging there"
                    )
                    break
        if where is not None:
            return [], (opt.call.call, f"this optimizer has no name of its own and is built {where}: bind it to a "
                        "name first (opt = ...), then run distify again; file not migrated to Horovod")
        out.append(opt)
    return out, None


def _wrap_anchor(ctx: Context, opt):
    """The statement the wrap goes after: the optimizer's, or its model's move to the device when
    that comes later (DST908)."""
    anchor = opt.call.stmt
    for m in ctx.anatomy.models:
        if m.optimizer.site is opt and ctx.anatomy.is_before(anchor, m.place):
            anchor = m.place  # the model reaches its device after the optimizer (DST908)
    return anchor


def _code(expr) -> str:
    return cst.Module([]).code_for_node(expr)


def _already_wrapped(ctx: Context, opt) -> bool:
    """`opt = hvd.DistributedOptimizer(opt, ...)` exists already (distify's earlier output)."""
    return any(
        site.qualname == "horovod.torch.DistributedOptimizer"
        and site.call.args
        and ctx.code(site.call.args[0].value) == opt.target
        for site in ctx.anatomy.calls
    )


def _after_assignments(ctx: Context, anchor, expr_src: str):
    """The optimizer's statement, or a later one at its level that assigns a name `expr_src` uses
    (`accum_steps = args.accum_steps` after the optimizer): the wrap must see the value."""
    a = ctx.anatomy
    names = set(expr_src.replace(".", " ").split())
    level = a.stmt_parent.get(anchor, ())
    for stmt, scope in a.stmt_scope.items():
        if scope is not a.stmt_scope.get(anchor) or a.stmt_parent.get(stmt, ()) != level:
            continue
        if not isinstance(stmt, cst.SimpleStatementLine) or not a.is_before(anchor, stmt):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and any(ctx.code(t.target) in names for t in small.targets):
                anchor = stmt
    return anchor


def _drop_set_to_none(ctx: Context, opt) -> None:
    """Horovod's DistributedOptimizer.zero_grad() takes no arguments: set_to_none=True is the
    default of torch >= 2.0 anyway, so the argument can go."""
    for site in ctx.anatomy.calls:
        func = site.call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "zero_grad" and ctx.code(func.value) == opt.target):
            continue
        arg_ = next((x for x in site.call.args if x.keyword is not None and x.keyword.value == "set_to_none"), None)
        if arg_ is None:
            continue
        if isinstance(arg_.value, cst.Name) and arg_.value.value == "True":
            ctx.edits.replace(site.call, lambda n: n.with_changes(args=[]))
        else:
            ctx.warn("DST111", site.call, "hvd.DistributedOptimizer.zero_grad() takes no set_to_none argument: call p.grad = None yourself")


def _already_averaged(ctx: Context, opt) -> bool:
    """`hvd.grouped_allreduce_([... opt.param_groups ...])` exists already (distify's earlier output)."""
    return any(
        site.qualname == "horovod.torch.grouped_allreduce_"
        and site.call.args
        and any(
            isinstance(n, cst.Attribute) and n.attr.value == "param_groups" and dotted(n.value) == opt.target
            for n in all_nodes(site.call.args[0].value)
        )
        for site in ctx.anatomy.calls
    )


def _backward_sites(ctx: Context) -> list:
    """`loss.backward()` / `torch.autograd.backward(loss)` calls."""
    return [
        s for s in ctx.anatomy.calls
        if (isinstance(s.call.func, cst.Attribute) and s.call.func.attr.value == "backward" and s.qualname is None)
        or s.qualname == "torch.autograd.backward"
    ]


def _step_sites(ctx: Context, opt) -> list:
    """`opt.step(...)` and `scaler.step(opt)` calls."""
    a = ctx.anatomy
    out = []
    for site in a.calls:
        func = site.call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step" and a.qualname(func) is None):
            continue
        if ctx.code(func.value) == opt.target or any(
            x.keyword is None and ctx.code(x.value) == opt.target for x in site.call.args
        ):
            out.append(site)
    return out


def _has_closure(ctx: Context, site, opt) -> bool:
    """`opt.step(closure)`: the step runs backward itself."""
    func = site.call.func
    return isinstance(func, cst.Attribute) and ctx.code(func.value) == opt.target and bool(site.call.args)


def _loops(parents) -> list:
    return [p for p in parents if isinstance(p, (cst.For, cst.While))]


def _several_passes(ctx: Context, opt, backwards, n_optimizers: int):
    """Why `opt` may step on gradients from more than one backward pass (None: one pass per step).

    Several backward() calls in a loop around the step (or in its function, when no loop is in
    sight), a backward() in an inner loop the step is not in, or – several optimizers – a step in a
    function that shows no loop while the script calls backward() more than once.
    """
    steps = _step_sites(ctx, opt)
    for step in steps:
        around = _loops(step.parents)
        regions = [(loop, [b for b in backwards if b.scope is step.scope and loop in b.parents]) for loop in around]
        if not around:
            regions = [(None, [b for b in backwards if b.scope is step.scope])]
        for loop, inside in regions:
            # counted in the source, so that a closure or helper defined in the loop counts too
            if (method_calls_in(loop.body, "backward") if loop is not None else len(inside)) > 1:
                where = "per iteration" if loop is not None else "before a step"
                return f"several backward() calls {where}"
            for b in inside:
                inner = [l for l in _loops(b.parents) if l not in step.parents]
                if inner:
                    return "backward() runs in an inner loop"
        if not around and n_optimizers > 1 and len(backwards) > 1:
            return "several optimizers and backward() calls, and the loop is not in sight"
    return None


def _average_anchor(ctx: Context, step):
    """(statement to insert after, statement to insert before): after the last statement of the
    step's block that runs backward(), else right before the step."""
    a = ctx.anatomy
    level = a.stmt_parent.get(step.stmt, ())
    scope = a.stmt_scope.get(step.stmt)
    last = None
    for b in _backward_sites(ctx):
        if b.scope is not step.scope:
            continue
        chain = (*b.parents, b.stmt)
        sibling = next((s for s in chain if a.stmt_parent.get(s, ()) == level and a.stmt_scope.get(s) is scope), None)
        if sibling is None or sibling is step.stmt or not a.is_before(sibling, step.stmt):
            continue
        if last is None or a.is_before(last, sibling):
            last = sibling
    return (last, None) if last is not None else (None, step.stmt)


def _conditional_steps(ctx: Context, opt):
    """(step call site, the `if` statements between it and its enclosing `for`, innermost first)
    for each `opt.step()` / `scaler.step(opt)` of the optimizer."""
    a = ctx.anatomy
    for site in a.calls:
        func = site.call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step" and a.qualname(func) is None):
            continue
        # optimizer.step() or scaler.step(optimizer)
        stepped = ctx.code(func.value) == opt.target or any(
            a_.keyword is None and ctx.code(a_.value) == opt.target for a_ in site.call.args
        )
        if opt.target is None or not stepped:
            continue
        ifs, loop = [], None
        for p in reversed(a.stmt_parent.get(site.stmt, ())):
            if isinstance(p, cst.For):
                loop = p
                break
            if isinstance(p, cst.If):
                ifs.append(p)
        yield site, ifs, loop


def _unrecognised_step_condition(ctx: Context, opt):
    """The `if` a step of `opt` runs under, inside a loop whose body calls backward() outside that
    `if`, when it is not the accumulation idiom ``Facts.step_condition`` knows: distify cannot
    tell whether it accumulates, and Horovod raises on a second backward() without a step."""
    for _site, ifs, loop in _conditional_steps(ctx, opt):
        if loop is None or not ifs or not method_calls_in(loop.body, "backward"):
            continue
        outer = ifs[-1]
        if not method_calls_in(outer, "backward") and not ctx.anatomy.facts.rank_condition(outer.test):
            return outer
    return None


def _accumulation_steps(ctx: Context, opt):
    """(N, the `if` that reads it) for `if (i + 1) % N == 0: optimizer.step()` – the
    gradient-accumulation idiom, in each of the spellings ``Facts.step_condition`` knows
    (`... or i + 1 == len(loader)`, `if last:`). N is read in the step's scope, which need not be
    the optimizer's."""
    for _site, ifs, _loop in _conditional_steps(ctx, opt):
        for p in ifs:
            found = ctx.anatomy.facts.step_condition(p.test, p)
            if found is not None:
                return found[1], p
    return None


RULE = DistributedOptimizer()
