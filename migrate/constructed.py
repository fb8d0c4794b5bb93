"""Which call built a value, and which ``__init__`` a construction runs.

A fact over one analysed module (``distify.facts.Facts``), decided by what names are (the
instance keys of ``Facts.key``), never by their spelling:

- ``made_by``: the call of a library constructor a name or an attribute of the instance holds
  (``self.scaler = torch.amp.GradScaler(...)`` in ``__init__``, read as ``this.scaler`` in a step).
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
