"""Where a training loop's batches come from when no loader of the file is seen: loaders another
module builds, training loops whose data no fact traces, and loaders over a stream (an
IterableDataset) (part of the anatomy, see anatomy.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Set

import libcst as cst

from distify.syntax import all_nodes, dotted
from distify.library import known
from distify.names import row_of, seeds_sharded, star_import
from distify.rank import RANK_ENV
from distify.dataflow import _data_of, _first_items, _loop_var, _returns, ref_text
from distify.records import DIST_SAMPLER, BatchLoop, CallSite, EpochLoop, Scope, assigned_name
from distify.training import drawn_from, endless_loop
from distify.values import Record

if TYPE_CHECKING:
    from distify.anatomy import Anatomy


class ForeignLoader(Record):
    """A training loop's data built by a function imported from another module (`from utils import
    get_training_dataloader`): distify cannot see or shard that loader."""

    __slots__ = ("loop", "name", "call", "builder", "binding", "resharded", "epochs", "consumer", "__dict__")
    loop: BatchLoop
    name: str  # how the building scope names it
    call: "CallSite"  # the call that builds it
    builder: str  # its qualified name ("utils.get_training_dataloader")
    # the statement that binds `name` to it when it is a plain `name = builder(...)` (or a tuple
    # of names): the place to re-shard it; None when the value is bound otherwise
    binding: Optional[cst.SimpleStatementLine]
    # the script already re-shards it there (`name = runtime.shard_loader(name)`)
    resharded: bool
    # the loops that run its passes (`for epoch in ...` around the batch loop or around a call of
    # the function that holds it), `loader_ref` spelling it where each loop runs
    epochs: List["EpochLoop"]
    # the training loop that draws the batches when `loop` is a generator's pass over the loader
    # (`batches = infinite(loader)` ... `next(batches)`)
    consumer: Optional[BatchLoop]

    def __init__(self, loop: BatchLoop, name: str, call: "CallSite", builder: str,
                 binding: Optional[cst.SimpleStatementLine] = None, resharded: bool = False,
                 epochs: Optional[List["EpochLoop"]] = None, consumer: Optional[BatchLoop] = None) -> None:
        self._set(loop, name, call, builder, binding, resharded, [] if epochs is None else epochs, consumer)


def foreign_loaders(anatomy: "Anatomy") -> List[ForeignLoader]:
    """Training batch loops not fed by any DataLoader of this file whose iterable is bound (in the
    loop's function, in a caller through a parameter, or as a global) from a call of a function
    imported from a non-torch module; also through a generator of this file that passes over the
    loader it is handed (`batches = infinite(get_loader(...))`): its pass loop, whose passes are
    counted there."""
    a = anatomy
    own = {id(bl) for l in a.loaders if l.role != "shared" for bl in l.batch_loops}
    gens = {id(bl.scope): bl for bl in a.batch_loops if bl.via == "pass" and id(bl) not in own}
    out: List[ForeignLoader] = []
    seen = set()
    for bl in _training_loops(a):
        if id(bl) in own or bl.via == "pass":
            continue
        for site, name, via in _origin_calls(a, bl.scope, bl.ref, 0, ()):
            fn = a.facts.callee(site.call, site.scope)
            if fn is not None and id(fn) in gens:
                out += _through_generator(a, bl, site, gens[id(fn)], seen)
                continue
            q = _foreign_builder(a, site)
            if q is None:
                continue
            if _is_reshard(site.call) or (bl.loop, id(site.call), name) in seen:
                continue  # `loader = runtime.shard_loader(...)` bound before the builder's own line
            seen.add((bl.loop, id(site.call), name))
            stmt = site.stmt if isinstance(site.stmt, cst.SimpleStatementLine) else None
            out.append(ForeignLoader(bl, name, site, q, stmt, _resharded(a, site, name), _passes_of(a, bl, via)))
    return out


def counts(expr: cst.BaseExpression, aliases_q) -> bool:
    """A loop over `expr` counts (epochs, iterations, phases) rather than reading data: range(),
    trange(), itertools.count(), arange(), a literal of constants, a number, through
    enumerate()/tqdm()/iter()."""
    if isinstance(expr, (cst.Integer, cst.SimpleString, cst.ConcatenatedString)):
        return True
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        return all(
            isinstance(e, cst.Element) and isinstance(e.value, (cst.Integer, cst.Float, cst.SimpleString, cst.Name, cst.Attribute))
            for e in expr.elements
        )
    if not isinstance(expr, cst.Call):
        return False
    row = row_of(aliases_q, expr.func)
    if row is not None and row.kind == "counter":
        return True
    inner = _first_items(expr, aliases_q)
    return inner is not None and counts(inner, aliases_q)


class UntracedSource(Record):
    """A training loop whose batches come from something distify cannot trace to a DataLoader
    (of this file or built by another module) nor to a random draw: a call of an unknown function
    iterated directly (`for x, y in utils.get_loader(...)`), a generator fed such a call, a
    collection of this file's own. Nothing shards it, so every rank may read all of it."""

    __slots__ = ("loop", "source", "scope", "__dict__")
    loop: cst.CSTNode  # the training loop
    source: cst.BaseExpression  # what it iterates or draws from, as the loop's scope spells it
    scope: Scope

    def __init__(self, loop: cst.CSTNode, source: cst.BaseExpression, scope: Scope) -> None:
        self._set(loop, source, scope)


def untraced_sources(anatomy: "Anatomy") -> List[UntracedSource]:
    """The innermost training loops (see ``Facts.training_loops``) whose batches no fact traces:
    neither to a loader of this file, nor to one another module builds (``foreign_loaders``), nor
    to a value that names the rank (a split by hand). A loop over a counter (``counts``) that draws
    nothing with next() reads no data of its own (random draws are ``global_draws``' concern)."""
    a = anatomy
    cached = a.__dict__.get("_untraced_sources")
    if cached is not None:
        return cached
    traced = {id(bl) for l in a.loaders for bl in l.batch_loops}
    traced |= {id(f.consumer or f.loop) for f in foreign_loaders(a)}
    own_refs = {l.target for l in a.loaders if l.target} | {
        bl.ref for l in a.loaders for bl in l.batch_loops
    }
    # names a script re-shards itself (`loader = runtime.shard_loader(loader)`)
    own_refs |= {n for c in a.calls if _is_reshard(c.call) or seeds_sharded(c) for n in [assigned_name(c.stmt, c.call)] if n}
    loops = a.facts.training_loops()
    training = [l for l in loops if isinstance(l, cst.For)]
    around = {id(p) for l in loops for p in a.stmt_parent.get(l, ()) if p is not l}
    out: List[UntracedSource] = []
    for loop in loops:
        if isinstance(loop, cst.While) and id(loop) not in around:
            out += _untraced_draws(a, loop, own_refs)
    by_loop: Dict[int, List[BatchLoop]] = {}
    for bl in a.batch_loops:
        if bl.via != "pass":
            by_loop.setdefault(id(bl.loop), []).append(bl)
    for loop in training:
        if id(loop) in around:
            continue  # an epoch loop around the batch loop
        scope = a.stmt_scope.get(loop, a.module)
        loops = by_loop.get(id(loop), [])
        drawn = [bl for bl in loops if bl.via == "next"]
        iterated = [bl for bl in loops if bl.via == "for"]
        if not counts(loop.iter, a.qualname):
            if iterated:
                for bl in iterated:
                    if id(bl) not in traced and not _bound_to_known_data(a, scope, bl.ref, own_refs):
                        out.append(UntracedSource(loop, _ref_node(loop.iter, bl.ref), scope))
            elif not _mentions_any(loop.iter, own_refs) and not a.mentions_rank(loop.iter):
                out.append(UntracedSource(loop, _data_of(loop.iter, a.qualname), scope))
        for bl in drawn:
            if id(bl) not in traced and not _bound_to_known_data(a, scope, bl.ref, own_refs):
                out.append(UntracedSource(loop, _ref_node(loop, bl.ref), scope))
    a.__dict__["_untraced_sources"] = out
    return out


def _untraced_draws(a: "Anatomy", loop: cst.While, own_refs: Set[str]) -> List[UntracedSource]:
    """A training `while` loop that draws its batches with `next(<ref>)` (`batch = next(data_iter)`,
    re-made with `iter(loader)` on StopIteration): each drawn reference no fact traces to a loader
    of this file, to one the script re-shards, or to a split by rank."""
    scope = a.stmt_scope.get(loop, a.module)
    out, seen = [], set()
    for c in a.calls:
        v = drawn_from(c.call) if c.scope is scope and loop in c.parents else None
        ref = ref_text(v) if v is not None else None
        if ref is None or ref in seen or _bound_to_known_data(a, scope, ref, own_refs):
            continue
        seen.add(ref)
        out.append(UntracedSource(loop, v, scope))
    return out


def _mentions_any(expr: cst.CSTNode, refs: Set[str]) -> bool:
    return any(dotted(n) in refs for n in all_nodes(expr) if isinstance(n, (cst.Name, cst.Attribute)))


def _ref_node(node: cst.CSTNode, ref: str) -> cst.CSTNode:
    """The first node under `node` that spells `ref` (for the warning's position), else `node`."""
    for n in all_nodes(node):
        if isinstance(n, (cst.Name, cst.Attribute, cst.Subscript)) and ref_text(n) == ref:
            return n
    return node


def _bound_to_known_data(a: "Anatomy", scope: Scope, ref: str, own_refs: Set[str]) -> bool:
    """`ref` is one of this file's loader names (`own_refs`: also one a closure reads), or is
    bound (in `scope`, else at module level) to a value that names the rank (`shard =
    data[rank::world]`, `loader = get_loader(rank=rank)`), or that comes from this file's own
    loaders, which the rules shard where they are built: a loader's name, or a call of a function
    of this file that builds one (`batches = get_loaders(32)[0]`)."""
    if ref in own_refs:
        return True
    builders = {id(l.call.scope) for l in a.loaders if isinstance(l.call.scope, cst.FunctionDef)}
    for sc in (scope, a.module):
        if sc is None:
            continue
        for b in a.facts.bindings(sc).get(ref.split(".")[0].split("[")[0], ()):
            if b.kind != "assign":
                continue
            if a.mentions_rank(b.stmt) or _mentions_any(b.stmt, own_refs):
                return True
            for n in all_nodes(b.stmt):
                if isinstance(n, cst.Call):
                    fn = a.facts.callee(n, sc)
                    if fn is not None and id(fn) in builders:
                        return True
    return False


def _foreign_builder(a: "Anatomy", site: "CallSite") -> Optional[str]:
    """The qualified name of the function `site` calls when another module (not torch) defines
    it, else None."""
    here = a.functions.named(dotted(site.call.func))
    if here is not None:  # a function of this file: only one that builds training and evaluation loaders alike
        return here.name.value if shared_factory(a, here) else None
    cls = a.classes.named(dotted(site.call.func)) if site.qualname is None else None
    if cls is not None:  # a class of this file deriving from a loader: judged as one of another module
        return cls.name.value if _loader_class(a, cls) else None
    q = site.qualname or star_import(a.star_modules, site.call.func, a.name_bindings) or ""
    if not q or q.split(".")[0] in ("torch", "builtins", "distify"):
        return None
    return None if (known(q) is not None and known(q).kind == "loader") else q  # the table says how a library loader shards


def _loader_class(a: "Anatomy", cls: cst.ClassDef) -> bool:
    """`cls` (a class of this file) derives from a library loader, through its bases here and in
    the project (``distify.program.loader_chain``, the one walk for both)."""
    from distify.program import _DEPTH, loader_chain  # only for a class called where batches come from

    reach = getattr(a.facts, "project", None)
    prog = reach.program() if reach is not None and hasattr(reach, "program") else None
    return loader_chain(a, a.aliases, cls, (lambda q: prog._class(q, _DEPTH)) if prog is not None else None) is not None


def shared_factory(a: "Anatomy", fn: cst.FunctionDef) -> bool:
    """`fn` builds a loader that one call of it hands to training and another to evaluation
    (``create_dataloader_v1(train_text, shuffle=True)`` and ``(val_text, shuffle=False)``): its
    DataLoader cannot take a sampler for one role only, so each training call's loader is
    re-sharded where it is bound."""
    return any(l.role == "shared" and l.call.scope is fn for l in a.loaders)


def resharded_at_its_calls(a: "Anatomy", loader) -> bool:
    """`loader` is built by a factory of this file shared by training and evaluation, and every
    training call's result is re-sharded where it is bound (``runtime.shard_loader``): sharded."""
    fn = loader.call.scope
    if loader.role != "shared" or not isinstance(fn, cst.FunctionDef):
        return False
    mine = [f for f in foreign_loaders(a) if a.functions.named(f.builder) is fn]
    return bool(mine) and all(f.resharded or switched_on(a, f.call) for f in mine)


def _through_generator(a: "Anatomy", consumer: BatchLoop, site: "CallSite", gen: BatchLoop, seen: set) -> List[ForeignLoader]:
    """The foreign loaders handed (by name) to a generator of this file whose pass loop `gen`
    reads them, the generator's object drawn by the training loop `consumer`."""
    fn = gen.scope
    v = a.facts.bound_value(site.call, fn, gen.ref)
    if v is None or dotted(v) is None:
        return []
    out = []
    for origin, name, _via in _origin_calls(a, site.scope, dotted(v), 0, ()):
        q = _foreign_builder(a, origin)
        if q is None:
            continue
        if _is_reshard(origin.call) or (gen.loop, id(origin.call), name) in seen:
            continue
        seen.add((gen.loop, id(origin.call), name))
        stmt = origin.stmt if isinstance(origin.stmt, cst.SimpleStatementLine) else None
        outer = [p for p in a.stmt_parent.get(gen.loop, ()) if isinstance(p, (cst.For, cst.While)) and p is not gen.loop]
        passes = [EpochLoop(gen.loop, fn, gen.cls, None, gen.ref, counted=gen.loop)] if outer and endless_loop(outer[-1], a.qualname) else []
        out.append(ForeignLoader(gen, name, origin, q, stmt, _resharded(a, origin, name), passes, consumer=consumer))
    return out


def _is_reshard(call: cst.Call) -> bool:
    """`runtime.shard_loader(x, ...)` (distify's runtime or its inline twin)."""
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "shard_loader"


def _resharded(a: "Anatomy", site: "CallSite", name: str) -> bool:
    """The scope that binds `name` from `site` also rebinds it through ``shard_loader(name)``."""
    for c in a.calls:
        if c.scope is site.scope and _is_reshard(c.call) and c.call.args:
            if dotted(c.call.args[0].value) == name and assigned_name(c.stmt, c.call) == name:
                return True
    return False


def switched_on(a: "Anatomy", site: "CallSite") -> bool:
    """`site` calls a factory of this module (or of the project view) whose loader gets a
    DistributedSampler when one of its parameters is true (``distify.loader_switch``), and passes a
    constant true for it: the loader it returns is sharded."""
    from distify import loader_switch

    fn = a.functions.named(dotted(site.call.func))
    for l in a.loaders if fn is not None else ():
        sw = loader_switch.switch(a, l) if l.call.scope is fn else None
        if sw is not None and loader_switch.setting(a, sw, site.call) == loader_switch.ON:
            return True
    return False


def _passes_of(a: "Anatomy", bl: BatchLoop, via=()) -> List["EpochLoop"]:
    """The loop that runs the passes of a training batch loop: the outermost `for` around it in its
    function, else the innermost `for` around a call of that function (climbing callers), with the
    batch loop's iterable translated into that scope's terms (through the parameter it was passed
    as). None for a loop that draws with next() (it has no passes of its own)."""
    if bl.via != "for":
        return []
    outer = [p for p in a.stmt_parent.get(bl.loop, ()) if isinstance(p, cst.For) and p is not bl.loop]
    if outer:
        return [EpochLoop(outer[-1], bl.scope, bl.cls, _loop_var(outer[-1]), bl.ref)]
    for site, ref in via:  # the calls that handed the loader in, innermost first
        if site.loops:
            ep = site.loops[-1]
            return [EpochLoop(ep, site.scope, site.cls, _loop_var(ep), ref)]
    if via:
        return []
    fn, ref = bl.scope, bl.ref
    for _ in range(4):
        if not isinstance(fn, cst.FunctionDef):
            break
        sites = a.facts.callers(fn)
        if not sites:
            break
        site = sites[0]
        if ref in a.facts.params(fn):
            v = a.facts.bound_value(site.call, fn, ref)
            ref = dotted(v) if v is not None else None
        elif ref is not None:  # the instance's attribute, as the caller spells it
            ref = a.facts.respell(ref, fn, site.scope)
        if site.loops:
            ep = site.loops[-1]
            return [EpochLoop(ep, site.scope, site.cls, _loop_var(ep), ref)]
        fn = site.scope
    return []


def _training_loops(a: "Anatomy") -> List[BatchLoop]:
    return [bl for bl in a.batch_loops if bl.trains]


def _origin_calls(a: "Anatomy", scope: Scope, name: str, depth: int, via: tuple) -> list:
    """Every (call site, name, via) whose call's result `name` holds in `scope`: an assignment
    there, or through the parameter each caller binds (`via`: those calls with the name each one
    passes, innermost first), or a module-level global."""
    if depth > 4 or "[" in name:
        return []
    if "." in name:
        return _attribute_origin(a, scope, name, via)
    if isinstance(scope, cst.FunctionDef) and name in a.facts.params(scope):
        out = []
        for site in a.facts.callers(scope):
            v = a.facts.bound_value(site.call, scope, name)
            if v is not None and dotted(v) is not None:
                out += _origin_calls(a, site.scope, dotted(v), depth + 1, via + ((site, dotted(v)),))
        return out
    for c in a.calls:
        if c.scope is scope and isinstance(c.stmt, cst.SimpleStatementLine) and len(c.stmt.body) == 1:
            small = c.stmt.body[0]
            if isinstance(small, cst.AnnAssign) and small.value is c.call and dotted(small.target) == name:
                return [(c, name, via)]  # `train_loader: DataLoader = get_loader(...)`
            if isinstance(small, cst.Assign) and small.value is c.call and name in _assigned(small):
                return [(c, name, via)]
    if isinstance(scope, cst.FunctionDef) and name not in a.facts.bindings(scope):
        return _origin_calls(a, a.module, name, depth + 1, via)
    return []


def _assigned(small: cst.Assign) -> List[str]:
    """The names (dotted: ``self.loader``) a one-target assignment binds, a tuple's too."""
    if len(small.targets) != 1:
        return []
    t = small.targets[0].target
    return [dotted(t)] if dotted(t) else [dotted(e.value) for e in getattr(t, "elements", [])]


def _attribute_origin(a: "Anatomy", scope: Scope, name: str, via: tuple) -> list:
    """`self.<attr>` read in a method: the call whose result the one assignment of that attribute
    in the methods of the class binds (``self.train_loader, self.train_sampler = get_loader(...)``
    in ``launch()``, iterated in ``train_one_epoch()``); none when the class assigns it more than
    once or otherwise."""
    inst = a.facts.instance(scope)
    attr = a.facts.instance_attr(scope, name)
    if attr is None or "." in attr:
        return []
    key = a.facts.canonical(scope, name)  # as every method of the class sees it, however each spells the instance
    binds = [(node, stmt) for node, stmt, sc, k in a.facts.assigns
             if k is inst[1] and key in [a.facts.canonical(sc, n) for n in _assigned(node)]]
    if len(binds) != 1 or not isinstance(binds[0][0].value, cst.Call):
        return []
    site = next((c for c in a.calls if c.call is binds[0][0].value), None)
    there = a.facts.respell(name, scope, site.scope) if site is not None else None  # as the binding method spells it
    return [(site, there, via)] if there is not None else []


def gated_sampler(a: "Anatomy", loader, value: cst.BaseExpression) -> Optional[cst.IfExp]:
    """The loader's sampler is a DistributedSampler only when a parameter of the function that
    builds it says so, and none otherwise: ``sampler = DistributedSampler(ds) if distributed else
    None`` (inline or through the name given), ``distributed`` a parameter (NERSC's
    ``get_data_loader(params, path, distributed, train)``). Whether it shards depends on what each
    caller passes; the IfExp, or None."""
    scope = loader.call.scope
    expr = value
    if isinstance(value, cst.Name) and isinstance(scope, cst.FunctionDef):
        b = a.facts.reaching_binding(scope, value.value, loader.call.stmt)
        small = b.stmt.body[0] if b is not None and isinstance(b.stmt, cst.SimpleStatementLine) and len(b.stmt.body) == 1 else None
        one = isinstance(small, cst.Assign) and len(small.targets) == 1 and dotted(small.targets[0].target) == value.value
        expr = small.value if one else None
    if not (isinstance(expr, cst.IfExp) and isinstance(scope, cst.FunctionDef)):
        return None
    test = expr.test.expression if isinstance(expr.test, cst.UnaryOperation) else expr.test
    branches = (expr.body, expr.orelse)
    none = any(isinstance(x, cst.Name) and x.value == "None" for x in branches)
    made = any(isinstance(x, cst.Call) and a.qualname(x.func) in DIST_SAMPLER for x in branches)
    flag = isinstance(test, cst.Name) and test.value in a.facts.params(scope)
    return expr if none and made and flag else None


# ------------------------------------------------------------------------------ streams

def iterable_classes(a: "Anatomy") -> Set[str]:
    """Classes of the module deriving (directly or through each other) from IterableDataset."""
    found: Set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, cls in a.classes.items():
            if name in found:
                continue
            for base in cls.bases:
                row = known(a.qualname(base.value))
                if (row is not None and row.kind == "stream") or dotted(base.value) in found:
                    found.add(name)
                    changed = True
    return found


def is_iterable_dataset(a: "Anatomy", loader) -> bool:
    """The loader reads a dataset of a class deriving from IterableDataset (built in the call or
    bound to the name it is given), or each rank's share of one: a stream, which takes no sampler."""
    if loader.dataset is None:
        return False
    return bool(built_classes(a, loader.dataset) & iterable_classes(a)) or reads_shared_stream(a, loader)


def built_classes(a: "Anatomy", expr: cst.BaseExpression, depth: int = 0) -> Set[str]:
    """What an expression is built by: the callee of ``Cls(...)``, or of every ``name = Cls(...)`` of
    the module when it is a name (dotted, as the script spells the callee); through a function of
    the script that returns it (``train_data = load_split("train")``, ``train_data, valid_data =
    build_datasets()``), what its returned value is built by."""
    if depth > 3:
        return set()
    if isinstance(expr, cst.Call):
        return ({dotted(expr.func)} - {None}) | _returned_classes(a, expr, None, depth)
    name = dotted(expr)
    out: Set[str] = set()
    if name is None:
        return out
    for stmt in a.stmt_parent:
        if not (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)):
            continue
        small = stmt.body[0]
        if not isinstance(small.value, cst.Call):
            continue
        for t in small.targets:
            if dotted(t.target) == name:
                out |= ({dotted(small.value.func)} - {None}) | _returned_classes(a, small.value, None, depth)
            elif isinstance(t.target, (cst.Tuple, cst.List)):
                items = t.target.elements
                for i, el in enumerate(items):
                    if dotted(el.value) == name:
                        out |= _returned_classes(a, small.value, (i, len(items)), depth)
    return out


def _returned_classes(a: "Anatomy", call: cst.Call, item: Optional[tuple], depth: int) -> Set[str]:
    """What the values a module-level function of the script returns are built by (`item`: the
    position in a returned tuple of that length)."""
    fn = a.functions.named(dotted(call.func))
    out: Set[str] = set()
    if fn is None:
        return out
    for ret in _returns(fn):
        value = ret.value
        if value is not None and item is not None:
            whole = isinstance(value, cst.Tuple) and len(value.elements) == item[1]
            value = value.elements[item[0]].value if whole else None
        if value is not None:
            out |= built_classes(a, value, depth + 1)
    return out


# what a class asks to know which share of the data is its own
RANK_CALLS = frozenset({
    "torch.distributed.get_rank", "torch.distributed.get_world_size", "horovod.torch.rank", "horovod.torch.size",
    "distify.runtime.rank", "distify.runtime.world_size",
})


def splits_itself(a: "Anatomy", expr: cst.BaseExpression) -> bool:
    """The object (a sampler, a stream) is built from a class of this file that asks for the rank or
    the world size (a call of ``RANK_CALLS`` or a launcher's rank variable): it chooses its own share,
    and taking a share of that again would drop data."""
    for name in built_classes(a, expr):
        cls = a.classes.named(name)
        if cls is None:
            continue
        for n in all_nodes(cls):
            if isinstance(n, cst.Call) and a.qualname(n.func) in RANK_CALLS:
                return True
            if isinstance(n, cst.SimpleString) and n.value.strip("\'\"") in RANK_ENV:
                return True
    return False


def reads_shared_stream(a: "Anatomy", loader) -> bool:
    """The loader reads ``runtime.ShareStream(...)`` (inline or through the name it is given): each
    rank's share of a stream (DST910's rewrite)."""
    return loader.dataset is not None and any(
        a.qualname(cst.parse_expression(name)) == "distify.runtime.ShareStream"
        for name in built_classes(a, loader.dataset)
    )
