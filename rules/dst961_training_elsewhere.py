"""DST961 a file that builds what training needs but trains elsewhere: left unchanged, and said."""

from __future__ import annotations

from typing import List, Set, Tuple

import libcst as cst

from distify.anatomy import Anatomy
from distify.by_name import built_by_name, builds_optimizer_by_name, builds_scheduler_by_name
from distify.records import CallSite
from distify.syntax import dotted, all_nodes
from distify.library import known
from distify.names import qualified, star_import
from distify.rules.base import Context, Rule


class TrainingElsewhere(Rule):
    """Say where the training seems to run when a file that builds it has no training loop.

    What it does:
        When a file builds what training needs – a DataLoader, an optimizer – or calls
        ``backward()``, but distify finds no training loop in it (nothing it could migrate), the
        file is left as it is and distify says so without ``-v``: it names the call that hands the
        loader or optimizer to code distify does not read (a function or method of another module,
        ``simclr.train(train_loader)``, ``train_one_epoch(model, optimizer, loader)``), with its line.

    Why:
        A file left unchanged in silence reads as "nothing to do". Launched on N processes it
        trains N copies on the same data: every rank reads all of it and saves and prints. The
        loop that needs the sampler and the wrapper lives in the module named here.

        The same note names a call whose project function builds its object by name
        (``create_model(opt)`` importing its class with ``importlib``) when the script's loop calls
        that object's methods, and, in a module of helpers that only builds DataLoaders in its
        functions, the first of them. An optimizer built by name (a call handed ``torch.optim``)
        counts as an optimizer.

    Example:
        simclr = SimCLR(model=model, optimizer=optimizer)
        simclr.train(train_loader)    # DST961: no training loop in this file; training seems to run
                                      # in simclr.train() (another module): nothing was changed
    """

    code = "DST961"
    name = "training-elsewhere"
    summary = "left unchanged: the training loop is not in this file"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        if a.has_training:
            return
        backward = any(isinstance(c.call.func, cst.Attribute) and c.call.func.attr.value == "backward" for c in a.calls)
        optimizers = [c for c in a.calls if _builds_optimizer(c) or builds_optimizer_by_name(a, c)]
        if not optimizers and not backward:
            # a data or evaluation script, unless it hands a training function of the project to
            # code that runs it (hogwild's `mp.Process(target=train, args=(...))`), builds what trains by
            # name, or is a module of helpers that only builds loaders
            self._started_elsewhere(ctx) or self._trains_across(ctx, a) or self._by_name(ctx, a) \
                or self._builds_loaders(ctx, a)
            return
        loaders, built = _training_objects(a)
        # the call handed a loader first (`simclr.train(train_loader)`), else one handed an optimizer
        for site in sorted(a.calls, key=lambda c: not _hands_over(a, c, loaders)):
            if _hands_over(a, site, built):
                callee = dotted(site.call.func) or "a function"
                from distify.program import program_of, reached  # here: most files never ask

                there = reached(a, ctx.plan.script_path, ctx.options, site)
                if there.target is not None and program_of(a).trains(there.target):
                    _across_files(self.code, ctx, site, there.target)
                    return
                if there.outside is not None:
                    ctx.report(
                        self.code,
                        site.call,
                        f"left unchanged: no training loop in this file; training seems to run in {callee}(), in "
                        f"{there.outside}, outside this project (see [tool.distify] project-root and exclude): "
                        "distify never writes it; launched on N processes, every rank would train on all the data",
                        kind="note",
                    )
                    return
                run = _method_run(a, site, ctx) if there.target is not None and there.target.cls is not None else None
                if run is not None:  # `trainer = Trainer(...)` ... `trainer.train()`: name the method run
                    site, there = run
                    callee = dotted(site.call.func) or callee
                how = (f"{there.target.qualname} at {there.target.where}: code distify reads but cannot follow to a "
                       "training loop" if there.target is not None else "code distify does not read")
                ctx.report(
                    self.code,
                    site.call,
                    f"left unchanged: no training loop in this file; training seems to run in {callee}() "
                    f"({how}): launched on N processes, every rank would train on all the "
                    "data; migrate that module's loop (or run distify on it)",
                    kind="note",
                )
                return
        if self._started_elsewhere(ctx):
            return
        what = "an optimizer" if optimizers else "backward()"
        ctx.report(
            self.code,
            a.module.body[0] if a.module.body else a.module,
            f"left unchanged: this file uses {what} but distify found no training loop in it; nothing was changed",
            kind="note",
        )

    def _started_elsewhere(self, ctx: Context) -> bool:
        """Say so when a call hands a project function that trains to other code as a value
        (``Process(target=train)``, ``mp.spawn(train)``, ``pool.map(step, ...)``): the training
        runs there, started from this file, in a shape distify does not migrate."""
        from distify.program import handed_functions, program_of  # here: most files never ask

        a = ctx.anatomy
        for site in a.calls:
            for t in handed_functions(a, ctx.plan.script_path, ctx.options, site):
                if program_of(a).trains(t):
                    starter = dotted(site.call.func) or "a call"
                    ctx.report(
                        self.code,
                        site.call,
                        f"left unchanged: no training loop in this file; it hands {t.qualname}() ({t.where}), which "
                        f"trains, to {starter}(), which runs it: distify does not migrate training started this way; "
                        "launched on N processes, every rank would run that training on all the data",
                        kind="note",
                    )
                    return True
        return False

    def _trains_across(self, ctx: Context, a: Anatomy) -> bool:
        """No loader, optimizer or backward in the file, but a call of it runs a function or method of
        another module of the project that trains (``trainer = Trainer(model, dataset)`` then
        ``trainer.fit(epochs)``, the class building its own loader and optimizer): said as a warning,
        as when the file hands its loader over; the file is left as it is."""
        from distify.program import program_of, reached  # here: most files never ask

        prog = None
        for site in a.calls:
            there = reached(a, ctx.plan.script_path, ctx.options, site)
            if there.target is None:
                continue
            prog = prog or program_of(a)
            if prog.trains(there.target):
                _across_files(self.code, ctx, site, there.target)
                return True
        return False

    def _builds_loaders(self, ctx: Context, a: Anatomy) -> None:
        """A module of helpers (nothing of it runs when the file runs: every loader is built in a
        function, no call at module level runs one of its own) whose functions build DataLoaders
        that training elsewhere iterates: left as it is, and said."""
        if not a.loaders or any(isinstance(l.call.scope, cst.Module) for l in a.loaders):
            return
        own = set(a.functions) | set(a.classes)
        if any(isinstance(c.scope, cst.Module) and (dotted(c.call.func) or "").split(".")[0] in own for c in a.calls):
            return  # it runs its own builders: a script (evaluation, data preparation)
        first = a.loaders[0].call
        ctx.report(
            self.code,
            first.call,
            "left unchanged: this module only builds a DataLoader (in a function) and trains nothing itself: "
            "its loaders are sharded, or said to be unsharded, where the training script that uses them is "
            "migrated (run distify on that script)",
            kind="note",
        )

    def _by_name(self, ctx: Context, a: Anatomy) -> bool:
        """No loader, optimizer or backward in the file, but an object a project function builds by
        name (``create_model(opt)`` importing its class with importlib) is used in a loop: what
        trains is decided at run time, in code distify cannot follow."""
        for b in built_by_name(a, ctx.plan.script_path, ctx.options):
            used = ", ".join(f"{ctx.code(u.call.func)}() (line {a.position(u.call)[0]})" for u in b.uses[:3])
            ctx.report(
                self.code,
                b.site.call,
                f"left unchanged: no training loop distify can follow in this file: {dotted(b.site.call.func)}() "
                f"({b.where}) builds its object by name ({b.importer}) and the loop calls {used} on it; if that "
                "trains, launched on N processes every rank would train on all the data: distribute the class it "
                "builds by hand (or import it by its name)",
                kind="note",
            )
            return True
        return False


