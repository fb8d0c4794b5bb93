"""Which call built a value, and which ``__init__`` a construction runs.

Two facts over one analysed module (``distify.facts.Facts``), each decided by what names are (the
instance keys of ``Facts.key``, the module's class table), never by their spelling:

- ``made_by``: the call of a library constructor a name or an attribute of the instance holds
  (``self.scaler = torch.amp.GradScaler(...)`` in ``__init__``, read as ``this.scaler`` in a step);
- ``init_of``: the ``__init__`` of the module's own class a call builds (``Trainer(model,
  DataLoader(...))``), for the facts that follow arguments into the function they bind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Tuple

import libcst as cst

from distify.syntax import Scope, dotted, sole_statement

if TYPE_CHECKING:
    from distify.facts import Facts
    from distify.records import CallSite


def made_by(facts: "Facts", scope: Scope, e: Optional[cst.BaseExpression], qualnames) -> Optional["CallSite"]:
    """The call of one of `qualnames` whose result `e` holds, read in `scope`: the site of an
    ``x = <call>`` whose target has `e`'s key (an attribute of the instance matches however each
    method spells its instance); the first where several do (``scaler = GradScaler(enabled=...)``
    in two branches). None when none does."""
    key = facts.key(scope, dotted(e)) if e is not None else (0, None)
    if key[1] is None:
        return None

    def index():
        made: Dict[Tuple[int, Optional[str]], list] = {}
        for c in facts.calls:
            small = sole_statement(c.stmt)
            if isinstance(small, cst.Assign) and small.value is c.call and len(small.targets) == 1:
                made.setdefault(facts.key(c.scope, dotted(small.targets[0].target)), []).append(c)
        return made

    return next((c for c in facts.memo(("made_by",), index).get(key, ()) if c.qualname in qualnames), None)


def init_of(facts: "Facts", call: cst.Call) -> Optional[cst.FunctionDef]:
    """The ``__init__`` that `call` runs when it builds an instance of a class of this module (the
    class the module's class table resolves the callee to, not its spelling); None otherwise, also
    for a class without an ``__init__`` of its own."""
    classes = facts.classes
    cls = classes.named(dotted(call.func)) if classes is not None else None
    if cls is None:
        return None
    return next((m for m, k in facts.methods.items() if k is cls and m.name.value == "__init__"), None)
