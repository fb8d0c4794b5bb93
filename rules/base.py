"""What a rule is, and the context it works in.

A rule reads the anatomy, records edits through the context and reports findings. It never touches
the tree itself; when it is unsure it edits nothing and reports a warning with a position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional

import libcst as cst

from distify.anatomy import Anatomy
from distify.records import COLLECTIVES, CallSite
from distify.syntax import arg, dotted
from distify.edits import EditSet, parse_stmts
from distify.syntax import all_nodes
from distify.model_build import batch_norm
from distify.model_state import last_within
from distify.instance_reach import attribute_reach, built_in_init, handed_in

from distify.findings import Finding  # import-light, so that a cached run can report without libcst
from distify.plan import Plan
from distify.syntax import call_statement  # noqa: F401 - the rules ask it here
from distify.options import BACKENDS, DDP_BACKEND, FSDP_BACKEND, HOROVOD_BACKEND, TORCH_BACKENDS, Options
from distify.walk import walk


class Context:
    """Everything a rule needs: the anatomy, the edit set, name allocation, the report."""

    def __init__(self, anatomy: Anatomy, options: Options) -> None:
        self.anatomy = anatomy
        self.options = options
        self.edits = EditSet()
        self.findings: List[Finding] = []
        self.plan = Plan()  # what the engine knows and the rules decided (distify.plan)
        self._collectives: Optional[List[CallSite]] = None
        self.blocked = False
        self._taken = set(anatomy.name_bindings)
        self._names: Dict[str, str] = {}
        self._templates: set = set()  # codes handed out by stmts()

    @property
    def backend(self) -> str:
        return self.options.backend

    # source helpers -------------------------------------------------------------------------
    def code(self, node: cst.CSTNode) -> str:
        return self.anatomy.module.code_for_node(node)

    def stmts(self, code: str) -> List[cst.CSTNode]:
        """Statements to insert; a template parsed for an earlier file is reused, but never twice
        in one file (facts keyed by node would confuse the two places)."""
        first = code not in self._templates
        self._templates.add(code)
        return parse_stmts(code, shared=first)

    # reporting ------------------------------------------------------------------------------
    def report(self, code: str, node: cst.CSTNode, message: str, kind: str = "fix") -> None:
        line, col = self.anatomy.position(node)
        self.findings.append(Finding(code, line, col, message, kind))

    def warn(self, code: str, node: cst.CSTNode, message: str) -> None:
        self.report(code, node, message, kind="warning")

    def comment_above(self, stmt: cst.CSTNode, text: str) -> None:
        """Put `# text` on its own line above a statement (kept with it if lines are inserted)."""
        line = cst.EmptyLine(comment=cst.Comment(f"# {text}"))
        self.edits.replace(stmt, lambda n, line=line: n.with_changes(leading_lines=[*n.leading_lines, line]))

    def block(self, code: str, node: cst.CSTNode, message: str) -> None:
        """Warn, and leave the whole file unchanged: a partial migration would train wrong."""
        self.warn(code, node, message)
        self.blocked = True

    # names and imports ----------------------------------------------------------------------
    def fresh(self, preferred: str) -> str:
        """A local name not bound anywhere in the module (and not handed out before)."""
        name, i = preferred, 2
        while name in self._taken:
            name, i = f"{preferred}_{i}", i + 1
        self._taken.add(name)
        return name

    def imported(self, module: str, name: Optional[str], preferred: str) -> str:
        """Local spelling of `module.name` (or of `module` when name is None), importing it once."""
        qualified = f"{module}.{name}" if name else module
        if qualified in self._names:
            return self._names[qualified]
        existing = self.anatomy.local_name_for(qualified)
        if existing is not None:
            self._names[qualified] = existing
            return existing
        local = preferred if self._bound_alike(preferred, qualified) else self.fresh(preferred)
        if name is None:
            line = f"import {module} as {local}" if local != module else f"import {module}"
        elif local == name:
            line = f"from {module} import {name}"
        else:
            line = f"from {module} import {name} as {local}"
        self.edits.add_import(line)
        self._names[qualified] = local
        return local

    def _bound_alike(self, local: str, qualified: str) -> bool:
        """In a project view, `local` is taken only by a helper module's import of this very object
        (``from torch.utils.data.distributed import DistributedSampler`` in utils.py) and the script
        binds it to nothing: the script may import it under the same name."""
        script = getattr(self.anatomy, "script_bindings", None)
        return script is not None and local not in script and self.anatomy.aliases.get(local) == qualified

    @property
    def runtime(self) -> str:
        """Local name of the runtime helpers: ``from distify import runtime``, or with --standalone
        the inline class that ``distify.standalone.finish`` writes once the rules are done."""
        if not self.options.standalone:
            return self.imported("distify", "runtime", "runtime")
        name = (
            self.plan.standalone_runtime
            or self.anatomy.standalone_runtime
            or self.anatomy.local_name_for("distify.runtime")  # turned standalone by finish()
        )
        if name is None:
            name = self.fresh("runtime")
        self._taken.add(name)
        self.plan.standalone_runtime = name
        return name

    @property
    def dist(self) -> str:
        return self.imported("torch.distributed", None, "dist")

    @property
    def hvd(self) -> str:
        return self.imported("horovod.torch", None, "hvd")

    @property
    def ddp(self) -> str:
        """The model wrapper: ``runtime.DDP`` (torch's DistributedDataParallel with peers, a
        pass-through in a one-process run)."""
        return f"{self.runtime}.DDP"

    @property
    def main_process(self) -> str:
        """Expression that is true on rank 0 only."""
        if self.backend == HOROVOD_BACKEND:
            return f"{self.hvd}.rank() == 0"
        return f"{self.runtime}.is_main_process()"

    def main_process_at(self, stmt: cst.CSTNode) -> str:
        """`main_process` for code at `stmt`. With Horovod, code that may run before ``hvd.init()``
        (the ``__main__`` block of a script whose ``main()`` initialises Horovod) cannot ask
        ``hvd.rank()`` ("Horovod has not been initialized"): it asks the runtime, which reads the
        launcher's environment until a process group or Horovod exists."""
        if self.backend == HOROVOD_BACKEND and self.before_setup(stmt):
            return f"{self.runtime}.is_main_process()"
        return self.main_process

    def before_setup(self, stmt: cst.CSTNode) -> bool:
        """True when `stmt` may run before the process group / Horovod is initialised: it is at
        module level while the initialisation is in a function, or above it at the same level."""
        a = self.anatomy
        init = self.plan.setup_anchor
        if init is None:
            sites = a.calls_to({"horovod.torch.init", "torch.distributed.init_process_group"})
            init = sites[0].stmt if sites else None
        if init is None:
            return False
        scope = a.stmt_scope.get(stmt)
        init_scope = a.stmt_scope.get(init)
        if not isinstance(scope, cst.Module):
            return False
        if isinstance(init_scope, cst.Module):
            return a.is_before(stmt, init)
        return True

    # tree helpers ---------------------------------------------------------------------------
    def in_rank_guard(self, stmt: cst.CSTNode) -> bool:
        """True when the statement already sits under an `if` that tests the rank (the anatomy's
        one notion of a rank condition, ``distify.rank.rank_dependent``)."""
        return self.anatomy.in_rank_guard(stmt)

    def enclosing_if(self, stmt: cst.CSTNode) -> Optional[cst.If]:
        parents = self.anatomy.stmt_parent.get(stmt, ())
        return parents[-1] if parents and isinstance(parents[-1], cst.If) else None

    def collectives_in(self, stmt: cst.CSTNode) -> List[CallSite]:
        """Collective calls (`dist.all_reduce`, `hvd.allreduce`, `runtime.reduce_mean`...) made by
        the statement itself, in its own scope (not in functions it defines)."""
        if self._collectives is None:
            self._collectives = self.anatomy.calls_to(COLLECTIVES)
        scope = self.anatomy.stmt_scope.get(stmt)
        return [
            c for c in self._collectives if c.scope is scope and (c.stmt is stmt or stmt in c.parents)
        ]

    def training_in(self, stmt: cst.CSTNode) -> Optional[cst.Call]:
        """A call in `stmt` (its own scope) of a function of this script that trains (directly or
        through a value it is handed: ``print(epoch, train(loader, model, opt))``)."""
        a = self.anatomy
        scope = a.stmt_scope.get(stmt)
        for site in a.calls:
            if site.scope is scope and (site.stmt is stmt or stmt in site.parents):
                callee = a.callee(site.call, scope)
                if callee is not None and a.trains(callee):
                    return site.call
        return None

    def gains_collective(self, fn: cst.FunctionDef) -> None:
        """Record that a rule puts a collective into `fn` (DST203's metric sums): a statement calling
        it is then a collective too, for every later rule (the anatomy only knows the input)."""
        self.plan.gains_collective.add(fn)

    def forward_in(self, stmt: cst.CSTNode, depth: int = 0) -> Optional[cst.Call]:
        """A call in `stmt` that every rank must make once the rules are done: a forward pass of a
        model whose forward is a collective – the model called (``model(x)``), or a function or
        method of this script that is handed the model (``evaluate(model, loader)``) or that calls it
        itself (``self.evaluate()``) – or a call of a function a rule puts a collective into. Under
        FSDP every forward all-gathers the shards; under DDP a forward after a training step
        broadcasts the module's buffers (BatchNorm statistics). Horovod's forward is local. A method
        DST121 registers with ``register_fsdp_forward_method`` (``model.decode(z)``) gathers too."""
        a = self.anatomy
        key = a.facts.key  # a model held on the instance is one whatever each method calls the instance
        models = {m.name: m for m in a.models}
        wrapped = [m for m, _ in self.plan.wrapped] if self.backend in TORCH_BACKENDS else []
        sharded = {key(m.scope, m.name) for m in wrapped}
        gaining = self.plan.gains_collective
        registered = {key(models[n].scope, n) if n in models else (0, n): v for n, v in self.plan.forward_methods.items()}
        if not (sharded or gaining) or depth > 3:
            return None
        scope = a.stmt_scope.get(stmt)
        for site in a.calls:
            if site.scope is not scope or not (site.stmt is stmt or stmt in site.parents):
                continue
            name = dotted(site.call.func)
            if key(scope, name) in sharded:
                return site.call
            func = site.call.func
            if isinstance(func, cst.Attribute) and func.attr.value in registered.get(key(scope, dotted(func.value)), ()):
                return site.call  # model.decode(z): registered with register_fsdp_forward_method (DST121)
            callee = a.callee(site.call, scope)
            if callee is None:
                continue
            if callee in gaining or any(key(scope, dotted(x.value)) in sharded for x in site.call.args):
                return site.call
            for inner in callee.body.body if isinstance(callee.body, cst.IndentedBlock) else ():
                if self.forward_in(inner, depth + 1) is not None:
                    return site.call
        return None

    def guard_statement(self, stmt: cst.CSTNode) -> bool:
        """Run `stmt` on the main process only (see `finish` for how guards are laid out).

        A statement that makes a collective call (``print(runtime.reduce_mean(loss))``, or a forward
        of a DDP/FSDP model, ``print(evaluate(model, loader))``) must not go under the guard: the
        other ranks would never join the collective and the job would hang. When the collective sits
        in the arguments of a call statement, those arguments are computed on every rank first,
        into a name, and only the call is guarded. Otherwise the statement stays on all ranks, with
        a DST911 warning. Returns whether the guard was added.
        """
        hazards = [c.call for c in self.collectives_in(stmt)]
        forward = self.forward_in(stmt)
        if forward is not None:
            hazards.append(forward)
        # a call that trains: every rank takes the step (DDP and FSDP average the gradients in
        # backward, hvd.DistributedOptimizer in step(): collectives all)
        trains = self.training_in(stmt)
        if trains is not None:
            hazards.append(trains)
        if hazards:
            if self._hoist_arguments(stmt, hazards):
                self.edits.guard(stmt, self.main_process_at(stmt))
                return True
            c = hazards[0]
            what = (
                "trains, and Horovod's DistributedOptimizer averages the gradients of every rank in its step"
                if c is trains and self.backend == HOROVOD_BACKEND
                else "trains, and every rank must take each step (its backward averages the gradients of every rank)"
                if c is trains
                else "runs a forward pass of the sharded model, a collective every rank must join under FSDP"
                if c is forward and self.backend == FSDP_BACKEND
                else "runs a forward pass of the DDP model, which broadcasts its buffers from rank 0"
                if c is forward
                else "is a collective every rank must call"
            )
            self.warn(
                "DST911",
                c,
                f"{self.code(c.func)}() {what}: this statement stays on all ranks (no rank-0 guard); compute "
                "the value on every rank first, then guard only its use",
            )
            return False
        self.edits.guard(stmt, self.main_process_at(stmt))
        return True

    def _hoist_arguments(self, stmt: cst.CSTNode, hazards: List[cst.Call]) -> bool:
        """``print(f"acc {evaluate(model)}")`` -> ``message = f"acc {evaluate(model)}"`` on every rank,
        then ``print(message)`` (guarded by the caller). Only for a statement that is one call whose
        arguments hold every collective; False (nothing edited) otherwise."""
        if not all(hoistable_argument(stmt, h) for h in hazards):
            return False
        outer = stmt.body[0].value
        holding = [x for x in outer.args if any(_contains(x.value, h) for h in hazards)]
        for x in holding:  # the value as the other rules rewrite it (a sampler given a loader built in it)
            self.edits.hoist(x.value, stmt, self.fresh(_value_name(x.value)))
        self.report(
            "DST911",
            holding[0].value,
            "computed on every rank before the rank-0 guard (it makes a collective call); only the call that uses it "
            "runs on rank 0",
        )
        return True

    def finish(self) -> None:
        """Lay out the guards once all rules have run.

        An ``if`` without ``else`` whose statements are all guarded gets its condition extended
        (``if args.save_model and runtime.is_main_process():``) instead of a second, nested
        ``if``. Other guarded statements share one ``if`` with their guarded neighbours.
        """
        by_parent = {}
        for stmt, cond in self.edits.guards.items():
            parents = self.anatomy.stmt_parent.get(stmt, ())
            if parents and isinstance(parents[-1], cst.If):
                by_parent.setdefault(parents[-1], []).append((stmt, cond))
        for parent, guarded in by_parent.items():
            if parent.orelse is not None or not isinstance(parent.body, cst.IndentedBlock):
                continue
            conds = {c for _, c in guarded}
            if len(conds) != 1 or {id(s) for s, _ in guarded} != {id(s) for s in parent.body.body}:
                continue
            if parent in self.edits.guards:
                continue
            if any(s in self.edits.before for s, _ in guarded):
                continue  # what goes before them (a gathered state dict) runs on every rank
            cond = conds.pop()
            for stmt, _ in guarded:
                del self.edits.guards[stmt]

            def extend(node: cst.If, cond=cond) -> cst.If:
                test = node.test
                if isinstance(test, (cst.IfExp, cst.Lambda, cst.NamedExpr)) or (
                    isinstance(test, cst.BooleanOperation) and not isinstance(test.operator, cst.And)
                ):
                    test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                return node.with_changes(
                    test=cst.BooleanOperation(left=test, operator=cst.And(), right=cst.parse_expression(cond))
                )

            self.edits.replace(parent, extend)


