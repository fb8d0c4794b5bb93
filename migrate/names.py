"""What a name in a script is: its qualified name through the module's imports, and what distify
knows about that object (``distify.library``).

One service for every fact: the anatomy's collector records the imports (``import torch.utils.data
as tud``, ``from tqdm.auto import tqdm as bar``) into an alias map; ``qualified`` turns a callee or
reference (a Name/Attribute chain) into ``torch.utils.data.DataLoader``, ``tqdm.auto.tqdm``, the
script's own ``utils.get_loader``. A builtin the module does not rebind is ``builtins.<name>``.
Resolution is a dictionary lookup per node, done only for the nodes a fact asks about; libcst's
scope metadata is not needed (it costs about ten times a parse for a whole module).
"""

from __future__ import annotations

import builtins
from typing import Callable, Collection, Dict, Optional, Sequence

import libcst as cst

from distify.syntax import arg, dotted
from distify.library import Known, known

# modules distify may import into a script that uses them without importing them
IMPLICIT_MODULES = frozenset({"os"})
_BUILTINS = frozenset(dir(builtins))


def resolve(aliases: Dict[str, str], expr: cst.BaseExpression) -> Optional[str]:
    """Qualified name of a Name/Attribute chain through the module's imports (None if local)."""
    return resolve_dotted(aliases, dotted(expr))


def resolve_dotted(aliases: Dict[str, str], d: Optional[str]) -> Optional[str]:
    """`resolve` of a chain already spelled out (``"U.train_one_epoch"``)."""
    if d is None:
        return None
    head, _, rest = d.partition(".")
    if head in aliases:
        base = aliases[head]
        return f"{base}.{rest}" if rest else base
    if head in IMPLICIT_MODULES:
        # `os` used without an import (it came through a star import, or the script is broken):
        # distify may add `import os` itself (os.devnull), after which a second run would resolve
        # these uses; resolving them now keeps the two runs alike
        return d
    return None


class Defined(dict):
    """The functions (or the classes) an analysed module defines at its top level, by their own
    name, and the one way to ask which of them a callee names: ``named``. The spelling is resolved
    through the module's imports, so that in a project view (``distify.project_view``: the script
    and the helper module analysed as one) ``train_one_epoch(...)``, ``step(...)`` after ``from
    utils import train_one_epoch as step``, ``utils.train_one_epoch(...)`` and
    ``U.train_one_epoch(...)`` after ``import utils as U`` all name the definition the view holds
    for ``utils.train_one_epoch``. `aliases` is the module's import map (filled while it is
    analysed), `homes` maps the qualified name of each definition joined from another module to
    its name here."""

    def __init__(self, aliases: Dict[str, str], homes: Optional[Dict[str, str]] = None) -> None:
        super().__init__()
        self.aliases = aliases
        self.homes = homes or {}

    def named(self, d: Optional[str]):
        """The definition the callee spelled `d` (a dotted chain) names, or None."""
        if not d:
            return None
        return self[d] if d in self else self.get(self.local(d))

    def local(self, d: str) -> str:
        """The name, in the analysed module, of what the chain `d` names: the joined definition's
        own name when `d` reaches it through an import (``U.train_one_epoch``:
        ``train_one_epoch``), `d` itself otherwise. Holds for classes as for functions (one
        `homes` map for both)."""
        if self.homes and d not in self:
            local = self.homes.get(resolve_dotted(self.aliases, d) or "")
            if local is not None:
                return local
        return d


def qualified(aliases: Dict[str, str], expr: cst.BaseExpression, bound: Collection[str] = ()) -> Optional[str]:
    """`resolve`, and a builtin the module does not bind itself (`bound`: every name it binds) as
    ``builtins.<name>``: ``enumerate`` is ``builtins.enumerate`` unless the script defines its own."""
    q = resolve(aliases, expr)
    if q is None and isinstance(expr, cst.Name) and expr.value in _BUILTINS and expr.value not in bound:
        return f"builtins.{expr.value}"
    return q


