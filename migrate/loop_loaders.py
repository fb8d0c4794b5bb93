"""A training loop's DataLoader built in the loop's own header gets a name first (an engine stage).

``for x, y in DataLoader(ds, batch_size=8, shuffle=True):`` (or ``enumerate(DataLoader(...))``,
``tqdm(DataLoader(...))``) builds the loader each time the loop starts, and names it nowhere: there
is no place for a sampler to be named before it nor for ``set_epoch`` to reach it. Before the rules
run, the loader is bound to a fresh name right above the loop, where it was evaluated anyway (the
loop's header evaluates its iterable once, before the first pass), and the header reads the name:

    for epoch in range(epochs):
        train_loader = DataLoader(ds, batch_size=8, shuffle=True)
        for x, y in train_loader:

The rules then see a loader built inside the epoch loop (DST201 gives it its DistributedSampler,
DST202 the epoch). Only loaders whose loop trains are named (an evaluation loop over a loader built
in place is left as written), and only where the loader is the first thing the header evaluates
(the iterable itself, or the first argument down a chain of calls), so nothing runs in another
order.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from distify.anatomy import Anatomy


def _first_evaluated(expr: cst.BaseExpression, call: cst.Call) -> bool:
    """`call` is `expr`, or the first positional argument of `expr` (a call), recursively."""
    while expr is not call:
        if not isinstance(expr, cst.Call) or not expr.args:
            return False
        first = expr.args[0]
        if first.keyword is not None or first.star:
            return False
        expr = first.value
    return True


def in_place(a: Anatomy) -> List[Tuple[cst.Call, cst.For]]:
    """(DataLoader call, its loop) for each loader built in the header of a loop that trains."""
    out = []
    for loader in a.loaders:
        if loader.target or loader.param or loader.family or loader.bound:
            continue
        stmt = loader.call.stmt
        if not isinstance(stmt, cst.For) or not _first_evaluated(stmt.iter, loader.call.call):
            continue
        if a.facts.trains(stmt):
            out.append((loader.call.call, stmt))
    return out


def name_in_place_loaders(a: Anatomy) -> Optional[cst.Module]:
    """The module with each such loader bound to a fresh name above its loop (None: none found)."""
    from distify.edits import ApplyEdits, EditSet

    found = in_place(a)
    if not found:
        return None
    taken = set(a.name_bindings)
    edits = EditSet()
    for call, loop in found:
        name, i = "train_loader", 2
        while name in taken:
            name, i = f"train_loader_{i}", i + 1
        taken.add(name)
        line = cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(target=cst.Name(name))], value=call)])
        edits.insert_before(loop, [line])
        edits.replace(call, lambda n, name=name: cst.Name(name))
    return cst.parse_module(a.module.visit(ApplyEdits(edits)).bytes)
