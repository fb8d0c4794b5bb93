"""What a checkpoint load binds besides the state of the model and the optimizer: the epoch or step
to resume from, the best metric so far (part of the fact layer, see facts.py).

A rank that cannot read the checkpoint (several nodes, no shared disk) skips the load: Horovod's
broadcasts hand it rank 0's parameters and optimizer state, but ``start_epoch = ckpt["epoch"] + 1``
keeps the value it had before, and the ranks run different epochs. These are the values to
broadcast with the state (DST112).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence

import libcst as cst

from distify.syntax import all_nodes, contains_node, dotted, flatten_target

if TYPE_CHECKING:  # pragma: no cover
    from distify.anatomy import Anatomy


def resumed_values(a: "Anatomy", stmt: cst.CSTNode, roots: Sequence[str]) -> List[str]:
    """The names (`start_epoch`, `args.start_epoch`, `best_acc1`) that `stmt`, a statement that
    loads a checkpoint, binds and its scope reads after it, in binding order: each already bound
    before `stmt` (a rank that skips the load keeps that value), none of the loaded models or
    optimizers (`roots`), none computed from the rank."""
    scope = a.stmt_scope.get(stmt)
    if scope is None:
        return []
    out: List[str] = []
    for node in all_nodes(stmt, skip_nested=True):
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if a.reads_rank(node.value):
            continue
        for target in targets:
            for el in flatten_target(target):
                name = dotted(el)
                if name is None or name in out:
                    continue
                root = name.split(".")[0]
                if any(name == r or name.startswith(r + ".") or root == r for r in roots):
                    continue
                if a.reaching_binding(scope, root, stmt) is None or not _read_after(a, name, stmt, scope):
                    continue
                out.append(name)
    return out


def _read_after(a: "Anatomy", name: str, stmt: cst.CSTNode, scope) -> bool:
    """A statement after `stmt` in its scope (not inside it) mentions `name`."""
    at = a.order(stmt)
    for later in a.facts.statements(scope):
        if a.order(later) <= at or stmt in a.stmt_parent.get(later, ()):
            continue
        if any(isinstance(n, (cst.Name, cst.Attribute)) and dotted(n) == name for n in all_nodes(later, skip_nested=True)):
            return True
    return False


def host_dependent(a: "Anatomy", stmt: cst.CSTNode, node: cst.CSTNode) -> bool:
    """`node` (a load in `stmt`) runs under an ``if`` whose test calls something that may answer
    differently on another host (``os.path.isfile(path)``: only rank 0's disk may hold the file),
    so some ranks may skip it without an error. A rank condition is no such test (the load is
    meant for those ranks)."""
    return bool(host_conditions(a, stmt, node))


def host_conditions(a: "Anatomy", stmt: cst.CSTNode, node: cst.CSTNode) -> List[cst.If]:
    """The ``if`` statements of `stmt` around `node` whose test may answer differently on another
    host (see ``host_dependent``), outermost first."""
    return [
        n for n in all_nodes(stmt, skip_nested=True)
        if isinstance(n, cst.If) and contains_node(n.body, node) and not a.facts.rank_condition(n.test)
        and any(isinstance(x, cst.Call) for x in all_nodes(n.test))
    ]


def sure_under(a: "Anatomy", stmt: cst.CSTNode, node: cst.CSTNode) -> Optional[List[cst.BaseExpression]]:
    """The tests under which `node`, inside the statement `stmt`, runs on every rank: the tests of
    the ``if`` statements between them, outermost first (``[]``: whenever `stmt` runs), when `node`
    is reached only through their bodies, ``with`` bodies and simple statements, and each test is
    the same on every rank (no call: ``os.path.isfile(path)`` may differ between hosts; no rank
    condition). None when `node` may not run although those tests hold, or where they may differ
    between ranks: in a ``try``, a loop, an ``else`` branch, under such a test. A load for which it
    is None may have run on some ranks only, or on none (a resume path that exists nowhere), so
    what it loaded must be asked of rank 0 (DST112)."""
    tests: List[cst.BaseExpression] = []
    current = stmt
    while not isinstance(current, cst.SimpleStatementLine):
        if isinstance(current, cst.If) and contains_node(current.body, node) and not contains_node(current.test, node):
            if a.facts.rank_condition(current.test) or any(isinstance(n, cst.Call) for n in all_nodes(current.test)):
                return None
            tests.append(current.test)
        elif not isinstance(current, cst.With) or contains_node(current.items, node):
            return None
        inner = [s for s in current.body.body if contains_node(s, node)]
        if not inner:
            return None
        current = inner[0]
    return tests


def rank_conditions(a: "Anatomy", stmt: cst.CSTNode, node: cst.CSTNode) -> List[cst.If]:
    """The ``if`` statements of `stmt` around `node` whose test is a rank condition (``if rank ==
    0:``), outermost first: a load under one runs on those ranks only. In the single process the
    test held (it is rank 0), so every rank of the migration must end with what that load gave."""
    return [
        n for n in all_nodes(stmt, skip_nested=True)
        if isinstance(n, cst.If) and n is not node and contains_node(n, node) and not contains_node(n.test, node)
        and a.facts.rank_condition(n.test)
    ]


BROADCASTS = frozenset({"distify.runtime.broadcast_module", "distify.runtime.broadcast_object"})


def broadcast_follows(a: "Anatomy", stmt: cst.CSTNode) -> bool:
    """The statement after `stmt` at its level broadcasts with the runtime already (distify's own
    output, migrated again)."""
    scope, level, at = a.stmt_scope.get(stmt), a.stmt_parent.get(stmt, ()), a.order(stmt)
    for later in a.facts.statements(scope):
        if a.order(later) > at and a.stmt_parent.get(later, ()) == level:
            return broadcasts(a, later)
    return False


def broadcasts(a: "Anatomy", stmt: cst.CSTNode) -> bool:
    """`stmt` hands rank 0's state to the other ranks with the runtime (distify's own broadcast: the
    optimizer's ``load_state_dict(runtime.broadcast_object(...))`` is that, not a load to follow)."""
    return any(c.qualname in BROADCASTS for c in a.calls if c.stmt is stmt or stmt in c.parents)


def schedulers_loaded(a: "Anatomy", loaded: cst.CSTNode) -> List[str]:
    """The LR schedulers of `loaded`'s scope (names bound to a ``torch.optim.lr_scheduler`` class)
    whose state the statement loads (``scheduler.load_state_dict(checkpoint["scheduler"])``, also in
    a function of the script it calls): a rank that skipped the load would count its epochs from 0
    and decay its learning rate elsewhere."""
    from distify.library import SCHEDULER_MODULES
    from distify.records import assigned_name

    from distify.model_state import changes_in

    scope = a.facts.stmt_scope.get(loaded)
    built = {assigned_name(c.stmt, c.call) for c in a.calls
             if c.scope is scope and c.qualname and c.qualname.rsplit(".", 1)[0] in SCHEDULER_MODULES} - {None}
    if not built:
        return []
    out: List[str] = []
    # in the statement, or in a function of the script it hands the scheduler to
    # (`load_checkpoint(path, model, optimizer, scheduler)`): distify.model_state follows both
    for change in changes_in(a.facts, a.qualname, loaded, sorted(built)):
        if change.kind == "load" and change.root in built and change.root not in out:
            out.append(change.root)
    return out


def state_from_rank0(rt: str, name: str) -> str:
    """``name.load_state_dict(<rt>.broadcast_object(name.state_dict()))``: rank 0's state of an
    object with a state dict (an optimizer, an LR scheduler) on every rank."""
    return f"{name}.load_state_dict({rt}.broadcast_object({name}.state_dict()))"


def values_from_rank0(rt: str, values: Sequence[str]) -> str:
    """``a, b = <rt>.broadcast_object((a, b))`` (one name: no tuple): rank 0's values of the names a
    load binds, on every rank."""
    names = ", ".join(values)
    return f"{names} = {rt}.broadcast_object({names if len(values) == 1 else f'({names})'})"
