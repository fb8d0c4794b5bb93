"""Facts about a script's data-parallel machinery, read from its code (the input of ``distify lint``,
or a migration's output): which names hold a module a DDP/FSDP wrapper wraps or FSDP shards, the
names bound to the same module objects, and which loops each loader feeds, with its sampler.

The audit checks (DST95x) and the rules that also check distributed code (DST911) ask these; they
are facts of the tree as it is. What the rules of a migration *decide* to wrap or shard, before
the edits exist in any tree, is the run's plan (``ctx.plan.wrapped`` / ``ctx.plan.sharded()``,
``distify.plan``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import libcst as cst

from distify.audit import HVD_OPTIMIZER
from distify.dataflow import ref_text
from distify.facts import same_object
from distify.model_build import module_container, through_compile
from distify.records import DDP, FSDP1, FULLY_SHARD, CallSite, Loader
from distify.syntax import all_nodes, arg, dotted, path_to

if TYPE_CHECKING:  # pragma: no cover
    from distify.anatomy import Anatomy

FSDP = FULLY_SHARD | FSDP1


def sharded_root(a: Anatomy, c: CallSite) -> Optional[str]:
    """The name of the module a ``fully_shard`` call shards: its argument (``fully_shard(model)``,
    ``fully_shard(model.to(d))``), or, in a loop over the modules a container holds
    (``for layer in model: fully_shard(layer)``, ``model.values()``), the container ``model`` when
    it is bound to an ``nn.ModuleList`` / ``nn.ModuleDict``: a module with no parameter of its own."""
    m = arg(c.call, 0, "module")
    root = _root_name(m.value) if m is not None else None
    loop = next((s for s in reversed(a.stmt_parent.get(c.stmt, ())) if isinstance(s, cst.For)), None)
    if root is None or loop is None or dotted(loop.target) != root:
        return root
    held = held_modules(loop.iter)
    b = a.reaching_binding(c.scope, held, loop) if held else None
    value = _binding_value(b.stmt, held) if b is not None else None
    if value is not None and module_container(a.qualname, value) is not None:
        return held
    return root


def held_modules(expr: cst.BaseExpression) -> Optional[str]:
    """`model` for the modules of a container as they are iterated: `model`, `model.values()`."""
    if isinstance(expr, cst.Call) and not expr.args and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "values":
        expr = expr.func.value
    return dotted(expr)


def wrapped_models(a: Anatomy) -> Tuple[Set[str], Set[str]]:
    """(names bound to a DDP/FSDP wrapper, names of the modules wrapped): ``model = DDP(net, ...)``
    gives ({"model"}, {"net"}); ``fully_shard(model)`` gives ({"model"}, {"model"})."""
    wrappers: Set[str] = set()
    inner: Set[str] = set()
    for c in a.calls:
        if c.qualname not in DDP and c.qualname not in FSDP:
            continue
        root = sharded_root(a, c)
        if root:
            inner.add(root)
        target = assigned_to(c)
        if target:
            wrappers.add(target)
        elif c.qualname in FSDP and root:
            wrappers.add(root)  # fully_shard(model) shards in place
    return wrappers, same_modules(a, inner)


def sharded_models(a: Anatomy) -> Set[str]:
    """Names bound to a module FSDP shards (``fully_shard(model)`` in place, ``model = FSDP(net)``),
    with the names bound to the same module objects: their forward and backward are collectives
    (all-gather, reduce-scatter) and their parameters and ``state_dict()`` values are shards."""
    cached = a.__dict__.get("_sharded_models")
    if cached is not None:
        return cached
    names: Set[str] = set()
    for c in a.calls_to(FSDP):
        if c.qualname in FULLY_SHARD:
            root = sharded_root(a, c)
        else:
            m = arg(c.call, 0, "module")
            root = dotted(m.value) if m is not None else None
        target = assigned_to(c)
        if target:
            names.add(target)
        if root and (c.qualname in FULLY_SHARD or target == root):
            names.add(root)
        flow = getattr(a, "flow_from", None)
        if flow is not None:
            # the names callers bind the sharded module to when a function returns it (`trained =
            # train(model)`), `return model.module` included (gone under FSDP); not the parameters
            # it is handed to (a helper's own names are not sharded in every other scope)
            for start in filter(None, {root if c.qualname in FULLY_SHARD else None, target}):
                for ref in (start, start + ".module"):
                    for scope, name in flow(c.scope, ref):
                        params = [p.name.value for p in scope.params.params] if isinstance(scope, cst.FunctionDef) else []
                        if name not in params and "." not in name:
                            names.add(name)
    out = same_modules(a, names)
    a.__dict__["_sharded_models"] = out
    return out


def built_into(a: Anatomy, c: CallSite) -> Optional[cst.Call]:
    """The call that `c`'s value goes straight into as its first argument, when `c` has no name of
    its own (``Schedule(optim.Adam(...), ...)``, ``hvd.DistributedOptimizer(optim.Adam(...))``)."""
    path = path_to(c.stmt, c.call)
    if path is None or len(path) < 3:
        return None
    holder, outer = path[-2], path[-3]
    if isinstance(holder, cst.Arg) and isinstance(outer, cst.Call) and outer.args and outer.args[0] is holder:
        return outer
    return None


def wrapped_where_built(a: Anatomy, c: CallSite) -> bool:
    """`c` (an optimizer) is built straight into ``hvd.DistributedOptimizer(...)``."""
    outer = built_into(a, c)
    return outer is not None and a.qualname(outer.func) in HVD_OPTIMIZER


def same_modules(a: Anatomy, names: Set[str]) -> Set[str]:
    """`names` and the names bound to the same module objects: `raw_model = model`,
    `model = torch.compile(raw)` (the compiled module shares the plain one's parameters),
    `model = net.to(device)`."""
    pairs = []
    for stmt in a.stmt_parent:
        # every statement of a line (`k = 0; raw = model`)
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and dotted(small.targets[0].target):
                v = same_object(through_compile(a.qualname, small.value))
                source = dotted(v)
                if source:
                    pairs.append((dotted(small.targets[0].target), source))
    out = set(names)
    grown = True
    while grown:
        grown = False
        for x, y in pairs:
            if (x in out) != (y in out):
                out |= {x, y}
                grown = True
    return out


def _root_name(expr: cst.BaseExpression) -> Optional[str]:
    """`net` for `net`, `net.to(device)`, `Net().cuda()` -> None; `self.model` for `self.model.to(d)`."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        expr = expr.func.value
    return dotted(expr)


def assigned_to(c: CallSite) -> Optional[str]:
    """The name a statement binds the call's value to, when the call is the whole value."""
    stmt = c.stmt
    if isinstance(stmt, cst.SimpleStatementLine):
        # any statement of the line (`device = ...; model = DDP(net)`), not only a line's only one
        for small in stmt.body:
            if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is c.call:
                targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                if len(targets) == 1:
                    return dotted(targets[0])
    return None


def container_of(c: CallSite) -> Optional[str]:
    """The name a statement binds a value holding the call to: ``loaders = {x: DataLoader(...)
    for x in ...}`` or ``loaders = [DataLoader(a), DataLoader(b)]`` -> "loaders", in any statement
    of the line (``k = 0; loaders = [...]``)."""
    small = _statement_of(c.stmt, c.call)
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and small.value is not c.call:
        return dotted(small.targets[0].target)
    return None


def _statement_of(stmt: cst.CSTNode, node: cst.CSTNode) -> Optional[cst.BaseSmallStatement]:
    """The statement of the line `stmt` that holds `node` (a line may hold several: `a = 1; b = f()`)."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return None
    if len(stmt.body) == 1:
        return stmt.body[0]
    return next((small for small in stmt.body if any(n is node for n in all_nodes(small))), None)


def _binding_value(stmt: cst.CSTNode, name: str) -> Optional[cst.BaseExpression]:
    """The value the line `stmt` binds `name` to with a plain assignment, in any of its statements."""
    for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
        if isinstance(small, cst.Assign) and any(
            isinstance(n, cst.Name) and n.value == name for t in small.targets for n in all_nodes(t.target)
        ):
            return small.value  # `bar = tqdm(loader)`, also `bar, n = tqdm(loader), 0`: the whole value
    return None


def sampler_of(a: Anatomy, loader: Loader) -> Tuple[bool, Optional[cst.Call]]:
    """(the loader is given a sampler or batch_sampler, the DistributedSampler(...) call it uses)."""
    call = loader.call.call
    has = arg(call, 5, "sampler") is not None or arg(call, 6, "batch_sampler") is not None
    return has, a.sampler_call(loader)


def _iter_refs(a: Anatomy, loop: cst.CSTNode, scope) -> Set[str]:
    """References a loop's iterable is made of: every dotted name and constant subscript in it
    (``zip(a, b)``, ``tqdm(loader)``, ``loaders[phase]`` -> "loaders"), and, one step back, those
    of the value a local name was bound to (``pbar = tqdm(loader)`` then ``for b in pbar``)."""
    out: Set[str] = set()
    expr = loop.iter if isinstance(loop, cst.For) else loop.test
    todo = [(expr, loop, 0)]
    while todo:
        e, at, depth = todo.pop()
        for n in all_nodes(e, skip_nested=True):
            r = ref_text(n)
            if r is None:
                continue
            out.add(r)
            if isinstance(n, cst.Subscript):
                base = dotted(n.value)
                if base:
                    out.add(base)
            if depth < 2 and isinstance(n, cst.Name):
                b = a.reaching_binding(scope, n.value, at)
                value = _binding_value(b.stmt, n.value) if b is not None and b.kind == "assign" else None
                if value is not None:
                    todo.append((value, b.stmt, depth + 1))
    return out


def loader_loops(a: Anatomy) -> Dict[Loader, List[Tuple[cst.CSTNode, bool]]]:
    """Each loader with the loops that iterate it, and whether each trains. Broader than the
    anatomy's batch loops: every reference in the loop's iterable counts (zip, dict by phase, a
    progress bar bound first), a loader kept in a container is reached through it, and a
    function nested in the one that binds the loader sees it (``def test(): for x in loader``)."""
    cached = a.__dict__.get("_loader_loops")
    if cached is not None:
        return cached
    nested: Dict[int, List[cst.FunctionDef]] = {}
    for fn in a.all_functions():
        home = a.stmt_scope.get(fn)
        while isinstance(home, cst.FunctionDef):
            nested.setdefault(id(home), []).append(fn)
            home = a.stmt_scope.get(home)
    refs: Dict[Loader, Set[Tuple[int, str]]] = {}
    for loader in a.loaders:
        pairs = [(s, r) for s, r in loader.refs]
        holder = container_of(loader.call)
        if holder:
            pairs.append((loader.call.scope, holder))
            if isinstance(loader.call.scope, cst.Module):
                pairs += [(f, holder) for f in a.all_functions()]
        keys = {(id(s), r) for s, r in pairs}
        for s, r in pairs:  # closures: nested functions that do not bind the name themselves
            for fn in nested.get(id(s), ()):
                if "." not in r and r.split("[")[0] not in a.bindings(fn) and r not in a.facts.params(fn):
                    keys.add((id(fn), r))
        refs[loader] = keys
    training = set(map(id, a.facts.training_loops()))
    out: Dict[Loader, List[Tuple[cst.CSTNode, bool]]] = {}
    for loop in a.stmt_parent:
        if not isinstance(loop, cst.For):
            continue
        scope = a.stmt_scope.get(loop)
        names = _iter_refs(a, loop, scope)
        for loader, keys in refs.items():
            if any((id(scope), r) in keys for r in names):
                out.setdefault(loader, []).append((loop, id(loop) in training and loop not in loader.untrained))
    for loader in a.loaders:
        for bl in loader.batch_loops:
            if bl.loop not in [l for l, _ in out.get(loader, [])]:
                out.setdefault(loader, []).append(
                    (bl.loop, bl.trains or (id(bl.loop) in training and bl.loop not in loader.untrained))
                )
    a.__dict__["_loader_loops"] = out
    return out


def feeding_loaders(a: Anatomy) -> Dict[Loader, List[cst.CSTNode]]:
    """Each loader whose batches reach a training loop, with those loops (see ``loader_loops``)."""
    out: Dict[Loader, List[cst.CSTNode]] = {}
    for loader, loops in loader_loops(a).items():
        trained = [l for l, trains in loops if trains]
        if trained:
            out[loader] = trained
    return out
