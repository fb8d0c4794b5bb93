"""DST902 nn.DataParallel removed: one process per GPU."""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple, Union

import libcst as cst

from distify.facts import SELF_RETURNING, same_object
from distify.model_build import data_parallel_module
from distify.records import DATA_PARALLEL, Model
from distify.syntax import dotted, held_name
from distify.rules.base import DDP_BACKEND, FSDP_BACKEND, HOROVOD_BACKEND, Context, Rule, reaching_scopes
from distify.walk import children
from distify.library import LOGGER_FACTORIES, LOGGING_MODULES

# methods that return the module itself and may follow `nn.DataParallel(...)` in a chain
_HOW = "remove the DataParallel by hand and re-run distify"


class DataParallel(Rule):
    """Remove ``nn.DataParallel``: each process drives one GPU.

    What it does:
        Drops ``model = nn.DataParallel(model, device_ids=...)`` and, when nothing else is in it,
        the ``if torch.cuda.device_count() > 1:`` that chose it (a print there goes with it);
        ``nn.DataParallel(Net()).to(device)`` keeps just ``Net().to(device)``. With DDP the model
        is then wrapped by DST101 like any other; ``model.module`` keeps working (DDP has
        ``.module`` too) and ``isinstance(model, nn.DataParallel)`` tests for ``runtime.DDP``
        instead. With Horovod the model is not wrapped at all, and with FSDP the sharded model is
        the module itself (``fully_shard`` adds no wrapper), so ``model.module.x`` becomes
        ``model.x``. A DataParallel distify cannot remove safely – around a model no optimizer in
        that function trains, inside a larger expression, or (with DDP) the class used other than
        in a call or ``isinstance()`` – leaves the whole file unchanged, with a warning.

    Why:
        DataParallel splits each batch over the GPUs of one process. Under torchrun or horovodrun
        every process already owns one GPU and its own share of the data; stacking DataParallel
        on top would make each process use every GPU, and DDP would average gradients of replicas
        it does not know about.

    Example:
        model = Net()
        if torch.cuda.device_count() > 1:
            model = nn.DataParallel(model)
        model.to(device)

        becomes

        model = Net()
        model.to(device)
        model = runtime.DDP(model, device_ids=runtime.device_ids())
    """

    code = "DST902"
    name = "data-parallel"
    summary = "nn.DataParallel removed: one process per GPU"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        sites = a.calls_to(DATA_PARALLEL)
        references = _class_references(a)
        if not sites and not references:
            return
        backend = {HOROVOD_BACKEND: "Horovod", FSDP_BACKEND: "FSDP"}.get(ctx.backend, "DDP")
        plans: List[_Plan] = []
        for site in sites:
            plan = _plan(ctx, site)
            if isinstance(plan, str):
                ctx.block(self.code, site.call, plan)
            else:
                plans.append(plan)
        isinstance_refs = []
        for node, in_isinstance in references:
            if in_isinstance:
                isinstance_refs.append(node)
            elif ctx.backend == DDP_BACKEND:
                # with Horovod and FSDP no DataParallel is left for such a test to find, which is right
                ctx.block(
                    self.code,
                    node,
                    "nn.DataParallel used other than as a call or in isinstance(): file not migrated; " + _HOW,
                )
        if ctx.blocked:
            return

        removed_ifs = _remove(ctx, plans)
        for plan in plans:
            if plan.action == "inline":
                ctx.edits.replace(plan.call, _unwrap_call)
            message = f"nn.DataParallel removed: one process per GPU under {backend}"
            if plan.stmt in removed_ifs or any(p in removed_ifs for p in a.stmt_parent.get(plan.stmt, ())):
                message += " (with the `if` that chose it)"
            ctx.report(self.code, plan.call, message)
        if ctx.backend != DDP_BACKEND:
            # Horovod wraps nothing; FSDP's sharded model is the module itself (it has no .module)
            _drop_module(ctx, plans, everywhere=True)
            isinstance_refs = []  # left as they are: no DataParallel is left for them to find
        else:
            _drop_module(ctx, plans, everywhere=False)
        _drop_import(ctx, [p.call.func for p in plans] + isinstance_refs)
        if isinstance_refs:
            ddp = ctx.ddp
            for node in isinstance_refs:
                ctx.edits.replace(node, lambda n, ddp=ddp: cst.parse_expression(ddp))
                ctx.report(self.code, node, f"isinstance() tests for {ddp} (the model's wrapper now)")


class _Plan:
    def __init__(self, site, holder, index, model: Model, action: str) -> None:
        self.call = site.call  # the nn.DataParallel(...) call
        self.stmt = site.stmt  # innermost statement holding it
        self.scope = site.scope
        self.holder = holder  # the SimpleStatementLine / SimpleStatementSuite holding the small statement
        self.index = index  # position of the small statement in holder.body
        self.model = model
        self.action = action  # "remove" (the statement) | "inline" (the call becomes its module)


