"""Learning-rate schedules sized from the whole training set in a script whose training loader is sharded.

A schedule built over the optimizer (`get_linear_schedule_with_warmup(optimizer, warmup,
num_training_steps)`, `OneCycleLR(optimizer, max_lr, total_steps=...)`, `CosineAnnealingLR(optimizer,
T_max=...)`) whose length is computed from ``len(dataset)`` of a loader that a DistributedSampler
shards counts the batches of the whole set, while each rank now takes only its shard's: the warmup
and the decay stretch over world-size times the steps the run takes. Computed from ``len(loader)``
(the batches of this rank) or divided by the world size, it is right.
"""

from __future__ import annotations

from typing import Iterator, List, Set, Tuple

import libcst as cst

from distify.dataflow import ref_text
from distify.library import WORLD_SIZE
from distify.names import qualified
from distify.parallel import feeding_loaders, sampler_of
from distify.records import CallSite
from distify.syntax import all_nodes


def whole_set_schedules(a) -> List[Tuple[CallSite, cst.Call, str]]:
    """(the call that takes the optimizer, the `len(...)` of the sharded data in its length, that
    data's reference) for each schedule sized from a sharded training set."""
    refs: Set[str] = set()
    for loader in feeding_loaders(a):
        if sampler_of(a, loader)[1] is None:
            continue  # not sharded by a DistributedSampler: its length is what each rank reads
        data = ref_text(loader.dataset) if loader.dataset is not None else None
        refs |= {r for r in (data, f"{loader.target}.dataset" if loader.target else None) if r}
    opts = {o.target for o in a.optimizers if o.target}
    if not refs or not opts:
        return []
    built = {id(o.call.call) for o in a.optimizers}
    out: List[Tuple[CallSite, cst.Call, str]] = []
    for c in a.calls:
        if id(c.call) in built or not any(ref_text(x.value) in opts for x in c.call.args):
            continue
        for x in c.call.args:
            if ref_text(x.value) in opts:
                continue
            seen = list(_resolved(a, c.scope, c.stmt, x.value, 0))
            if any(isinstance(n, cst.Call) and a.qualname(n.func) in WORLD_SIZE for e in seen for n in all_nodes(e)):
                continue  # divided by the world size already
            for e in seen:
                for n in all_nodes(e):
                    if (isinstance(n, cst.Call) and qualified(a.aliases, n.func, a.name_bindings) == "builtins.len"
                            and len(n.args) == 1 and ref_text(n.args[0].value) in refs):
                        out.append((c, n, ref_text(n.args[0].value)))
    return out


def _resolved(a, scope, stmt, expr: cst.BaseExpression, depth: int) -> Iterator[cst.BaseExpression]:
    """`expr`, and the values of the names it reads, each bound once by a plain assignment before
    `stmt` in `scope` (`num_training_steps = len(train_dataset) // batch_size * epochs`), three deep."""
    yield expr
    if depth >= 3:
        return
    for n in all_nodes(expr):
        if not isinstance(n, cst.Name):
            continue
        bound = a.facts.bindings(scope).get(n.value, [])
        b = a.facts.reaching_binding(scope, n.value, stmt)
        if b is None or len(bound) != 1 or b.kind != "assign":
            continue
        line = b.stmt
        small = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
            yield from _resolved(a, scope, b.stmt, small.value, depth + 1)
