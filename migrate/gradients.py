"""Which statements read the gradients between a backward() and the optimizer step that uses them.

Horovod's DistributedOptimizer averages each gradient in the background from the moment backward()
produces it, in place, until ``step()`` (or ``synchronize()``) waits for the result. Code that reads
or rescales the gradients in between (gradient clipping, a norm for the log, a helper that clamps
``p.grad``) sees a gradient that may be local, averaged, or half of each, and ranks that clip by
different factors drift apart. What counts as reading them is a fact about the code, never about
names: a call the library table lists (``torch.nn.utils.clip_grad_norm_``, resolved through the
imports), a ``.grad`` attribute of any tensor (the torch attribute itself), or a call to a function
of this module that does either, a few calls deep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, FrozenSet, List, Optional, Sequence, Tuple

import libcst as cst

from distify.library import GRADIENT_READERS
from distify.syntax import all_nodes

if TYPE_CHECKING:  # pragma: no cover
    from distify.anatomy import Anatomy

_DEPTH = 3  # calls followed into this module's functions


def reads_gradients(anatomy: "Anatomy", node: cst.CSTNode, scope, seen: FrozenSet[cst.FunctionDef] = frozenset()) -> Optional[cst.CSTNode]:
    """The first node under `node` (a statement of `scope`) that reads or writes gradients, if any."""
    for n in all_nodes(node, skip_nested=True):
        if isinstance(n, cst.Attribute) and n.attr.value == "grad":
            return n
        if not isinstance(n, cst.Call):
            continue
        if anatomy.qualname(n.func) in GRADIENT_READERS:
            return n
        fn = anatomy.callee(n, scope)
        if fn is not None and fn not in seen and len(seen) < _DEPTH:
            if reads_gradients(anatomy, fn.body, fn, seen | {fn}) is not None:
                return n
    return None


def calls_backward(node: cst.CSTNode) -> bool:
    """`node` runs ``<tensor>.backward()`` itself (torch's method)."""
    return any(
        isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "backward"
        for n in all_nodes(node, skip_nested=True)
    )


def block_of(anatomy: "Anatomy", stmt: cst.CSTNode) -> Optional[Sequence[cst.CSTNode]]:
    """The statement list that holds `stmt` (a body, an else, a handler, the module)."""
    parents = anatomy.stmt_parent.get(stmt, ())
    owner = parents[-1] if parents else anatomy.module
    candidates: List[Sequence[cst.CSTNode]] = []
    if isinstance(owner, cst.Module):
        candidates.append(owner.body)
    for field in ("body", "orelse", "finalbody"):
        part = getattr(owner, field, None)
        if isinstance(part, (cst.Else, cst.Finally)):
            part = part.body
        if isinstance(part, cst.IndentedBlock):
            candidates.append(part.body)
    for handler in getattr(owner, "handlers", ()) or ():
        if isinstance(handler.body, cst.IndentedBlock):
            candidates.append(handler.body.body)
    return next((c for c in candidates if any(s is stmt for s in c)), None)


def gradient_reads_before(anatomy: "Anatomy", step_stmt: cst.CSTNode) -> Tuple[Optional[cst.CSTNode], Optional[cst.CSTNode]]:
    """For the statement of an optimizer step: (the first statement of its own block, after the last
    backward() there, that reads the gradients; a statement of an enclosing block, between its
    backward() and the block around the step, that reads them). The second is a read the step's
    condition does not cover."""
    scope = anatomy.scope_of(step_stmt)
    stmt: cst.CSTNode = step_stmt
    own = True
    while True:
        block = block_of(anatomy, stmt)
        if block is None:
            return None, None
        index = next(i for i, s in enumerate(block) if s is stmt)
        before = list(block[:index])
        start = max((i for i, s in enumerate(before) if calls_backward(s)), default=-1)
        for s in before[start + 1:]:
            if reads_gradients(anatomy, s, scope) is not None:
                return (s, None) if own else (None, s)
        parents = anatomy.stmt_parent.get(stmt, ())
        if start >= 0 or not parents or isinstance(parents[-1], (cst.For, cst.While, cst.FunctionDef, cst.ClassDef)):
            return None, None  # the backward's block, or the loop / function around the step: done
        stmt, own = parents[-1], False