def _plan(ctx: Context, site) -> Union[_Plan, str]:
    """How to remove one DataParallel call, or why it cannot be removed."""
    a = ctx.anatomy
    call = site.call
    module = data_parallel_module(a.qualname, call)
    if module is None:
        return "nn.DataParallel(...) without a module argument distify can read: file not migrated; " + _HOW
    holder, smalls = _small_statements(site.stmt)
    for index, small in enumerate(smalls):
        if isinstance(small, cst.Assign):
            top = small.value
        elif isinstance(small, cst.Expr):
            top = small.value
        else:
            continue
        if not _chain_reaches(a, top, call):
            continue
        base = dotted(_root(a, module))
        if isinstance(small, cst.Expr):
            # `nn.DataParallel(model).cuda()`: only the move matters
            model = _model_named(a, base, site)
            if model is None:
                return _not_trained(a, base, site)
            action = "remove" if top is call else "inline"
            return _checked(ctx, _Plan(site, holder, index, model, action))
        if len(small.targets) != 1 or dotted(small.targets[0].target) is None:
            break
        target = dotted(small.targets[0].target)
        model = _model_named(a, target, site)
        if model is None:
            return _not_trained(a, target, site)
        if base != target and site.stmt is not model.assign:
            return (
                f"{target} = nn.DataParallel(...) builds a new model, not the {target} its optimizer trains: "
                "file not migrated; " + _HOW
            )
        wrapped_in_place = (
            ctx.backend == DDP_BACKEND and small is model.assign_node and model.place is model.assign
        )
        action = "remove" if base == target and top is call and not wrapped_in_place else "inline"
        return _checked(ctx, _Plan(site, holder, index, model, action))
    return (
        "nn.DataParallel(...) inside a larger expression: file not migrated; write it as "
        "`model = nn.DataParallel(model)` or " + _HOW
    )


def _checked(ctx: Context, plan: _Plan) -> Union[_Plan, str]:
    if ctx.backend != HOROVOD_BACKEND and not any(m is plan.model for m, _ in ctx.plan.wrapped):
        if ctx.backend == FSDP_BACKEND:
            return (
                f"{plan.model.name} is not sharded with fully_shard (DST121 not selected?), so "
                "nn.DataParallel cannot go: file not migrated"
            )
        return (
            f"{plan.model.name} is not wrapped in DistributedDataParallel (DST101 not selected?), so "
            "nn.DataParallel cannot go: file not migrated"
        )
    return plan


def _not_trained(a, name: Optional[str], site) -> str:
    where = f"in {site.scope.name.value}()" if isinstance(site.scope, cst.FunctionDef) else "at module level"
    what = name or "an expression"
    if name is not None and any(o.call.scope is site.scope and name in o.models for o in a.optimizers):
        return (
            f"nn.DataParallel wraps {name}, whose construction distify cannot find {where} (see DST905): "
            "file not migrated; " + _HOW
        )
    return (
        f"nn.DataParallel wraps {what}, which no optimizer {where} trains: file not migrated "
        "(only the trained model's wrapper is replaced); " + _HOW
    )


def _small_statements(stmt) -> Tuple[Optional[cst.CSTNode], List[cst.BaseSmallStatement]]:
    if isinstance(stmt, cst.SimpleStatementLine):
        return stmt, list(stmt.body)
    body = getattr(stmt, "body", None)
    if isinstance(body, cst.SimpleStatementSuite):
        return body, list(body.body)
    return None, []


def _chain_reaches(a, top: cst.BaseExpression, call: cst.Call) -> bool:
    """`call` is `top` itself or the start of a chain like `call.to(device).train()`."""
    e = top
    while e is not call:
        if isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value in SELF_RETURNING:
            e = e.func.value
        else:
            return False
    return True


def _root(a, expr: cst.BaseExpression) -> cst.BaseExpression:
    """`model` of `model.to(device)`, `nn.DataParallel(model).cuda()` and the like."""
    while True:
        inner = data_parallel_module(a.qualname, expr)
        if inner is not None:
            expr = inner
        elif same_object(expr) is not expr:
            expr = same_object(expr)
        else:
            return expr


def _model_named(a, name: Optional[str], site) -> Optional[Model]:
    if name is None:
        return None
    f = a.facts
    here = f.instance(site.scope) if f.instance_attr(site.scope, name) is not None else None
    for m in a.models:
        if here is not None and m.cls is here[1] and f.canonical(m.scope, m.name) == f.canonical(site.scope, name):
            return m  # the same attribute of the instance, however each method spells it
        if m.name == name and m.scope is site.scope:
            return m
    return None


