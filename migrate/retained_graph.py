"""Backward passes that run through a wrapped model's forward a second time.

DDP averages a parameter's gradient once per forward: the first backward through a forward's graph
fires its hooks and finishes the reduction, and a second backward through the same graph (kept by
``retain_graph=True``) adds gradients the reducer no longer watches. They stay this rank's own, and
the ranks drift apart with no error (measured on torch 2.13, gloo: ``l1.backward(retain_graph=True);
l2.backward()`` over one DDP forward leaves rank-local gradients). The WGAN-GP loop does it without
saying so: ``fake = gen(noise)`` feeds the critic's loss, whose backward keeps the graph, and then the
generator's loss, whose backward runs through ``gen``'s forward again.

Data flow inside each training loop, in source order, over two iterations (the second sees what the
first carries over): a value remembers the wrapped-model calls (forwards) it was computed from;
``.detach()``, ``.item()``, ``.data`` and values computed under ``torch.no_grad()`` carry no graph; a
call of another function with the model as an argument counts as a forward of it. A ``backward`` (or
``torch.autograd.backward``) with ``retain_graph`` marks the forwards its loss comes from as
backpropagated; a later backward whose loss comes from one of them is the gap. Read-only.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import libcst as cst

from distify.facts import Facts
from distify.library import NO_GRAD
from distify.model_contract import training_loops
from distify.syntax import all_nodes, dotted
from distify.values import Value

NO_GRAPH_METHODS = frozenset({"detach", "item", "tolist", "numpy", "detach_"})
BACKWARD = frozenset({"torch.autograd.backward"})

Origin = Tuple[int, int]  # (iteration, id of the forward call)


class Retained(Value):
    """A second backward through a forward whose graph an earlier backward kept (``retained_backwards``)."""

    __slots__ = ("backward", "first", "forward", "model")
    backward: cst.Call  # the second backward
    first: cst.Call  # the backward that kept the graph
    forward: cst.Call  # the wrapped model's forward both run through
    model: str

    def __init__(self, backward: cst.Call, first: cst.Call, forward: cst.Call, model: str) -> None:
        self._set(backward, first, forward, model)


def retained_backwards(facts: Facts, qualname, scope, roots: Sequence[str]) -> List[Retained]:
    """The backward calls of `scope`'s training loops that run through a forward of one of `roots`
    already backpropagated with ``retain_graph``."""
    roots = tuple(roots)
    out: List[Retained] = []
    for loop in training_loops(facts, scope):
        body = [s for s in facts.statements(scope) if loop in facts.stmt_parent.get(s, ()) and isinstance(s, cst.SimpleStatementLine)]
        if not any(_keeps_graph(n) for s in body for n in all_nodes(s, skip_nested=True) if isinstance(n, cst.Call)):
            continue
        flows: Dict[str, FrozenSet[Origin]] = {}
        kept: Dict[Origin, Tuple[int, cst.Call]] = {}  # forward -> the backward (iteration, call) that kept it
        forwards: Dict[int, Tuple[cst.Call, str]] = {}
        for it in (0, 1):
            for s in body:
                quiet = any(_no_grad(qualname, p) for p in facts.stmt_parent.get(s, ()))
                for small in s.body:
                    _step(small, it, quiet, qualname, roots, flows, kept, forwards, out)
    seen: Set[int] = set()
    return [r for r in out if not (id(r.backward) in seen or seen.add(id(r.backward)))]


def _no_grad(qualname, stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.With) and any(
        isinstance(i.item, cst.Call) and qualname(i.item.func) in NO_GRAD for i in stmt.items
    )


def _keeps_graph(call: cst.Call) -> bool:
    """A backward call with ``retain_graph`` (or ``create_graph``) set to anything but False/None."""
    for a in call.args:
        if a.keyword is not None and a.keyword.value in ("retain_graph", "create_graph"):
            return not (isinstance(a.value, cst.Name) and a.value.value in ("False", "None"))
    return False


def _is_backward(qualname, call: cst.Call) -> Optional[cst.BaseExpression]:
    """The loss a backward call differentiates, else None."""
    f = call.func
    if isinstance(f, cst.Attribute) and f.attr.value == "backward":
        return f.value
    if qualname(f) in BACKWARD and call.args:
        return call.args[0].value
    return None


def _origins(expr: cst.CSTNode, it: int, roots, flows, forwards) -> FrozenSet[Origin]:
    """The forwards `expr`'s value is computed from (nothing through detach/item/.data)."""
    found: Set[Origin] = set()
    stack = [expr]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in NO_GRAPH_METHODS:
            continue
        if isinstance(n, cst.Attribute) and n.attr.value == "data":
            continue
        if isinstance(n, (cst.Lambda, cst.FunctionDef)):
            continue
        if isinstance(n, cst.Call):
            model = _model_of(n, roots)
            if model is not None:
                found.add((it, id(n)))
                forwards[id(n)] = (n, model)
        d = dotted(n) if isinstance(n, (cst.Name, cst.Attribute)) else None
        if d is not None and d in flows:
            found |= flows[d]
            if isinstance(n, cst.Name):
                continue
        stack.extend(n.children)
    return frozenset(found)


def _model_of(call: cst.Call, roots) -> Optional[str]:
    """The wrapped model `call` runs: ``gen(z)``, ``gen.module(z)``, or another function handed it
    (``gradient_penalty(critic, real, fake)``)."""
    d = dotted(call.func)
    for r in roots:
        if d is not None and (d == r or d.startswith(r + ".")) and not _method_call(d, r):
            return r
        if any(dotted(a.value) == r for a in call.args):
            return r
    return None


def _method_call(d: str, root: str) -> bool:
    """``gen.parameters()``, ``gen.state_dict()``: methods of the model, not its forward."""
    rest = d[len(root) + 1:] if d != root else ""
    return bool(rest) and rest not in ("module", "forward", "module.forward")


def _names(target: cst.BaseExpression) -> List[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _names(target.value)
    d = dotted(target)
    return [d] if d else []


def _step(small, it, quiet, qualname, roots, flows, kept, forwards, out) -> None:
    if isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign)) and small.value is not None:
        got = frozenset() if quiet else _origins(small.value, it, roots, flows, forwards)
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
        for t in targets:
            for name in _names(t):
                flows[name] = (flows.get(name, frozenset()) | got) if isinstance(small, cst.AugAssign) else got
    for n in all_nodes(small, skip_nested=True):
        if not isinstance(n, cst.Call):
            continue
        loss = _is_backward(qualname, n)
        if loss is None:
            continue
        got = _origins(loss, it, roots, flows, forwards)
        for o in got:
            if o in kept and (kept[o][0] != it or kept[o][1] is not n):
                fwd, model = forwards[o[1]]
                out.append(Retained(n, kept[o][1], fwd, model))
                break
        if _keeps_graph(n):
            for o in got:
                kept.setdefault(o, (it, n))