def hoistable_argument(stmt: cst.CSTNode, call: cst.Call) -> bool:
    """Whether `call` lies in a plain argument of the one call that makes up `stmt`
    (``print(f"acc {evaluate(model)}")``), so that the argument can be computed on every rank
    before a rank-0 guard goes around the call (``Context.guard_statement``)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return False
    outer = stmt.body[0].value
    if not isinstance(outer, cst.Call) or outer is call:
        return False
    return any(not x.star and _contains(x.value, call) for x in outer.args)


def _contains(root: cst.CSTNode, node: cst.CSTNode) -> bool:
    """Whether `node` is `root` or lies below it."""
    return any(n is node for n in all_nodes(root))


def _value_name(expr: cst.BaseExpression) -> str:
    """A name for a hoisted argument: `evaluate_result` for ``evaluate(model)``, `message` for text."""
    if isinstance(expr, cst.Call):
        name = (dotted(expr.func) or "").split(".")[-1].strip("_")
        if name.isidentifier():
            return f"{name}_result"
    if isinstance(expr, (cst.FormattedString, cst.SimpleString, cst.ConcatenatedString)):
        return "message"
    return "value"


def loader_stem(target: str) -> str:
    """What a loader's name says it loads: `train` for `train_loader` / `self.train_dl`, the base
    of the names distify gives its sampler and dataset."""
    last = target.split(".")[-1]
    for suffix in ("_loader", "loader", "_dl", "_dataloader", "dataloader"):
        if last.lower().endswith(suffix) and len(last) > len(suffix):
            return last[: -len(suffix)].rstrip("_")
    return last


def add_kwarg(call: cst.Call, keyword: str, value: cst.BaseExpression) -> cst.Call:
    """Append `keyword=value` to a call, following the call's own comma/whitespace layout."""
    args = list(call.args)
    new = cst.Arg(
        keyword=cst.Name(keyword),
        value=value,
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if len(args) >= 2 and args[-2].comma is not cst.MaybeSentinel.DEFAULT:
        sep = args[-2].comma
    else:
        sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    trailing = last.comma
    if trailing is not cst.MaybeSentinel.DEFAULT:
        # `f(a, b,)` or a multi-line call ending in a comma: keep the trailing layout on the new arg
        args[-1] = last.with_changes(comma=sep)
        new = new.with_changes(comma=trailing)
    else:
        args[-1] = last.with_changes(comma=sep)
    return call.with_changes(args=[*args, new])


def kwarg_value(call: cst.Call, keyword: str) -> Optional[cst.BaseExpression]:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == keyword:
            return a.value
    return None


def names_in(node: cst.CSTNode) -> FrozenSet[str]:
    found = set()

    class V(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            found.add(n.value)

    walk(node, V())
    return frozenset(found)


def method_calls_in(node: cst.CSTNode, method: str) -> int:
    """How many `x.<method>(...)` calls are written inside `node`, nested functions included."""
    count = 0

    class V(cst.CSTVisitor):
        def visit_Call(self, n: cst.Call) -> None:
            nonlocal count
            if isinstance(n.func, cst.Attribute) and n.func.attr.value == method:
                count += 1

    walk(node, V())
    return count


def reaching_scopes(ctx: Context, model, anchor) -> dict:
    """(scope, dotted name) -> (statement the use must follow or None, "module" | "unwrap")."""
    a = ctx.anatomy
    # a wrap after a compound statement (`if resume: load ... else: init ...`) follows all of it
    anchor = last_within(a.facts, anchor)
    out = {(id(model.scope), model.name): (anchor, "module")}
    if a.facts.instance_attr(model.scope, model.name) is not None:  # held on the instance: every method sees it
        for fn in a.methods:
            there = a.facts.respell(model.name, model.scope, fn) if fn is not model.scope else None
            if there is not None:
                out[(id(fn), there)] = (None, "module")
        # and code outside the class, through an instance (`trainer.model` after `trainer = Trainer(...)`):
        # wrapped once the instance exists when its __init__ always wraps it, maybe otherwise
        cls = a.facts.instance(model.scope)[1]
        every = built_in_init(a, model.scope, anchor, cls)
        for scope, name, since, sure in attribute_reach(a, cls, a.facts.instance_attr(model.scope, model.name)):
            out.setdefault((id(scope), name), (since, "module" if every and sure else "unwrap"))
        if ctx.plan.sharding:  # fully_shard shards in place: the module handed to the class is the one sharded
            for scope, name, since, _sure in handed_in(a, model.scope, getattr(model, "value", None), cls):
                out.setdefault((id(scope), name), (since, "module"))
        return out
    if isinstance(model.scope, cst.Module):
        for fn in list(a.functions.values()) + list(a.methods):
            if not binds_locally(a, fn, model.name):
                out[(id(fn), model.name)] = (None, "module")
    # functions that receive the model as an argument after the wrap
    for site in a.calls:
        if site.scope is not model.scope or not a.is_before(anchor, site.stmt):
            continue
        fn = a.functions.named(dotted(site.call.func))
        if fn is None:
            continue
        params = [p.name.value for p in fn.params.params]
        for i, p in enumerate(params):
            v = arg(site.call, i, p)
            if v is not None and dotted(v.value) == model.name:
                out[(id(fn), p)] = (None, "unwrap")
    # further: returned by a helper and bound by its caller, handed to a constructor and kept as
    # `self.model` (the anatomy's flow facts); runtime.unwrap works whether the value is wrapped or not
    if a.flow_from is not None:
        for scope, name in a.flow_from(model.scope, model.name):
            out.setdefault((id(scope), name), (None, "unwrap"))
            attr = a.facts.instance_attr(scope, name)
            if attr is not None:  # kept on an instance (`self.model = model`): reached through it outside
                for s, n, _since, _sure in attribute_reach(a, a.facts.instance(scope)[1], attr):
                    out.setdefault((id(s), n), (None, "unwrap"))
    return out


def binds_locally(a, scope, name: str) -> bool:
    """`name` is a parameter of the function `scope`, or assigned (`=`, `: T =`, `+=`) in `scope`."""
    if isinstance(scope, cst.FunctionDef) and name in [p.name.value for p in scope.params.params]:
        return True
    for stmt, sc in a.stmt_scope.items():
        if sc is scope and isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign) and any(dotted(t.target) == name for t in small.targets):
                    return True
                if isinstance(small, (cst.AnnAssign, cst.AugAssign)) and dotted(small.target) == name:
                    return True
    return False



class Rule:
    """Base class. Subclasses set the class attributes and implement `apply`.

    The docstring of every rule has three parts – what it does, why, and an example – and is what
    ``distify --explain CODE`` prints.
    """

    code: str = ""
    name: str = ""
    backends: FrozenSet[str] = frozenset(BACKENDS)
    summary: str = ""

    def apply(self, ctx: Context) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class AuditCheck(Rule):
    """Base of the output audit's checks (DST95x, see ``distify.audit``): they edit nothing and
    warn with a one-line fix. The engine runs them on the rewritten module, ``distify lint`` on a
    script that is already distributed; ``check`` runs only on a distributed script unless
    ``needs_distributed`` is False."""

    audit = True
    checks_distributed = True
    needs_distributed = True
    # True for a check whose finding on distify's *own* output means the rewritten script would
    # train wrong with no error (the replicas drift apart): the engine then refuses the file
    # (exit 3) instead of writing it with a warning
    refuses_own_output = False

    def apply(self, ctx: Context) -> None:
        if self.needs_distributed and ctx.anatomy.flavour is None:
            return
        if any((c.qualname or "").startswith("torch.distributed.rpc") for c in ctx.anatomy.calls):
            return  # RPC (parameter servers, pipelines): not the data-parallel invariants checked here
        self.check(ctx, ctx.anatomy)

    def check(self, ctx: Context, a: Anatomy) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def note_batch_norm(ctx: "Context", code: str, name: str, value, kept: str, advice: str) -> None:
    """An info note where the model `name` (built by `value`) normalises with BatchNorm: each rank
    takes the batch statistics of its own shard of the batch. `kept` says whose running statistics
    the backend keeps, `advice` how to opt in to synchronised statistics."""
    bn = batch_norm(ctx.anatomy.classes, ctx.anatomy.qualname, value)
    if bn is not None:
        ctx.report(
            code, bn,
            f"{name} normalises with {ctx.code(bn.func)}: each rank takes the batch statistics of its own shard "
            f"of the batch {kept}, not those of the whole batch as one process did; with few samples per rank "
            f"{advice}",
            kind="info",
        )


__all__ = [
    "AuditCheck",
    "BACKENDS",
    "Context",
    "DDP_BACKEND",
    "FSDP_BACKEND",
    "Finding",
    "HOROVOD_BACKEND",
    "Options",
    "Rule",
    "TORCH_BACKENDS",
    "add_kwarg",
    "call_statement",
    "dotted",
    "hoistable_argument",
    "kwarg_value",
    "names_in",
    "note_batch_norm",
]

