"""How an earlier ``distify --standalone`` run's inline runtime class is recognised in a script.

A fact the analysis needs on every file (``anatomy.standalone_runtime``, the collector's statement
records): it lives apart from ``distify.standalone`` and ``distify.inline_helpers``, which write
the class and are imported only by a run that writes one. The class opens with distify's own marker
comment (``# distify: standalone runtime (v2, ddp) ...``): distify's output, never the user's code.
"""

from __future__ import annotations

import re
from typing import FrozenSet, List, Optional

import libcst as cst

from distify.values import Value

MARKER = "# distify: standalone runtime (v{version}, {backend})"  # opens the class; found by find_block
_MARKER_RE = re.compile(r"#\s*distify: standalone runtime \(v(\d+), (\w+)\)")


class Block(Value):
    """The inline runtime class of an earlier ``--standalone`` run."""

    __slots__ = ("node", "name", "backend", "members")
    node: cst.ClassDef
    name: str
    backend: str
    members: FrozenSet[str]

    def __init__(self, node: cst.ClassDef, name: str, backend: str, members: FrozenSet[str]) -> None:
        self._set(node, name, backend, members)


def _marker(cls: cst.ClassDef) -> Optional["re.Match"]:
    for line in cls.leading_lines:
        match = _MARKER_RE.match(line.comment.value) if line.comment is not None else None
        if match:
            return match
    return None


def is_standalone_block(cls: cst.ClassDef) -> bool:
    """True for a class that opens with the marker comment (the caller checks it is top-level)."""
    return _marker(cls) is not None


def find_block(module: cst.Module) -> Optional[Block]:
    for stmt in module.body:
        match = _marker(stmt) if isinstance(stmt, cst.ClassDef) else None
        if match:
            return Block(stmt, stmt.name.value, match.group(2), frozenset(_members(stmt)))
    return None


def _members(cls: cst.ClassDef) -> List[str]:
    names = []
    for stmt in cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ():
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            names.append(stmt.name.value)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                targets = small.targets if isinstance(small, cst.Assign) else ()
                names += [t.target.value for t in targets if isinstance(t.target, cst.Name)]
    return names
