"""The evaluation plans: which evaluation loaders can be split across the ranks, with the loops and
metric sums that make it exact, and why the others stay whole.

DST203 shards the loaders these plans allow and sums their metrics; DST201 gives every other
evaluation loader its reason in an info line and leaves the training sampler logic alone for them.
Both ask ``eval_plans(ctx)``, computed once per file (``ctx.plan.eval_plans``).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple, Union

import libcst as cst

from distify.dataflow import iterated_ref
from distify.records import CallSite, Loader
from distify.syntax import arg, dotted, all_nodes, flatten_target, header_names, names
from distify.facts import uses
from distify.library import NO_GRAD, names_of
from distify.rules.base import FSDP_BACKEND, HOROVOD_BACKEND, Context, binds_locally, hoistable_argument
from distify.data_sources import is_iterable_dataset
from distify.sums import COLLECTIVES, initialised, loop_locals, root as _root, sample_sum
from distify.values import Record

CODE = "DST203"  # the rule that carries the plans out
# why evaluation loaders stay whole under --backend fsdp
FSDP_WHOLE = (
    "with FSDP each forward pass gathers the sharded parameters from every rank (a collective), so all "
    "ranks must run the same number of them; uneven evaluation shards would leave a rank waiting forever"
)
Scope = Union[cst.Module, cst.FunctionDef]

PRINTS = names_of("print")  # tqdm.write and its twins (distify.library)
LOG_METHODS = {"debug", "info", "warning", "warn", "error", "critical", "exception", "log", "write"}


class EvalLoop(Record):
    """A loop over an evaluation loader and the metric sums it adds up (``reason``: why it stays whole)."""

    __slots__ = ("loop", "scope", "name", "metrics", "reason", "__dict__")
    loop: cst.For
    scope: Scope
    name: str  # how the loop's scope spells the loader
    metrics: Tuple[str, ...]
    reason: Optional[str]

    def __init__(self, loop: cst.For, scope: Scope, name: str, metrics: Tuple[str, ...] = (),
                 reason: Optional[str] = None) -> None:
        self._set(loop, scope, name, metrics, reason)


class EvalPlan(Record):
    """What happens to one evaluation loader: sharded (``reason is None``) or left whole."""

    __slots__ = ("loader", "reason", "loops", "refs", "__dict__")
    loader: Loader
    reason: Optional[str]
    loops: List[EvalLoop]
    refs: Set[Tuple[int, str]]

    def __init__(self, loader: Loader, reason: Optional[str], loops: Optional[List[EvalLoop]] = None,
                 refs: Optional[Set[Tuple[int, str]]] = None) -> None:
        self._set(loader, reason, [] if loops is None else loops, set() if refs is None else refs)

    @property
    def shard(self) -> bool:
        return self.reason is None


def shard_eval_enabled(ctx: Context) -> bool:
    """DST203 (which shards the evaluation loaders these plans describe) is selected for this run
    (it runs with every backend)."""
    return ctx.options.selects(CODE)


def eval_plans(ctx: Context) -> Dict[Loader, EvalPlan]:
    """A plan for each evaluation DataLoader without a sampler of its own (computed once)."""
    if ctx.plan.eval_plans is None:
        ctx.plan.eval_plans = _Planner(ctx).run()
    return ctx.plan.eval_plans


class _Planner:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.a = ctx.anatomy
        self.loop_cache: Dict[int, EvalLoop] = {}
        # (function, parameter) reached by following a loader into a call
        self.param_edges: Set[Tuple[cst.FunctionDef, str]] = set()

    # -------------------------------------------------------------------------- driver
    def run(self) -> Dict[Loader, EvalPlan]:
        plans: Dict[Loader, EvalPlan] = {}
        for loader in self.a.loaders:
            if loader.role != "eval":
                continue
            call = loader.call.call
            if arg(call, 5, "sampler") is not None or arg(call, 6, "batch_sampler") is not None:
                continue  # its sampler decides what each rank sees
            plans[loader] = self.plan(loader)
        self.settle(plans)
        return plans

    def plan(self, loader: Loader) -> EvalPlan:
        plan = EvalPlan(loader, None)
        if self.ctx.backend == FSDP_BACKEND:
            plan.reason = FSDP_WHOLE
            return plan
        if loader.target is None:
            plan.reason = "it is not bound to a name distify can follow"
            return plan
        plan.reason = self.follow(loader, plan)
        if plan.reason is None:
            plan.reason = self.arguments(loader)
        if plan.reason is None and not plan.loops:
            plan.reason = "no evaluation loop over it was found"
        for loop in plan.loops:
            if plan.reason is not None:
                break
            plan.reason = self.loop(loop).reason
        return plan

    def arguments(self, loader: Loader) -> Optional[str]:
        call = loader.call.call
        if loader.dataset is None:
            return "its dataset is not passed as an argument"
        if is_iterable_dataset(self.a, loader):
            return "its dataset is an IterableDataset (no indices to split)"
        if any(x.star for x in call.args):
            return "its arguments are unpacked with * or **"
        if len([x for x in call.args if x.keyword is None]) > 3:
            return "it passes more than three positional arguments"
        for pos, kw, what in ((2, "shuffle", "it shuffles"), (None, "drop_last", "it drops the last batch")):
            a = arg(call, pos, kw)
            if a is not None and not (isinstance(a.value, cst.Name) and a.value.value == "False"):
                return f"{what} ({kw}={self.ctx.code(a.value)})"
        return None

    def settle(self, plans: Dict[Loader, EvalPlan]) -> None:
        """A loop shared by several loaders is reduced for all of them: shard all or none."""
        known: Set[Tuple[int, str]] = set()
        for plan in plans.values():
            known |= plan.refs
        # every call of a function whose parameter reaches a loop must pass a known eval loader
        strays: Dict[Tuple[int, str], str] = {}
        for fn, param in self.param_edges:
            for site in self.a.callers(fn, any_receiver=True):
                value = self.a.bound_value(site.call, fn, param)
                name = dotted(value) if value is not None else None
                if name is None or (id(site.scope), name) not in known:
                    spelled = self.ctx.code(value) if value is not None else f"no {param}"
                    line = self.a.position(site.call)[0]
                    strays.setdefault(
                        (id(fn), param),
                        f"`{fn.name.value}` is also called with {_short(spelled)} (line {line}), which DST203 does not shard",
                    )
        users: Dict[int, List[EvalPlan]] = {}
        for plan in plans.values():
            for loop in plan.loops:
                users.setdefault(id(loop.loop), []).append(plan)
            for key, why in strays.items():
                if plan.shard and key in plan.refs:
                    plan.reason = why
        changed = True
        while changed:
            changed = False
            for plan in plans.values():
                if not plan.shard:
                    continue
                for loop in plan.loops:
                    whole = [p for p in users[id(loop.loop)] if not p.shard]
                    if whole:
                        line = self.a.position(loop.loop)[0]
                        plan.reason = (
                            f"its evaluation loop (line {line}) also evaluates {whole[0].loader.target}, "
                            "which stays whole"
                        )
                        changed = True
                        break

    # -------------------------------------------------------------------------- references
    def follow(self, loader: Loader, plan: EvalPlan) -> Optional[str]:
        """Find every use of the loader (through function parameters); None when all are known."""
        target = loader.target
        start: List[Tuple[Scope, str]] = []
        f = self.a.facts
        if f.instance_attr(loader.call.scope, target) is not None:  # every method sees it, as it spells it
            start = [(m, t) for m in self.a.methods if (t := f.respell(target, loader.call.scope, m)) is not None]
        elif isinstance(loader.call.scope, cst.Module):
            start = [(self.a.module, target)]
            for fn in self.a.all_functions():
                if not binds_locally(self.a, fn, target):
                    start.append((fn, target))
        else:
            start = [(loader.call.scope, target)]
        queue = list(start)
        seen: Set[Tuple[int, str]] = set()
        loops_seen: Set[int] = set()
        reason: Optional[str] = None  # the first problem; the walk goes on to find every loop
        while queue:
            scope, name = queue.pop(0)
            if (id(scope), name) in seen:
                continue
            seen.add((id(scope), name))
            plan.refs.add((id(scope), name))
            iters = self._loop_iters(scope, name)
            for use, parents, nested in uses(scope, name):
                why = None
                found = next((f for f, ids in iters if id(use) in ids), None)
                parent = parents[-1] if parents else None
                grand = parents[-2] if len(parents) > 1 else None
                if nested:
                    why = f"{name} is used inside a nested function or lambda"
                elif found is not None:
                    if id(found) not in loops_seen:
                        loops_seen.add(id(found))
                        plan.loops.append(EvalLoop(found, scope, name))
                elif isinstance(parent, cst.Attribute) and parent.value is use and parent.attr.value == "dataset":
                    pass  # len(test_loader.dataset): the whole set's size on every rank
                elif isinstance(parent, cst.AssignTarget) and any(p is loader.call.stmt for p in parents):
                    pass  # the construction itself
                elif isinstance(parent, cst.Arg) and isinstance(grand, cst.Call) and parent.value is use:
                    callee = self.a.callee(grand, scope)
                    param = self.a.param_for(callee, grand, parent) if callee is not None else None
                    if isinstance(grand.func, cst.Name) and grand.func.value == "len":
                        why = f"`{_short(self.ctx.code(grand))}` counts this rank's batches only"
                    elif param is None:
                        why = f"`{_short(self.ctx.code(grand))}` passes {name} to code distify does not follow"
                    else:
                        self.param_edges.add((callee, param))
                        queue.append((callee, param))
                else:
                    shown = parent if isinstance(parent, cst.BaseExpression) else use
                    why = f"`{_short(self.ctx.code(shown))}` uses {name} in a way distify does not follow"
                if reason is None:
                    reason = why
        return reason

    def _loop_iters(self, scope: Scope, name: str) -> List[Tuple[cst.For, Set[int]]]:
        out = []
        for loop, sc, _cls, _outer in self.a.fors:
            if sc is scope and iterated_ref(loop.iter, self.a.qualname) == name:
                out.append((loop, {id(n) for n in all_nodes(loop.iter)}))
        return out

    # -------------------------------------------------------------------------- one loop
    def loop(self, ev: EvalLoop) -> EvalLoop:
        cached = self.loop_cache.get(id(ev.loop))
        if cached is not None:
            ev.metrics, ev.reason = cached.metrics, cached.reason
            return ev
        self.loop_cache[id(ev.loop)] = ev
        ev.reason = self._check_loop(ev)
        return ev

    def _check_loop(self, ev: EvalLoop) -> Optional[str]:
        loop, scope = ev.loop, ev.scope
        code = self.ctx.code
        if loop.orelse is not None:
            return "its evaluation loop has an `else:` clause"
        if loop.asynchronous is not None:
            return "its evaluation loop is an `async for`"
        for node in all_nodes(loop.iter):
            if isinstance(node, cst.Call) and dotted(node.func) == "zip" and len(node.args) > 1:
                return "its evaluation loop zips it with another iterable"

        body_nodes = list(all_nodes(loop.body, skip_nested=True))
        for node in body_nodes:
            if isinstance(node, (cst.Return, cst.Yield, cst.Await)):
                return f"its evaluation loop can leave early (`{_short(code(node))}`)"
            if isinstance(node, cst.Break) and _innermost_loop(loop, node) is loop:
                return "its evaluation loop can stop early (`break`)"
            if isinstance(node, cst.Call):
                q = self.a.qualname(node.func) or ""
                if q.startswith(COLLECTIVES):
                    return f"its evaluation loop already communicates between ranks (`{_short(code(node))}`)"

        local = loop_locals(loop)

        # side effects on anything that outlives one batch
        for node in body_nodes:
            if isinstance(node, cst.SimpleStatementLine):
                for small in node.body:
                    why = self._side_effect(small, local)
                    if why:
                        return why

        metrics: List[str] = []
        for node in body_nodes:
            if not isinstance(node, cst.AugAssign):
                continue
            if not isinstance(node.target, cst.Name):
                root = _root(node.target)
                return f"`{_short(code(node))}` accumulates into {root or 'an object'} outside the loop"
            name = node.target.value
            if name in local:
                continue  # a per-batch variable
            if not isinstance(node.operator, cst.AddAssign):
                return f"metric `{name}` is not a sum (`{_short(code(node))}`)"
            if not sample_sum(self.a, node.value, local):
                return (
                    f"`{_short(code(node))}` adds a per-batch value, not a per-sample sum, "
                    f"so `{name}` would depend on how the set is split"
                )
            if name not in metrics:
                metrics.append(name)
        if not metrics:
            return "its evaluation loop accumulates no per-sample sum"

        for n, how in names(loop):
            if n.value in metrics and how != "aug":
                return f"metric `{n.value}` is read inside the evaluation loop"

        for name in metrics:
            why = initialised(self.a, name, loop, scope, "evaluation loop")
            if why:
                return why

        why = self._read_after(loop, scope, local - set(metrics))
        if why:
            return why
        why = self._runs_everywhere(loop, scope)
        if why:
            return why
        if self.ctx.backend != HOROVOD_BACKEND and not self._grad_off(loop, scope):
            return (
                "its evaluation loop runs with gradients enabled: a DDP forward may then sync buffers "
                "in every step, and ranks with unequal shards would wait on each other (use torch.no_grad())"
            )
        ev.metrics = tuple(metrics)
        return None

    def _side_effect(self, small: cst.BaseSmallStatement, local: Set[str]) -> Optional[str]:
        code = self.ctx.code
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            call = small.value
            func = call.func
            q = self.a.qualname(func) or ""
            if isinstance(func, cst.Name) and func.value == "print" and not q:
                return "its evaluation loop prints (every rank would print its own part)"
            logs = isinstance(func, cst.Attribute) and func.attr.value in LOG_METHODS
            if q.startswith("logging") or q in PRINTS or logs:
                return "its evaluation loop logs (every rank would log its own part)"
            root = _root(func)
            if root is None or root in local:
                return None
            if root in self.a.aliases:
                return None  # torch.cuda.synchronize(), np.random.seed(...)
            return f"`{_short(code(call))}` changes {root} in every batch"
        if isinstance(small, (cst.Assign, cst.AnnAssign)):
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
            for t in targets:
                for el in flatten_target(t):
                    if isinstance(el, (cst.Subscript, cst.Attribute)):
                        root = _root(el)
                        if root is not None and root not in local:
                            return f"`{_short(code(small))}` stores per-batch results in {root}"
        if isinstance(small, (cst.Global, cst.Nonlocal)):
            return "its evaluation loop rebinds names of another scope"
        return None

    # -------------------------------------------------------------------------- flow around the loop
    def _read_after(self, loop: cst.For, scope: Scope, local: Set[str]) -> Optional[str]:
        """A per-batch variable read after the loop holds the last batch: one rank's, once sharded."""
        if not local:
            return None
        a = self.a
        at = self.a.order(loop)
        pending = set(local)
        for stmt in a.facts.statements(scope):
            if not pending:
                break
            if self.a.order(stmt) <= at or loop in a.stmt_parent.get(stmt, ()):
                continue
            for n, how in header_names(stmt):
                if n.value not in pending:
                    continue
                if how == "store":
                    pending.discard(n.value)
                else:
                    return f"`{n.value}` is set per batch and read after the evaluation loop"
        return None

    def _runs_everywhere(self, loop: cst.For, scope: Scope) -> Optional[str]:
        guarded = "the evaluation runs under a rank check, so only that rank evaluates"
        if self.ctx.in_rank_guard(loop):
            return guarded
        todo: List[Tuple[Scope, int]] = [(scope, 0)]
        seen: Set[int] = set()
        while todo:
            fn, depth = todo.pop()
            if isinstance(fn, cst.Module) or id(fn) in seen or depth > 6:
                continue
            seen.add(id(fn))
            sites = self.a.callers(fn, any_receiver=True)
            if not sites:
                return f"`{fn.name.value}` is not called where distify can see it"
            for site in sites:
                if self.ctx.in_rank_guard(site.stmt):
                    return guarded
                if _inside_expression_statement(site) and not hoistable_argument(site.stmt, site.call):
                    return (
                        f"`{_short(self.ctx.code(site.stmt))}` calls the evaluation inside a statement "
                        "that may run on rank 0 only"
                    )
                todo.append((site.scope, depth + 1))
        return None

    def _grad_off(self, loop: cst.For, scope: Scope) -> bool:
        if any(self._no_grad_with(p) for p in self.a.stmt_parent.get(loop, ())):
            return True
        if isinstance(scope, cst.FunctionDef):
            if any(self._no_grad_expr(d.decorator) for d in scope.decorators):
                return True
            sites = self.a.callers(scope, any_receiver=True)
            return bool(sites) and all(
                any(self._no_grad_with(p) for p in self.a.stmt_parent.get(s.stmt, ())) for s in sites
            )
        return False

    def _no_grad_with(self, stmt: cst.CSTNode) -> bool:
        return isinstance(stmt, cst.With) and any(self._no_grad_expr(i.item) for i in stmt.items)

    def _no_grad_expr(self, e: cst.BaseExpression) -> bool:
        func = e.func if isinstance(e, cst.Call) else e
        q = self.a.qualname(func)
        if q in NO_GRAD:
            return True
        if q == "torch.set_grad_enabled" and isinstance(e, cst.Call):
            a = arg(e, 0, "mode")
            return a is not None and isinstance(a.value, cst.Name) and a.value.value == "False"
        return False


# ------------------------------------------------------------------------------ helpers


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _innermost_loop(outer: cst.For, target: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The innermost for/while around `target` inside `outer` (or `outer` itself)."""
    found: List[cst.CSTNode] = []

    def walk(node: cst.CSTNode, loops: Tuple[cst.CSTNode, ...]) -> bool:
        if node is target:
            found.append(loops[-1])
            return True
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return False
        inner = loops + (node,) if isinstance(node, (cst.For, cst.While)) else loops
        return any(walk(c, inner) for c in node.children)

    walk(outer.body, (outer,))
    return found[0] if found else None


def _inside_expression_statement(site: CallSite) -> bool:
    """`print(evaluate(...))`, `logger.info(..., evaluate(...))`: statements other rules guard (they
    compute a hoistable argument on every rank first, see ``Context.guard_statement``)."""
    stmt = site.stmt
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for small in stmt.body:
        if isinstance(small, cst.Expr) and small.value is not site.call and any(
            n is site.call for n in all_nodes(small)
        ):
            return True
    return False
