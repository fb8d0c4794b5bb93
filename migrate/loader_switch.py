"""A loader factory's own distributed switch: a parameter of a project function whose value picks
a ``DistributedSampler`` or none for the loader the function builds (NERSC's
``get_data_loader(params, path, distributed, train)``: ``sampler = DistributedSampler(dataset) if
distributed else None``), and what each call of the factory passes for it (part of the anatomy's
data facts, see data_sources.py).

The switch is found from data flow: the loader's ``sampler=`` value is (or is bound once from) a
conditional expression whose test is the parameter itself, one branch a ``DistributedSampler(...)``
(resolved through the imports) and the other ``None``; the parameter is not rebound in the
function. Never from how the parameter is spelled. Read-only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst

from distify.records import DIST_SAMPLER
from distify.syntax import arg, dotted
from distify.values import Record

if TYPE_CHECKING:
    from distify.anatomy import Anatomy

OFF, ON = "off", "on"


class Switch(Record):
    """The parameter of the factory `fn` whose truth gives its loader a DistributedSampler."""

    __slots__ = ("fn", "param", "gate", "sampler_item", "size", "__dict__")
    fn: cst.FunctionDef
    param: str
    gate: cst.IfExp  # where the choice is made
    sampler_item: Optional[int]  # the position of the sampler in the returned tuple, if returned
    size: int  # the length of that tuple (0: the loader is returned alone)

    def __init__(self, fn: cst.FunctionDef, param: str, gate: cst.IfExp, sampler_item: Optional[int],
                 size: int) -> None:
        self._set(fn, param, gate, sampler_item, size)


def switch(a: "Anatomy", loader) -> Optional[Switch]:
    """The switch of the function that builds `loader` (a Loader of `a`), or None when its sampler
    does not depend on one of the function's parameters that way."""
    from distify.data_sources import gated_sampler

    fn = loader.call.scope
    given = arg(loader.call.call, 5, "sampler")
    if not isinstance(fn, cst.FunctionDef) or given is None:
        return None
    gate = gated_sampler(a, loader, given.value)
    if gate is None or not isinstance(gate.test, cst.Name) or not _made(a, gate.body):
        return None  # `... if not flag else ...`: a true value would not shard; left to DST901
    param = gate.test.value
    if param in a.facts.bindings(fn):
        return None  # rebound in the body: what the caller passes is not what decides
    item, size = _returned_item(fn, given.value)
    return Switch(fn, param, gate, item, size)


def setting(a: "Anatomy", sw: Switch, call: cst.Call) -> Optional[str]:
    """What `call` (a call of the factory) passes for the switch: OFF (a constant false, or nothing
    with a false default), ON (a constant true), None (anything else, or arguments unpacked)."""
    if any(x.star for x in call.args):
        return None
    value = a.facts.bound_value(call, sw.fn, sw.param)
    if value is None:
        value = _default(sw.fn, sw.param)
        return OFF if value is None or _truth(value) is False else None
    truth = _truth(value)
    return None if truth is None else (ON if truth else OFF)


def passed(a: "Anatomy", sw: Switch, call: cst.Call) -> Optional[cst.Arg]:
    """The argument of `call` that binds the switch (None: it is left to its default)."""
    params = a.facts.params(sw.fn)
    return arg(call, params.index(sw.param) if sw.param in params else None, sw.param)


def _made(a: "Anatomy", expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Call) and a.qualname(expr.func) in DIST_SAMPLER


def _truth(value: cst.BaseExpression) -> Optional[bool]:
    """A constant's truth: True/False/None and integer literals; None for anything else."""
    if isinstance(value, cst.Name) and value.value in ("True", "False", "None"):
        return value.value == "True"
    if isinstance(value, cst.Integer):
        return int(value.value, 0) != 0
    return None


def _default(fn: cst.FunctionDef, param: str) -> Optional[cst.BaseExpression]:
    for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params):
        if p.name.value == param:
            return p.default
    return None


def _returned_item(fn: cst.FunctionDef, sampler: cst.BaseExpression):
    """Where `fn` returns the sampler it gives its loader (``return dataloader, sampler``): the
    position in the returned tuple and the tuple's length; (None, 0) when not returned so."""
    from distify.program import _returns

    name = dotted(sampler)
    for ret in _returns(fn):
        if isinstance(ret.value, cst.Tuple):
            items = ret.value.elements
            for i, e in enumerate(items):
                if name is not None and dotted(e.value) == name:
                    return i, len(items)
    return None, 0
