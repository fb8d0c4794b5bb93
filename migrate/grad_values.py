"""Which values are gradients (part of the facts): torch's ``.grad`` attribute of a tensor, and the
names the script binds to values made from it (``grads = [p.grad for p in model.parameters()]``,
``for g in grads:``), never a name that merely says ``grad``.

A hand-written all-reduce of gradients (DST909), an explicit average that makes an optimizer's step
agree across ranks (DST954) and Horovod's grouped gradient average (the conversion, convert.py) are
recognised by this fact. (distify.gradients says which statements read gradients between backward()
and the step; this module says which values are gradients.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, FrozenSet, List, Set, Tuple

import libcst as cst

from distify.syntax import all_nodes, dotted

if TYPE_CHECKING:
    from distify.facts import Facts

GRAD = "grad"  # torch.Tensor.grad


def _reads(node: cst.CSTNode, names: FrozenSet[str]) -> bool:
    return any(
        (isinstance(n, cst.Attribute) and n.attr.value == GRAD) or (isinstance(n, (cst.Name, cst.Attribute)) and dotted(n) in names)
        for n in all_nodes(node)
    )


def _targets(target: cst.BaseExpression) -> List[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [t for el in target.elements for t in _targets(el.value)]
    d = dotted(target)
    return [d] if d else []


def gradient_names(facts: "Facts") -> FrozenSet[str]:
    """Dotted names bound to gradients or to containers of them (assignments and for-loop targets)."""
    flows: List[Tuple[List[str], cst.CSTNode]] = []
    for a, _stmt, scope, _cls in facts.assigns:  # an attribute of the instance: as every method spells it
        flows.append(([s for t in a.targets for n in _targets(t.target) for s in facts.spellings(scope, n)], a.value))
    for stmt in facts.statements():
        if isinstance(stmt, cst.For):
            flows.append((_targets(stmt.target), stmt.iter))
    found: Set[str] = set()
    changed = True
    while changed:
        changed = False
        names = frozenset(found)
        for targets, value in flows:
            if not set(targets) <= found and _reads(value, names):
                found |= set(targets)
                changed = True
    return frozenset(found)


def gradient_value(facts: "Facts", node: cst.CSTNode) -> bool:
    """The expression reads a gradient: ``p.grad``, ``param.grad.data``, a name bound to gradients."""
    return _reads(node, facts.gradient_names)