def _unwrap_call(node: cst.Call) -> cst.BaseExpression:
    """`nn.DataParallel(x, device_ids=...)` -> `x` (parenthesised when it is not an atom)."""
    value = next(x.value for x in node.args if x.keyword is None or x.keyword.value == "module")
    atom = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)
    if not isinstance(value, atom) and not value.lpar:
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return value


def _remove(ctx: Context, plans: List[_Plan]) -> Set[cst.CSTNode]:
    """Drop the statements of `remove` plans; an else-less `if` left with nothing but prints goes
    too. Returns the `if`s removed."""
    a = ctx.anatomy
    lines: Dict[cst.CSTNode, List[_Plan]] = {}
    for plan in plans:
        if plan.action == "remove":
            lines.setdefault(plan.holder, []).append(plan)
    removed_ifs: Set[cst.CSTNode] = set()
    whole: Set[cst.CSTNode] = set()  # lines / suites all of whose statements go
    for holder, group in lines.items():
        rest = [s for i, s in enumerate(holder.body) if i not in {p.index for p in group}]
        if all(_chatter_small(a, s) for s in rest):
            # `print("using", n, "GPUs"); model = nn.DataParallel(model)`: the print goes with it
            # (left alone on its line, the next run would put it under a rank-0 guard)
            whole.add(holder)
            _forget(ctx, rest)
    # an `if` whose body is removed statements and prints only: remove the `if`
    candidates = []
    for holder in lines:
        if holder not in whole:
            continue
        if isinstance(holder, cst.SimpleStatementSuite):  # `if cond: model = nn.DataParallel(model)`
            candidates.append(lines[holder][0].stmt)
        elif ctx.enclosing_if(holder) is not None:
            candidates.append(ctx.enclosing_if(holder))
    for node in candidates:
        if node in removed_ifs or not _removable_if(a, node):
            continue
        body = node.body
        if isinstance(body, cst.IndentedBlock):
            rest = [s for s in body.body if s not in whole]
            if not all(_chatter(a, s) for s in rest):
                continue
            for s in rest:
                ctx.edits.guards.pop(s, None)
                _forget(ctx, s.body)
        removed_ifs.add(node)
        ctx.edits.remove(node)
    for holder, group in lines.items():
        stmt = group[0].stmt
        if stmt in removed_ifs or any(p in removed_ifs for p in a.stmt_parent.get(stmt, ())):
            continue
        if holder in whole and isinstance(holder, cst.SimpleStatementLine):
            ctx.edits.remove(holder)
            continue
        drop = set(range(len(holder.body))) if holder in whole else {p.index for p in group}

        def keep(n, drop=drop):
            body = [s for i, s in enumerate(n.body) if i not in drop]
            if not body:
                return n.with_changes(body=[cst.Pass()])
            body[-1] = body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            return n.with_changes(body=body)

        ctx.edits.replace(holder, keep)
    return removed_ifs


def _removable_if(a, node) -> bool:
    """An `if` without `else`/`elif`, not itself an `elif`, whose test binds no name."""
    if not isinstance(node, cst.If) or node.orelse is not None:
        return False
    parents = a.stmt_parent.get(node, ())
    if parents and isinstance(parents[-1], cst.If) and parents[-1].orelse is node:
        return False
    found = []

    class Walrus(cst.CSTVisitor):
        def visit_NamedExpr(self, n):
            found.append(n)

    node.test.visit(Walrus())
    return not found


def _chatter(a, stmt) -> bool:
    """`print(...)` / `logger.info(...)` lines: what an `if` choosing DataParallel says about it."""
    return isinstance(stmt, cst.SimpleStatementLine) and all(_chatter_small(a, s) for s in stmt.body)


def _chatter_small(a, small) -> bool:
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return False
    func = small.value.func
    if isinstance(func, cst.Name) and func.value == "print":
        return True
    return isinstance(func, cst.Attribute) and func.attr.value in ("info", "debug", "warning") and _logger(a, func)


def _logger(a, func: cst.Attribute) -> bool:
    """`logging.info(...)`, or a method of a logger the script got from a logging library
    (`log = logging.getLogger(__name__)`): known by what the receiver is, not by its name."""
    if (a.qualname(func) or "").startswith(LOGGING_MODULES):
        return True
    receiver = dotted(func.value)
    return receiver is not None and any(
        len(asg.targets) == 1 and dotted(asg.targets[0].target) == receiver and isinstance(asg.value, cst.Call)
        and (a.qualname(asg.value.func) or "") in LOGGER_FACTORIES
        for asg, _stmt, _scope, _cls in a.facts.assigns
    )


def _forget(ctx: Context, smalls) -> None:
    """Removed prints: drop the reports other rules made for them."""
    spots = {ctx.anatomy.position(small.value) for small in smalls} - {(0, 0)}
    ctx.findings = [f for f in ctx.findings if (f.line, f.col) not in spots]