def qualname_or_builtin(a, func: cst.BaseExpression) -> Optional[str]:
    """What a call's function is in the analysed module `a` (``Anatomy``): its qualified name through
    the imports, else a builtin the module does not define or bind itself (``builtins.range``)."""
    q = a.qualname(func)
    if q is None and isinstance(func, cst.Name) and func.value in _BUILTINS:
        if func.value not in a.functions and func.value not in a.classes and func.value not in a.name_bindings:
            q = f"builtins.{func.value}"
    return q


def row_of(aliases_q: Callable[[cst.BaseExpression], Optional[str]], expr: cst.BaseExpression) -> Optional[Known]:
    """The library row of `expr` through a module's resolver (``Anatomy.qualname``), a bare builtin
    name as ``builtins.<name>``."""
    q = aliases_q(expr)
    if q is None and isinstance(expr, cst.Name) and expr.value in _BUILTINS:
        q = f"builtins.{expr.value}"
    return known(q)


def unwrapped(facts, aliases_q, scope, ref: str, at: cst.CSTNode, ref_of: Callable[[cst.BaseExpression], Optional[str]]) -> str:
    """What a loop over the plain name `ref` reads when `ref` is bound, before `at` in `scope`, to a
    pass-through wrapper of one iterable (``bar = tqdm(self.train_loader)``: ``self.train_loader``),
    followed through chains of them; `ref` itself otherwise. A wrapper is never the loader: the
    sampler, its epoch and a re-sharding belong to the loader it wraps. `ref_of` spells the
    wrapped expression as the anatomy does (``ref_text``)."""
    seen = set()
    while "." not in ref and "[" not in ref and ref not in seen:
        seen.add(ref)
        b = facts.reaching_binding(scope, ref, at)
        small = b.stmt.body[0] if b is not None and isinstance(b.stmt, cst.SimpleStatementLine) and len(b.stmt.body) == 1 else None
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Call)):
            break
        if not (isinstance(small.targets[0].target, cst.Name) and small.targets[0].target.value == ref):
            break
        row = row_of(aliases_q, small.value.func)
        inner = arg(small.value, 0, "iterable") if row is not None and row.kind == "wrapper" and row.items == "first" else None
        wrapped = ref_of(inner.value) if inner is not None and not inner.star else None
        if wrapped is None:
            break
        ref, at = wrapped, b.stmt
    return ref


def star_import(modules: Sequence[str], expr: cst.BaseExpression, bound: Collection[str]) -> Optional[str]:
    """``<module>.<name>`` for a name the module never binds nor imports by name, when exactly one
    star import of a module that is not torch's can have brought it (``from utils import *`` then
    ``get_data(args)``: ``utils.get_data``); None when none or several could have."""
    d = dotted(expr)
    head = d.partition(".")[0] if d else ""
    if not head or head in bound or head in _BUILTINS:
        return None
    own = [m for m in modules if m.split(".")[0] != "torch"]
    return f"{own[0]}.{d}" if len(own) == 1 else None


def library_calls(calls, kind: str, **match: str) -> list:
    """(row, call site) of each call of a library object of `kind` (and the given row fields), in
    source order: ``library_calls(a.calls, "loader", shard="input_nodes")``."""
    out = []
    for site in calls:
        row = known(site.qualname)
        if row is not None and row.kind == kind and all(getattr(row, k) == v for k, v in match.items()):
            out.append((row, site))
    return out


def frameworks(calls) -> list:
    """(row, call site) of each call into a training framework that distributes the script itself
    (Accelerate's ``Accelerator()``, Lightning's ``Trainer``/``Fabric``, Hugging Face's ``Trainer``,
    ``deepspeed.initialize``...; see ``distify.library``), in source order."""
    return library_calls(calls, "framework")


def seeds_sharded(site) -> bool:
    """`site` builds a loader the table shards through its seed nodes (PyG's NeighborLoader) and
    hands it this rank's part of them: ``input_nodes=runtime.shard_nodes(...)``."""
    row = known(site.qualname)
    if row is None or row.kind != "loader" or row.shard != "input_nodes":
        return False
    nodes = arg(site.call, 2, "input_nodes")
    func = nodes.value.func if nodes is not None and isinstance(nodes.value, cst.Call) else None
    return isinstance(func, cst.Attribute) and func.attr.value == "shard_nodes"
