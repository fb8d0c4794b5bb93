"""Facts about what a script's names hold, read from how they are bound, never from how they are spelled.

A device variable may be called `device`, `dev` or `v1`; what makes it the device is that it is bound
to `torch.device(...)` (or the `"cuda" if torch.cuda.is_available() else "cpu"` idiom), and a
parameter is the device when every caller passes it one. Rules ask these questions here instead of
testing a name's text (issue #21: no decision by spelling; tests/test_metamorphic.py checks it).
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from distify.library import known
from distify.syntax import all_nodes, dotted


DEVICE_CALLS = frozenset({"torch.device"})


def _string(expr: cst.BaseExpression) -> Optional[str]:
    if isinstance(expr, cst.SimpleString) and isinstance(expr.evaluated_value, str):
        return expr.evaluated_value
    return None


def is_device_value(a, expr: Optional[cst.BaseExpression]) -> bool:
    """`expr` evaluates to a device: `torch.device(...)` (through any import alias), or the string
    idiom `"cuda" if torch.cuda.is_available() else "cpu"`."""
    if isinstance(expr, cst.Call):
        return a.qualname(expr.func) in DEVICE_CALLS
    if isinstance(expr, cst.IfExp):
        return (
            (_string(expr.body) or "").startswith("cuda")
            and _string(expr.orelse) == "cpu"
            and isinstance(expr.test, cst.Call)
            and a.qualname(expr.test.func) == "torch.cuda.is_available"
        )
    return False


def device_name(a, scope) -> Optional[str]:
    """The plain name `scope` binds to a device (see ``is_device_value``), the first in source
    order; None when it binds none."""
    for assign, _stmt, sc, _cls in a.facts.assigns:
        if sc is not scope or len(assign.targets) != 1:
            continue
        target = assign.targets[0].target
        if isinstance(target, cst.Name) and is_device_value(a, assign.value):
            return target.value
    return None


def device_param(a, fn: cst.FunctionDef) -> Optional[str]:
    """The parameter of `fn` that every caller (one at least) binds to its own device variable."""
    callers = a.callers(fn)
    if not callers:
        return None
    for p in a.facts.params(fn):
        values = [a.bound_value(c.call, fn, p) for c in callers]
        if all(
            isinstance(v, cst.Name) and v.value == device_name(a, c.scope)
            for v, c in zip(values, callers)
        ):
            return p
    return None

def built_from(a, receiver: Optional[str], value: cst.BaseExpression) -> bool:
    """`receiver` is bound to an object a call built from the same reference `value` names:
    `ema = ModelEMA(model)` then `ema.update(model)` (an EMA of the model, whatever it is called)."""
    ref = dotted(value)
    if not receiver or not ref:
        return False
    for assign, _stmt, _scope, _cls in a.facts.assigns:
        if (
            len(assign.targets) == 1
            and dotted(assign.targets[0].target) == receiver
            and isinstance(assign.value, cst.Call)
            and any(x.keyword is None and dotted(x.value) == ref for x in assign.value.args)
        ):
            return True
    return False


def copies_argument(a, site, i: int) -> bool:
    """Argument `i` of this call is copied or averaged into a copy: an EMA / SWA model, a
    deepcopy. The copy must be of the module, not of the DDP wrapper (its state would carry
    `module.` keys and its updates would go through the wrapper)."""
    row = known(site.qualname)
    if row is not None and row.kind == "copy":
        return row.argument == i
    func = site.call.func
    if site.qualname is not None or not isinstance(func, cst.Attribute) or i != 0:
        return False
    # `ema.update(model)` on an object built from the model (`ema = ModelEMA(model)`), whatever it
    # is called; `swa.update_parameters(model)` is torch's AveragedModel API
    return func.attr.value == "update_parameters" or (
        func.attr.value == "update" and built_from(a, dotted(func.value), site.call.args[0].value)
    )
