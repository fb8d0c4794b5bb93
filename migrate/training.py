"""Which code trains: training functions and bodies, endless loops and generators, random draws
without a loader, loaders kept by key, and the parameters an optimizer steps (part of the anatomy,
see anatomy.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import libcst as cst

from distify.facts import training_call
from distify.instance import instance_of, on
from distify.syntax import all_nodes, arg, dotted
from distify.library import DISTRIBUTION_DRAWS, DISTRIBUTIONS
from distify.names import Defined, row_of
from distify.walk import walk
from distify.dataflow import _contains, _data_of, _is_training_body, _parameter_roots, iterated_refs, ref_text
from distify.records import CallSite, NOT_OPTIMIZERS, Scope, assigned_name
from distify.values import Record

if TYPE_CHECKING:
    from distify.anatomy import Anatomy


def _trains_directly(node: cst.CSTNode) -> bool:
    return _is_training_body(node)


def training_functions(functions: Defined, methods: Mapping[cst.FunctionDef, cst.ClassDef],
                       calls: Sequence["CallSite"], stmt_scope: Mapping[cst.CSTNode, Scope],
                       seeds: Set[cst.FunctionDef] = frozenset()) -> Set[cst.FunctionDef]:
    """Functions and methods whose body reaches backward()/optimizer.step(), directly or through a
    call of another such module-level function (`name(...)`) or method of the same class
    (`self.name(...)`): `_run_epoch` trains when the `_run_batch` it calls does. `calls` and
    `stmt_scope` are the analysis pass's records: a call is in the body of its scope (unless it is in
    the scope's own header: decorators, defaults) and of every function around that scope.
    `seeds`: functions known to train otherwise (through a value they are handed:
    ``distify.callable_training``)."""
    all_fns = list(functions.values()) + [m for m in methods if m not in functions.values()]
    by_class: Dict[cst.ClassDef, Dict[str, cst.FunctionDef]] = {}
    for m, k in methods.items():
        by_class.setdefault(k, {})[m.name.value] = m
    callees: Dict[cst.FunctionDef, Set[cst.FunctionDef]] = {fn: set() for fn in all_fns}
    trains: Set[cst.FunctionDef] = set(seeds)
    for site in calls:
        d = dotted(site.call.func)
        direct = training_call(site.call)  # backward() / step(): the functions around it train
        if d is None and not direct:
            continue
        fn = site.scope
        inside = site.stmt is not fn
        while isinstance(fn, cst.FunctionDef):
            # the instance as the function at this level names it: a call in a nested function or
            # class counts for every function around it, each through its own instance
            holder = instance_of(fn, methods, stmt_scope) if d is not None else None
            if inside and fn in callees:
                if direct:
                    trains.add(fn)
                if functions.named(d) is not None:
                    callees[fn].add(functions.named(d))
                elif d is not None and holder is not None and on(d, holder[0]) in by_class.get(holder[1], {}):
                    callees[fn].add(by_class[holder[1]][on(d, holder[0])])  # a method called on the instance
            fn, inside = stmt_scope.get(fn), True
    changed = True
    while changed:
        changed = False
        for fn in all_fns:
            if fn not in trains and callees[fn] & trains:
                trains.add(fn)
                changed = True
    return trains


def body_trains(node: cst.CSTNode, trainers: Set[cst.FunctionDef], functions: Defined, methods, holder) -> bool:
    """`node` reaches backward()/step() itself or calls a function in `trainers` (see
    `training_functions`): module-level functions as `Defined.named` finds them, methods of the
    class through the instance `holder` names (``distify.instance.instance_of`` of `node`'s scope)."""
    if _trains_directly(node):
        return True
    if not trainers:
        return False
    own = {m.name.value: m for m, k in methods.items() if k is holder[1]} if holder is not None else {}

    def pred(n):
        if not isinstance(n, cst.Call):
            return False
        d = dotted(n.func)
        if d is None:
            return False
        if functions.named(d) in trainers:
            return True
        return holder is not None and own.get(on(d, holder[0])) in trainers

    return _contains(node, pred)


def endless_loop(node: cst.CSTNode, aliases_q) -> bool:
    """`while ...:` or `for ... in <an endless iterable of the library table>` (itertools.repeat(),
    count(), cycle()): a loop around passes."""
    if isinstance(node, cst.While):
        return True
    row = row_of(aliases_q, node.iter.func) if isinstance(node, cst.For) and isinstance(node.iter, cst.Call) else None
    return row is not None and row.endless


def generator_passes(fn: cst.FunctionDef, aliases_q, yielding: Optional[Set[cst.CSTNode]] = None) -> List[Tuple[str, cst.CSTNode]]:
    """(parameter, pass) for each pass over a parameter that `fn` yields from: a `for ... in
    <parameter>:` loop whose body yields (`def forever(loader): while True: for b in loader: yield
    b`), or a `yield from <parameter>` statement (also `for l in repeat(loader): yield from l`).
    `yielding`: the scopes with a ``yield`` anywhere in them (records.py); the others have none."""
    if yielding is not None and fn not in yielding:
        return []
    params = {p.name.value for p in fn.params.params}
    out: List[Tuple[str, cst.CSTNode]] = []
    repeated: Dict[str, str] = {}  # loop variable -> parameter it repeats

    class V(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is fn

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def visit_For(self, node: cst.For) -> None:
            if isinstance(node.iter, cst.Name) and node.iter.value in params:
                if _contains(node.body, lambda n: isinstance(n, (cst.Yield,))):
                    out.append((node.iter.value, node))
            elif endless_loop(node, aliases_q) and isinstance(node.target, cst.Name) and node.iter.args:
                src = node.iter.args[0].value
                if isinstance(src, cst.Name) and src.value in params:
                    repeated[node.target.value] = src.value

        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            for small in node.body:
                v = small.value if isinstance(small, cst.Expr) else None
                if isinstance(v, cst.Yield) and isinstance(v.value, cst.From) and isinstance(v.value.item, cst.Name):
                    name = v.value.item.value
                    if name in params:
                        out.append((name, node))
                    elif name in repeated:
                        out.append((repeated[name], node))

    walk(fn, V())
    return out


def next_consumers(calls: Sequence["CallSite"]) -> List[Tuple["CallSite", cst.CSTNode, str]]:
    """(call site, loop, reference) for each `next(<ref>)` / `next(iter(<ref>))` inside a loop: the
    loop draws its batches one at a time from <ref> (an endless generator, an iterator over a loader).
    The loop is the innermost `for` or `while` around the draw in its scope: a step-based
    `while step < max_steps: batch = next(it)` draws as `for step in range(n)` does."""
    out = []
    for c in calls:
        loops = [p for p in c.parents if isinstance(p, (cst.For, cst.While))]
        v = drawn_from(c.call) if loops else None
        r = ref_text(v) if v is not None else None
        if r is not None:
            out.append((c, loops[-1], r))
    return out


def comprehension_consumers(comps, aliases_q) -> List[Tuple[Scope, cst.CSTNode, str, bool]]:
    """(scope, statement, reference, trains) for each iterable a comprehension or generator
    expression iterates (`sum(loss(model(x), y).item() for x, y in val_loader)`), through the
    pass-through wrappers of the library table; `trains` when the comprehension itself reaches
    backward()/optimizer.step(). What the loop does with the batches, not the loader's name, says
    whether a loader no statement loop reads trains or evaluates."""
    out = []
    for comp, scope, stmt in comps:
        trains = None
        f: Optional[cst.CompFor] = comp.for_in
        while f is not None:
            for ref in iterated_refs(f.iter, aliases_q):
                if trains is None:
                    trains = _is_training_body(comp)
                out.append((scope, stmt, ref, trains))
            f = f.inner_for_in
    return out


def drawn_from(call: cst.Call) -> Optional[cst.BaseExpression]:
    """`x` of a `next(x)` or `next(iter(x))` call, else None."""
    if dotted(call.func) != "next" or not call.args:
        return None
    v = call.args[0].value
    if isinstance(v, cst.Call) and dotted(v.func) == "iter" and v.args:
        v = v.args[0].value
    return v


# Draws of random indices/batches from a process-wide generator: identical on every rank that was
# seeded alike (and torch's default seed is a constant).
RNG_DRAWS = {
    "torch.randint", "torch.randperm", "torch.multinomial",
    "numpy.random.randint", "numpy.random.choice", "numpy.random.permutation",
    "random.sample", "random.randint", "random.randrange", "random.choice", "random.choices",
}


class GlobalDraw(Record):
    """A training loop whose batches come from a global random stream rather than a DataLoader."""

    __slots__ = ("loop", "scope", "draw", "via", "first_use", "what", "__dict__")
    loop: cst.For  # the training loop
    scope: Scope
    draw: "CallSite"  # the torch.randint(...)-like call
    via: Optional[cst.FunctionDef]  # the function (called from the loop) that draws, None: the loop itself
    first_use: cst.CSTNode  # the first statement of `scope` that draws (the loop, or a prefetch before it)
    what: str  # the draw's qualified name (`torch.distributions.Categorical.sample` for `m.sample()`)

    def __init__(self, loop: cst.For, scope: Scope, draw: "CallSite", via: Optional[cst.FunctionDef],
                 first_use: cst.CSTNode, what: str = "") -> None:
        self._set(loop, scope, draw, via, first_use, what)


def distribution_draw(a: "Anatomy", site: "CallSite") -> Optional[str]:
    """`torch.distributions.Categorical.sample` for `Categorical(probs).sample()`, or for `m.sample()`
    where `m` is bound once in the call's scope to `Categorical(probs)`: a draw from torch's global
    generator (library.DISTRIBUTION_DRAWS). None for any other call."""
    func = site.call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in DISTRIBUTION_DRAWS:
        return None
    made = func.value
    if isinstance(made, cst.Name):
        binds = a.bindings(site.scope).get(made.value, [])
        built = [c for c in a.calls if c.scope is site.scope and assigned_name(c.stmt, c.call) == made.value]
        if len(binds) != 1 or len(built) != 1 or binds[0].stmt is not built[0].stmt:
            return None
        made = built[0].call
    q = a.qualname(made.func) if isinstance(made, cst.Call) else None
    return f"{q}.{func.attr.value}" if q and q.startswith(DISTRIBUTIONS) else None


def _model_input(a: "Anatomy", site: "CallSite") -> bool:
    """`site` (a torch.randn-like draw) is the whole input of one of the script's models, called in the
    same loop: `netG(torch.randn(b, nz))`, or `noise = torch.randn(b, nz)` and `netG(noise)` with
    `noise` bound once in that scope. Such a draw is the data that model trains on (a GAN generator's
    latent batch), not noise added to a loader's samples."""
    if not site.loops:
        return False
    models = {m.name for m in a.models if m.scope is site.scope}
    bound = assigned_name(site.stmt, site.call)
    if bound is not None and len(a.bindings(site.scope).get(bound, [])) != 1:
        bound = None
    for c in a.calls:
        if c.scope is not site.scope or dotted(c.call.func) not in models or site.loops[-1] not in c.loops:
            continue
        for x in c.call.args:
            if x.value is site.call or (bound is not None and dotted(x.value) == bound):
                return True
    return False


# draws that generate the data itself when no loader feeds training (a regression on batches it
# makes, a GAN's real samples from a known distribution); beside a loader they are noise or
# augmentation of the loader's samples, not the data, unless a model takes the draw as its whole input
# (`_model_input`: a GAN generator's latent batch)
GENERATED = {"torch.randn", "torch.rand", "torch.normal"}


def global_draws(anatomy: "Anatomy") -> List[GlobalDraw]:
    """Training loops (a body reaching backward()/step()) that consume no DataLoader and draw their
    data with torch.randint/randperm/numpy/random calls without a `generator=`/seeded RandomState:
    directly, or through a function of this module they call (also one nested in the same scope, as
    nanoGPT-style `get_batch(split)` is)."""
    a = anatomy
    loader_loops = {bl.loop for l in a.loaders for bl in l.batch_loops}
    draws_by_fn: Dict[cst.FunctionDef, CallSite] = {}
    loose: List[CallSite] = []
    what: Dict[int, str] = {}  # id(call site) -> the draw's name
    fed = any(bl.trains for loader in a.loaders for bl in loader.batch_loops)
    for c in a.calls:
        # beside a loader a distribution's draw is noise (a VAE's rsample()), not the data
        name = c.qualname if c.qualname in RNG_DRAWS | (set() if fed else GENERATED) else None
        if name is None and fed and c.qualname in GENERATED and _model_input(a, c):
            name = c.qualname
        if name is None and not fed:
            name = distribution_draw(a, c)
        if name is None or arg(c.call, None, "generator") is not None:
            continue
        what[id(c)] = name
        if isinstance(c.scope, cst.FunctionDef):
            draws_by_fn.setdefault(c.scope, c)
        loose.append(c)
    if not loose:
        return []
    defs: Dict[str, List[cst.FunctionDef]] = {}
    for stmt in a.stmt_scope:
        if isinstance(stmt, cst.FunctionDef):
            defs.setdefault(stmt.name.value, []).append(stmt)

    def drawing_fn(call: cst.Call, scope: Scope) -> Optional[cst.FunctionDef]:
        d = dotted(call.func)
        for fn in defs.get(d or "", ()):
            home = a.stmt_scope.get(fn)
            if fn in draws_by_fn and (home is scope or isinstance(home, cst.Module)):
                return fn
        return None

    out: List[GlobalDraw] = []
    for loop, scope, cls, outer in a.fors:
        if outer:
            continue
        if loop in loader_loops:
            # a loop fed by a loader draws data of its own only as a model's whole input (a GAN's latent)
            fed_draws = [c for c in loose if c.scope is scope and loop in c.loops and c.qualname in GENERATED]
            if fed_draws:
                out.append(GlobalDraw(loop, scope, fed_draws[0], None, loop, what[id(fed_draws[0])]))
            continue
        # an RL episode loop trains through a function it calls (`finish_episode()`); the draws
        # that make such a loop's data are a distribution's (the other kinds keep their own loop)
        through_call = not _is_training_body(loop.body)
        if through_call and not a.facts.trains(loop):
            continue
        direct = [c for c in loose if c.scope is scope and loop in c.loops]
        if through_call:
            direct = [c for c in direct if what[id(c)].startswith(DISTRIBUTIONS)]
        # the loop runs again on every iteration of a `while` around it (nanoGPT's `while True:`
        # around the micro-step loop): the first statement that draws is that `while`
        repeated = next((p for p in a.stmt_parent.get(loop, ()) if isinstance(p, cst.While)), loop)
        if direct:
            out.append(GlobalDraw(loop, scope, direct[0], None, repeated, what[id(direct[0])]))
            continue
        for c in a.calls:
            if c.scope is scope and loop in c.loops:
                fn = drawing_fn(c.call, scope)
                if fn is not None and through_call and not what[id(draws_by_fn[fn])].startswith(DISTRIBUTIONS):
                    continue
                if fn is not None:
                    # a prefetch before the loop (`X, Y = get_batch("train")`) draws first
                    first = repeated
                    for p in a.calls:
                        if p.scope is scope and dotted(p.call.func) == fn.name.value and not p.loops:
                            top = (*a.stmt_parent.get(p.stmt, ()), p.stmt)[0]
                            if a.is_before(top, first):
                                first = top
                    out.append(GlobalDraw(loop, scope, draws_by_fn[fn], fn, first, what[id(draws_by_fn[fn])]))
                    break
    return out


def _const_strings(expr: cst.BaseExpression) -> Optional[List[str]]:
    """["train", "val"] for a list/tuple literal of plain strings, else None."""
    if not isinstance(expr, (cst.List, cst.Tuple)) or not expr.elements:
        return None
    out = []
    for e in expr.elements:
        v = e.value
        if not isinstance(v, cst.SimpleString) or not isinstance(v.evaluated_value, str):
            return None
        out.append(v.evaluated_value)
    return out


def loader_family(site: "CallSite") -> Optional[Tuple[str, str, List[str]]]:
    """(dict name, key variable, keys) when the DataLoader call is the value of
    `name = {k: DataLoader(...) for k in ["train", "val"]}` (one for, no condition)."""
    stmt = site.stmt
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return None
    assign = stmt.body[0]
    comp = assign.value
    if not (isinstance(comp, cst.DictComp) and comp.value is site.call and len(assign.targets) == 1):
        return None
    name = dotted(assign.targets[0].target)
    f = comp.for_in
    if name is None or f.inner_for_in is not None or f.ifs or not isinstance(f.target, cst.Name):
        return None
    if not (isinstance(comp.key, cst.Name) and comp.key.value == f.target.value):
        return None
    keys = _const_strings(f.iter)
    return (name, f.target.value, keys) if keys else None


def keyed_loop(loop: cst.For, outer: Sequence[cst.For], aliases_q) -> Optional[Tuple[str, List[str], str]]:
    """(dict reference, keys, key variable) when `loop` iterates `D[v]` (maybe through enumerate/tqdm)
    and `v` is the variable of an enclosing `for v in ["train", "val"]`."""
    it = _data_of(loop.iter, aliases_q)
    if not (isinstance(it, cst.Subscript) and len(it.slice) == 1 and isinstance(it.slice[0].slice, cst.Index)):
        return None
    key = it.slice[0].slice.value
    base = dotted(it.value)
    if base is None or not isinstance(key, cst.Name):
        return None
    for f in reversed(list(outer)):
        if isinstance(f.target, cst.Name) and f.target.value == key.value:
            keys = _const_strings(f.iter)
            return (base, keys, key.value) if keys else None
    return None


def trains_for_key(body: cst.CSTNode, var: str, key: str) -> bool:
    """Whether `body` reaches backward()/step() when `var == key`: branches of `if var == "other"`
    (or `if var != key`) are skipped, any other condition may hold."""

    def verdict(test: cst.BaseExpression) -> Optional[bool]:
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            left, comp = test.left, test.comparisons[0]
            right = comp.comparator
            if isinstance(left, cst.SimpleString):
                left, right = right, left
            if dotted(left) == var and isinstance(right, cst.SimpleString) and isinstance(right.evaluated_value, str):
                equal = right.evaluated_value == key
                if isinstance(comp.operator, cst.Equal):
                    return equal
                if isinstance(comp.operator, cst.NotEqual):
                    return not equal
        return None

    found = []

    class V(cst.CSTVisitor):
        def visit_If(self, node: cst.If) -> bool:
            v = verdict(node.test)
            if v is None:
                return True
            walk(node.body if v else (node.orelse or cst.IndentedBlock(body=[])), self)
            return False

        def visit_Call(self, node: cst.Call) -> None:
            if _is_training_body(node) and isinstance(node.func, cst.Attribute) and node.func.attr.value in ("backward", "step"):
                found.append(node)

    walk(body, V())
    return bool(found)


def stepped_names(calls: Sequence["CallSite"]) -> Set[str]:
    """Names whose `.step()` is called in a loop (the script has a backward() somewhere)."""
    out = set()
    for c in calls:
        f = c.call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "step" and c.loops and not c.call.args:
            d = dotted(f.value)
            if d is not None:
                out.add(d)
    return out


def steps_parameters(site: "CallSite", stepped: Set[str]) -> bool:
    """An optimizer whoever built it (transformers' AdamW, a library's Lamb): the call receives
    `X.parameters()` (or a list/groups built from it) as its first argument, its result is bound to
    a name, and that name's `.step()` runs in a loop of a script that calls backward()."""
    if not stepped or (site.qualname or "").startswith(NOT_OPTIMIZERS):
        return False
    target = assigned_name(site.stmt, site.call)
    if target is None or target not in stepped:
        return False
    p = arg(site.call, 0, "params")
    if p is None or (site.qualname or "").startswith("horovod."):
        return False
    inner = p.value
    if isinstance(inner, cst.Call) and not (
        (isinstance(inner.func, cst.Attribute) and inner.func.attr.value in ("parameters", "named_parameters"))
        or dotted(inner.func) in ("list", "tuple", "filter", "itertools.chain", "chain")
    ):
        return False  # a wrapper around an optimizer built inline (hvd.DistributedOptimizer(SGD(...)), Lookahead(...))
    return bool(_parameter_roots(p.value))


PERMUTATIONS = {"torch.randperm", "numpy.random.permutation"}


def walked_permutation(d: GlobalDraw) -> Optional[cst.For]:
    """The inner loop that walks, slice by slice, a permutation the training loop draws once per pass
    (`perm = torch.randperm(n)` then `for i in range(0, n, bs): idx = perm[i:i + bs]`): a pass over
    the whole data per outer iteration, an epoch. None for other draws (a fresh `randperm(n)[:bs]`
    every step, a helper's draw)."""
    if d.via is not None or d.what not in PERMUTATIONS:
        return None
    name = assigned_name(d.draw.stmt, d.draw.call)
    if name is None or "." in name:
        return None
    for inner in all_nodes(d.loop.body, skip_nested=True):
        if not isinstance(inner, cst.For) or inner in d.draw.loops or not isinstance(inner.target, cst.Name):
            continue
        var = inner.target.value
        for sub in all_nodes(inner.body, skip_nested=True):
            if not (isinstance(sub, cst.Subscript) and isinstance(sub.value, cst.Name) and sub.value.value == name):
                continue
            for el in sub.slice:
                s = el.slice
                if isinstance(s, cst.Slice) and s.lower is not None and _contains(
                    s.lower, lambda n, v=var: isinstance(n, cst.Name) and n.value == v
                ):
                    return inner
    return None