def _across_files(code: str, ctx: Context, site: CallSite, t) -> None:
    callee = dotted(site.call.func) or "a function"
    ctx.report(
        code,
        site.call,
        f"not migrated: training runs in {callee}() ({t.qualname} at {t.where}), another module of "
        "this project, and distify does not migrate a training loop across files yet: launched on "
        "N processes, every rank would train on all the data; move the loop into this file, or "
        "distribute that module by hand",
        kind="warning",
    )


def _method_run(a: Anatomy, site: CallSite, ctx: Context):
    """For a call building an instance of a project class (``trainer = Trainer(model, optimizer)``),
    the first later call of one of its methods on that instance in the same scope
    (``trainer.train()``, found through the class's bases) and where it lands; None without one."""
    from distify.program import reached

    for c in a.calls:
        f = c.call.func
        if c.scope is site.scope and isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) \
                and a.facts.instance_call(c.scope, f.value.value, c.stmt) is site.call:
            there = reached(a, ctx.plan.script_path, ctx.options, c)
            if there.target is not None:
                return c, there
    return None


def _training_objects(a: Anatomy) -> Tuple[Set[str], Set[str]]:
    """The names this file binds to a loader it builds, and those with the optimizers too."""
    loaders: Set[str] = set()
    for l in a.loaders:
        loaders.update(n for n in [l.target, *l.bound] if n)
    names = set(loaders)
    for c in a.calls:
        row = known(c.qualname)
        target = _assigned(c)
        if target and row is not None and row.kind == "loader":
            loaders.add(target)
        if target and (_builds_optimizer(c) or builds_optimizer_by_name(a, c) or target in loaders):
            names.add(target)
    return loaders, names


def _builds_optimizer(c: CallSite) -> bool:
    """A torch.optim optimizer class (not a scheduler or the base class)."""
    parts = (c.qualname or "").split(".")
    return len(parts) == 3 and parts[:2] == ["torch", "optim"] and parts[2][:1].isupper() and parts[2] != "Optimizer"


def _assigned(c: CallSite) -> str:
    stmt = c.stmt
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
        a = stmt.body[0]
        if a.value is c.call and len(a.targets) == 1:
            return dotted(a.targets[0].target) or ""
    return ""


def _hands_over(a: Anatomy, site: CallSite, built: Set[str]) -> bool:
    """`site` passes one of `built` to code of another module: neither a function or class of this
    file, nor torch, a builtin or a library object distify knows (a loader, a wrapper...)."""
    if not built or a.facts.callee(site.call, site.scope) is not None or builds_scheduler_by_name(a, site):
        return False
    func = dotted(site.call.func) or ""
    head = func.split(".")[0]
    if head in a.functions or head in a.classes or a.facts.instance_attr(site.scope, func) is not None:
        return False
    q = qualified(a.aliases, site.call.func, a.name_bindings) or star_import(a.star_modules, site.call.func, a.name_bindings) or ""
    if q.split(".")[0] in ("torch", "builtins", "distify") or known(q) is not None:
        return False
    passed: List[str] = [
        dotted(n) or "" for arg in site.call.args for n in all_nodes(arg.value) if isinstance(n, (cst.Name, cst.Attribute))
    ]
    return any(p in built for p in passed)


RULE = TrainingElsewhere()
