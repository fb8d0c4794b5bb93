"""Is the data a DistributedSampler shards the same on every rank? (part of the fact layer, see facts.py)

A DistributedSampler gives each rank every N-th index of *its own* dataset: the shards are disjoint
and cover the set only if every rank built the same dataset in the same order. A dataset made by a
random draw the script never seeds (``train_ds, val_ds = random_split(full, [n, m])`` with no
``generator=``, ``random.shuffle(files)`` before the split, ``np.random.permutation(n)`` indices,
scikit-learn's ``train_test_split`` with no ``random_state=``) is another split on each rank: torch
2.13, Python's ``random`` and NumPy seed each process from the OS. The shards then overlap, samples
go missing from training, and one rank's validation set holds another rank's training samples, with
no error. A seed call of the draw's generator anywhere in the script counts as seeding it (the
script is then the same on every rank, as the single-process run is); a draw with its own
``generator=`` / ``random_state=`` counts as seeded too. Which draws split and how each takes a seed
is data (``library.SPLIT_DRAWS``). Read-only; DST208 asks it of the loaders a migration shards (and
gives each draw a seed all ranks share), the audit of a distributed script (DST965).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, List, Optional, Set, Tuple

import libcst as cst

from distify.library import SHUFFLES_IN_PLACE, SPLIT_DRAWS
from distify.parallel import feeding_loaders, sampler_of
from distify.rank_input import SEEDS
from distify.syntax import all_nodes, arg
from distify.values import Value

if TYPE_CHECKING:
    from distify.anatomy import Anatomy
    from distify.records import Loader

_DEPTH = 4
SHARE_SAMPLER = "distify.runtime.ShareSampler"  # DST901's share of a script's own sampler


def _unseeded_draw(a: "Anatomy", call: cst.Call, seeded: Set[str]) -> bool:
    row = SPLIT_DRAWS.get(a.qualname(call.func) or "")
    if row is None or row.seeded_by in seeded:
        return False
    return not (row.keyword and arg(call, row.position if row.position >= 0 else None, row.keyword) is not None)


def _values(a: "Anatomy", scope, stmt: cst.CSTNode, expr: cst.BaseExpression, depth: int,
            seen: Set[int]) -> Iterator[Tuple[cst.CSTNode, object, cst.CSTNode]]:
    """`expr` and, through the names it reads, the statements that made them before `stmt` in
    `scope` (an assignment of any target shape, a call that mutates the name in place:
    ``random.shuffle(files)``), what the callers of `scope` hand a parameter it reads, and the
    returns of the script's functions it calls, as (expression, its scope, the statement it stands
    in)."""
    if id(expr) in seen:
        return
    seen.add(id(expr))
    yield expr, scope, stmt
    if depth >= _DEPTH:
        return
    for n in all_nodes(expr):
        if type(n) is cst.Call:
            fn = a.facts.callee(n, scope)
            if fn is not None:
                for line in a.facts.statements(fn):
                    for r in (line.body if isinstance(line, cst.SimpleStatementLine) else ()):
                        if isinstance(r, cst.Return) and r.value is not None:
                            yield from _values(a, fn, line, r.value, depth + 1, seen)
        if not isinstance(n, cst.Name):
            continue
        b = a.facts.reaching_binding(scope, n.value, stmt)
        if b is None and isinstance(scope, cst.FunctionDef) and n.value in a.facts.params(scope):
            for c in a.facts.callers(scope):  # a parameter: what each call hands it (train(train_ds))
                given = a.facts.bound_value(c.call, scope, n.value)
                if given is not None:
                    yield from _values(a, c.scope, c.stmt, given, depth + 1, seen)
        if b is not None and b.kind == "assign":
            line = b.stmt
            for small in (line.body if isinstance(line, cst.SimpleStatementLine) else ()):
                if isinstance(small, cst.Assign):
                    yield from _values(a, scope, b.stmt, small.value, depth + 1, seen)
        at = a.facts.order(stmt)
        for c in a.calls:  # in-place draws on the name before its use: random.shuffle(files)
            if (c.scope is scope and a.facts.order(c.stmt) < at and c.qualname in SHUFFLES_IN_PLACE
                    and any(isinstance(x.value, cst.Name) and x.value.value == n.value for x in c.call.args)):
                yield c.call, scope, c.stmt


def sharded_loaders(a: "Anatomy") -> List[Tuple["Loader", bool]]:
    """(loader, shared) for each training loader of a distributed script that a DistributedSampler
    shards or whose own sampler runtime.ShareSampler shares out (`shared`)."""
    out: List[Tuple["Loader", bool]] = []
    for loader in feeding_loaders(a):
        given = arg(loader.call.call, 5, "sampler")
        shared = given is not None and any(
            isinstance(n, cst.Call) and a.qualname(n.func) == SHARE_SAMPLER for n in all_nodes(given.value))
        if sampler_of(a, loader)[1] is not None or shared:  # else not sharded by a sampler: DST951's to speak of
            out.append((loader, shared))
    return out


def unseeded_splits(a: "Anatomy") -> List[Tuple[cst.Call, "Loader"]]:
    """(the draw, the loader) for each training loader a DistributedSampler shards (or whose own
    sampler runtime.ShareSampler shares out) whose dataset or sampler's indices are made, through the
    bindings before it (four deep, into the script's own functions), by a random draw of a generator
    the script never seeds: each rank shards a different dataset. The audit's question (DST965), on
    a script that is distributed already."""
    out: List[Tuple[cst.Call, "Loader"]] = []
    done: Set[int] = set()
    for loader, shared in sharded_loaders(a):
        out += [(d, loader) for d in loader_draws(a, loader, shared, done)]
    return out


def loader_draws(a: "Anatomy", loader: "Loader", shared: bool, done: Optional[Set[int]] = None) -> List[cst.Call]:
    """The unseeded draws (rows of ``library.SPLIT_DRAWS``) the dataset of the training `loader`
    is made from and, when its own sampler is shared out (`shared`: runtime.ShareSampler, now or
    once DST901 has wrapped it), the indices that sampler is given (``SubsetRandomSampler(train_idx)``).
    DST208 asks it of the loaders the migration shards, before they are; `done` skips draws found
    for another loader."""
    seeded = {c.qualname for c in a.calls_to(SEEDS)}  # torch.cuda.manual_seed leaves the CPU generator alone
    done = set() if done is None else done
    site = loader.call
    if site is None or site.call is None:
        return []
    given = arg(site.call, 5, "sampler")
    made = [e for e in (loader.dataset, given.value if shared and given is not None else None) if e is not None]
    out: List[cst.Call] = []
    for expr, _, _ in (v for e in made for v in _values(a, site.scope, site.stmt, e, 0, set())):
        for n in all_nodes(expr):
            if isinstance(n, cst.Call) and id(n) not in done and _unseeded_draw(a, n, seeded):
                done.add(id(n))
                out.append(n)
    return out


class ForeignDraw(Value):
    """A call of the script whose project function (another module) makes the training set by an
    unseeded draw: the call, where the draw is (``data.py:9``) and how the draw is spelled there."""

    __slots__ = ("call", "where", "draw")
    call: cst.Call
    where: str
    draw: str

    def __init__(self, call: cst.Call, where: str, draw: str) -> None:
        self._set(call, where, draw)


def foreign_draws(a: "Anatomy", loader: "Loader", shared: bool, path: Optional[str], options) -> List[ForeignDraw]:
    """The calls the dataset of the training `loader` (and a shared sampler's indices) is made by
    that reach a function of another module of the project (``program.reached``) whose returns come
    from an unseeded draw (``data.make_sets`` shuffling its ids with ``random.shuffle``). A seed
    call in either module counts as seeding the draw's generator. Empty without the script's path."""
    site = loader.call
    if not path or site is None or site.call is None:
        return []
    reach = getattr(a.facts, "project", None)
    given = arg(site.call, 5, "sampler")
    made = [e for e in (loader.dataset, given.value if shared and given is not None else None) if e is not None]
    by_call = {id(c.call): c for c in a.calls}
    seeded = {c.qualname for c in a.calls_to(SEEDS)}
    out: List[ForeignDraw] = []
    done: Set[int] = set()
    for expr, scope, _ in (v for e in made for v in _values(a, site.scope, site.stmt, e, 0, set())):
        for n in all_nodes(expr):
            c = by_call.get(id(n))
            if c is None or not c.qualname or c.qualname in SPLIT_DRAWS or reach is None:
                continue
            if reach.project().locate(c.qualname) is None:
                continue  # no module of the project holds it (torch.linspace): the program model is not built
            from distify.program import reached

            target = reached(a, path, options, c).target
            if target is None:
                continue
            there = target.unit.anatomy
            both = seeded | {s.qualname for s in there.calls_to(SEEDS)}
            file = target.where.rsplit(":", 1)[0]
            for d in _returned_draws(there, target.fn, both, done):
                out.append(ForeignDraw(n, f"{file}:{there.position(d)[0]}", there.module.code_for_node(d.func)))
    return out


def _returned_draws(a: "Anatomy", fn: cst.FunctionDef, seeded: Set[str], done: Set[int]) -> Iterator[cst.Call]:
    """The unseeded draws the returns of `fn` (a function of the module `a` analyses) are made from."""
    for line in a.facts.statements(fn):
        for r in (line.body if isinstance(line, cst.SimpleStatementLine) else ()):
            if isinstance(r, cst.Return) and r.value is not None:
                for v, _, _ in _values(a, fn, line, r.value, 1, set()):
                    for d in all_nodes(v):
                        if isinstance(d, cst.Call) and id(d) not in done and _unseeded_draw(a, d, seeded):
                            done.add(id(d))
                            yield d


def written_by_training(a: "Anatomy", loader: "Loader", sampler: cst.BaseExpression) -> Optional[cst.CSTNode]:
    """The first statement of a training loop over `loader` that writes a name its `sampler` is
    built from (``hardness[idx] = loss.detach()``, ``weights += ...``, the name bound again):
    weights learnt from the batches, which under data parallelism are each rank's own, so every
    rank would build another sampler and a share drawn with one seed would not split one
    sequence. None when the training writes none of them."""
    site = loader.call
    names = {n.value for e, _, _ in _values(a, site.scope, site.stmt, sampler, 0, set())
             for n in all_nodes(e) if isinstance(n, cst.Name)}

    def written(target: cst.BaseExpression) -> bool:
        while isinstance(target, (cst.Subscript, cst.Attribute)):
            target = target.value
        return isinstance(target, cst.Name) and target.value in names

    for bl in loader.batch_loops:
        if not bl.trains:
            continue
        for n in all_nodes(bl.loop.body):
            if isinstance(n, cst.Assign) and any(written(t.target) for t in n.targets):
                return n
            if isinstance(n, cst.AugAssign) and written(n.target):
                return n
    return None
