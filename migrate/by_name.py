"""What a script builds by name (part of the facts): code distify cannot follow to its class.

``model = create_model(opt)`` whose project function imports ``models/<opt.model>_model.py`` with
``importlib.import_module``, or ``config.init_obj('optimizer', torch.optim, params)`` that looks up a
class of ``torch.optim`` by a string of the configuration: which class runs is known only when the
script runs. A file whose training is built this way has no loop distify can migrate, and must not
read as "nothing to do": DST961 says where the object is built and where the script uses it. Which
calls import by name and which modules hold optimizers are rows of ``distify.library``; what a call
reaches comes from the program model (``distify.program``), never from how anything is spelled.
"""

from __future__ import annotations

from typing import List, Optional, Set

import libcst as cst

from distify.library import IMPORTS_BY_NAME, OPTIMIZER_MODULES, SCHEDULER_MODULES
from distify.names import qualified
from distify.records import CallSite
from distify.values import Value

DEPTH = 2  # project calls followed below the function the script calls


def builds_optimizer_by_name(a, site: CallSite) -> bool:
    """`site` is handed a module of optimizer classes (``torch.optim``) to build one by name."""
    return any(qualified(a.aliases, x.value, a.name_bindings) in OPTIMIZER_MODULES for x in site.call.args)


def builds_scheduler_by_name(a, site: CallSite) -> bool:
    """`site` is handed the module of learning-rate schedulers to build one by name (it steps the
    learning rate of the optimizer it is also handed: not where training runs)."""
    return any(qualified(a.aliases, x.value, a.name_bindings) in SCHEDULER_MODULES for x in site.call.args)


class ByName(Value):
    """A call of the script whose project function imports the class it builds by name."""

    __slots__ = ("site", "where", "importer", "uses")
    site: CallSite  # the script's call (``create_model(opt)``)
    where: str  # the function it reaches: "models/__init__.py:18"
    importer: str  # the import by name: "importlib.import_module() at models/__init__.py:10"
    uses: List[CallSite]  # the script's calls of methods of what it returns, inside a loop

    def __init__(self, site: CallSite, where: str, importer: str, uses: List[CallSite]) -> None:
        self._set(site, where, importer, uses)


def imported_by_name(prog, target, depth: int = DEPTH, _seen: Optional[Set[int]] = None) -> Optional[str]:
    """Where `target` (or a project function it calls, `depth` levels down) imports a module whose
    name is a value: ``"importlib.import_module() at models/__init__.py:10"``; None when it does not."""
    from distify.helper_effects import same_module

    seen = _seen if _seen is not None else set()
    if id(target.fn) in seen:
        return None
    seen.add(id(target.fn))
    a = target.unit.anatomy
    inner = []
    for c in a.calls:
        if c.scope is not target.fn:
            continue
        if qualified(target.unit.aliases, c.call.func, a.name_bindings) in IMPORTS_BY_NAME:
            file = target.where.rsplit(":", 1)[0]
            return f"{c.qualname.rsplit('.', 1)[-1] if c.qualname else '__import__'}() at {file}:{a.position(c.call)[0]}"
        if depth > 0:
            t = prog.target(target.unit, c.call, c.scope, c.stmt) or same_module(target, c)
            if t is not None:
                inner.append(t)
    for t in inner:
        found = imported_by_name(prog, t, depth - 1, seen)
        if found is not None:
            return found
    return None


def built_by_name(a, path: Optional[str], options) -> List[ByName]:
    """The calls of the script analysed as `a` (at `path`) that reach a project function importing
    by name what it builds, whose result the script binds and uses in a loop (``model =
    create_model(opt)`` ... ``model.optimize_parameters()`` in the epoch loop)."""
    if not path:
        return []
    from distify.program import program_of, reached

    out = []
    for c in a.calls:
        small = c.stmt.body[0] if isinstance(c.stmt, cst.SimpleStatementLine) and len(c.stmt.body) == 1 else None
        if not (isinstance(small, cst.Assign) and small.value is c.call and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)):
            continue
        name = small.targets[0].target.value
        uses = [u for u in a.calls if isinstance(u.call.func, cst.Attribute) and isinstance(u.call.func.value, cst.Name)
                and u.call.func.value.value == name and u.scope is c.scope and a.facts.loops_around(u.stmt)
                and a.facts.instance_call(u.scope, name, u.stmt) is c.call]
        if not uses:
            continue
        t = reached(a, path, options, c).target
        importer = imported_by_name(program_of(a), t) if t is not None else None
        if importer is not None:
            out.append(ByName(c, t.where, importer, uses))
    return out