def _drop_module(ctx: Context, plans: List[_Plan], everywhere: bool) -> None:
    """`model.module` -> `model` where the model is no longer wrapped.

    Horovod (`everywhere`): after the DataParallel, wherever the model reaches. DDP: only between
    the DataParallel and the DDP wrap (after it, DDP's own `.module` serves)."""
    a = ctx.anatomy
    anchors = {id(m): anchor for m, anchor in ctx.plan.wrapped}
    done: Set[int] = set()
    for plan in plans:
        m = plan.model
        if everywhere:
            targets = reaching_scopes(ctx, m, plan.stmt)
        else:
            targets = {(id(plan.scope), m.name): (plan.stmt, "module")}
        anchor = anchors.get(id(m))
        for attr, scope, cls, stmt in a.attr_uses:
            if attr.attr.value != "module" or id(attr) in done:
                continue
            name = held_name(attr.value)
            how = targets.get((id(scope), name))
            if how is None:
                continue
            after, _ = how
            if after is not None and not a.is_before(after, stmt):
                continue
            if not everywhere and (anchor is None or a.is_before(anchor, stmt)):
                continue
            done.add(id(attr))
            ctx.edits.replace(attr, lambda n: n.value)
            ctx.report("DST902", attr, f"{name}.module -> {name}: the model is no longer wrapped here")


def _drop_import(ctx: Context, replaced: List[cst.CSTNode]) -> None:
    """`from torch.nn import DataParallel` goes when every use of the name was replaced."""
    a = ctx.anatomy
    for local, qualified in a.aliases.items():
        if qualified not in DATA_PARALLEL or "." in local:
            continue
        gone = sum(1 for n in replaced if isinstance(n, cst.Name) and n.value == local)
        if not gone or gone != _name_uses(a.module, local):
            continue
        for stmt in a.stmt_parent:
            if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
                continue
            imp = stmt.body[0]
            if not isinstance(imp, cst.ImportFrom) or isinstance(imp.names, cst.ImportStar):
                continue
            names = [x for x in imp.names if dotted(x.asname.name if x.asname else x.name) != local]
            if len(names) == len(imp.names):
                continue
            if not names:
                ctx.edits.remove(stmt)
            else:
                if not imp.lpar:
                    names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                ctx.edits.replace(imp, lambda n, names=names: n.with_changes(names=names))


def _name_uses(module: cst.Module, name: str) -> int:
    """How often `name` is read as a variable (not as an attribute, not in imports)."""
    count = 0

    class V(cst.CSTVisitor):
        def visit_Import(self, node) -> bool:
            return False

        def visit_ImportFrom(self, node) -> bool:
            return False

        def visit_Attribute(self, node) -> bool:
            node.value.visit(self)
            return False

        def visit_Name(self, node) -> None:
            nonlocal count
            count += node.value == name

    module.visit(V())
    return count


def _class_references(a) -> List[Tuple[cst.CSTNode, bool]]:
    """Uses of the DataParallel class other than calling it: (node, is isinstance()'s class)."""
    out: List[Tuple[cst.CSTNode, bool]] = []
    # a name spells the class only when an import binds it to the class itself, an attribute chain
    # only when it resolves to it (the anatomy lists every attribute of every statement, but for an
    # inline runtime class, which it does not enter): with neither, no node can be one, and the
    # module is not walked (most scripts)
    if a.standalone_runtime is None and not any(q in DATA_PARALLEL for q in a.aliases.values()) and not any(
        a.qualname(attr) in DATA_PARALLEL for attr, _scope, _cls, _stmt in a.attr_uses
    ):
        return out
    stack: List[cst.CSTNode] = []  # the nodes around the one visited (trivia aside)

    def visit(node: cst.CSTNode) -> None:
        if isinstance(node, (cst.Name, cst.Attribute)) and a.qualname(node) in DATA_PARALLEL:
            parent = stack[-1] if stack else None
            if not (isinstance(parent, cst.Call) and parent.func is node):
                out.append((node, _isinstance_class(stack, node)))
            return
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            return
        stack.append(node)
        for child in children(node):
            visit(child)
        stack.pop()

    visit(a.module)
    return out


def _isinstance_class(stack: List[cst.CSTNode], node: cst.CSTNode) -> bool:
    """`node` is isinstance()'s second argument, or an element of a tuple that is."""
    i = len(stack) - 1
    if i >= 1 and isinstance(stack[i], cst.Element) and isinstance(stack[i - 1], cst.Tuple):
        node, i = stack[i - 1], i - 2
    if i < 1 or not isinstance(stack[i], cst.Arg) or stack[i].value is not node:
        return False
    call = stack[i - 1]
    return (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Name)
        and call.func.value == "isinstance"
        and len(call.args) == 2
        and call.args[1] is stack[i]
    )


RULE = DataParallel()
