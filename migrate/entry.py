"""Where a script's process-group setup goes: the body that first builds the training pieces
(module level, the `if __name__ == "__main__":` block, or the function it calls that builds them;
part of the anatomy, see anatomy.py). Read-only."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence, Set, Tuple

import libcst as cst

from distify.records import CallSite
from distify.syntax import dotted

if TYPE_CHECKING:  # pragma: no cover
    from distify.records import _Collector


def entry_point(
    col: "_Collector", module: cst.Module, constructions: List[CallSite]
) -> Tuple[Optional[cst.CSTNode], Sequence[cst.CSTNode]]:
    """Where process-group setup goes: the body that first builds the training pieces."""
    if not constructions:
        return None, ()
    at_module = [c for c in constructions if isinstance(c.scope, cst.Module) and c.cls is None]
    if at_module:
        guard = col.main_guard
        if guard is not None and all(guard in c.parents for c in at_module):
            return guard, guard.body.body  # training written inline under `if __name__ == ...`
        return module, module.body

    construction_scopes: Set[cst.CSTNode] = {c.scope for c in constructions}
    construction_classes: Set[cst.CSTNode] = {c.cls for c in constructions if c.cls is not None}

    def relevant(fn: cst.FunctionDef, seen=frozenset()) -> bool:
        if fn in construction_scopes or col.methods.get(fn) in construction_classes:
            return True
        for c in col.calls:
            if c.scope is fn:
                d = dotted(c.call.func)
                f = col.functions.named(d)
                if f is not None and f not in seen and f is not fn and relevant(f, seen | {fn}):
                    return True
                if col.classes.named(d) in construction_classes:
                    return True
        return False

    def descend(owner: cst.CSTNode, body: Sequence[cst.CSTNode], seen) -> Tuple[cst.CSTNode, Sequence[cst.CSTNode]]:
        # the first statement of `body` that (transitively) builds training pieces
        for stmt in body:
            sites = [c for c in col.calls if c.stmt is stmt or stmt in c.parents]
            for c in sites:
                d = dotted(c.call.func)
                fn = col.functions.named(d)
                if fn is not None and fn not in seen and relevant(fn):
                    is_bare_call = (
                        isinstance(stmt, cst.SimpleStatementLine)
                        and isinstance(stmt.body[0], cst.Expr)
                        and stmt.body[0].value is c.call
                    )
                    if is_bare_call:
                        return descend(fn, fn.body.body, seen | {fn})
                    return owner, body
                if c.scope in construction_scopes or col.classes.named(d) in construction_classes:
                    return owner, body
        return owner, body

    if col.main_guard is not None:
        owner, body = descend(col.main_guard, col.main_guard.body.body, frozenset())
        return owner, body
    # no guard: module-level calls of a function, e.g. a bare `main()` at the bottom
    return descend(module, module.body, frozenset())
