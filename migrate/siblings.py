"""Reading the project's own modules next to a script: where a function imported from one of them
builds the DataLoader a training loop consumes.

distify rewrites one file at a time and never edits a module the script imports; but when that
module sits next to the script (``from utils import get_training_dataloader`` with ``utils.py``
beside ``train.py``) it can read it, to name the function and line that builds the loader and to
see what the loader was given: a ``DistributedSampler`` already, or a custom ``sampler`` /
``batch_sampler`` that no re-sharding can translate. Read with ``ast`` (no libcst, nothing run).
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

from distify.library import names_of

MAX_BYTES = 1024 * 1024  # a helper module larger than this is not read


@dataclass(frozen=True)
class Builder:
    """The function of a sibling module that builds a loader, and what it passes the DataLoader."""

    file: str  # the module's path relative to the script's folder ("utils.py", "data/loaders.py")
    line: int  # the line of its `def`
    # "distributed": every DataLoader it builds already has a DistributedSampler;
    # "sampler" / "batch_sampler": one gets a sampler / batch_sampler that is not a DistributedSampler;
    # None: nothing of the sort seen (a plain shuffle= / no sampler, or no DataLoader call found)
    sampler: Optional[str]

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def find_builder(script_path: Optional[str], qualname: str) -> Optional[Builder]:
    """The function `qualname` ("utils.get_training_dataloader") in a module next to the script
    at `script_path`, or None when there is no such readable module or function."""
    if not script_path or "." not in qualname or qualname.startswith("."):
        return None
    module, _, func = qualname.rpartition(".")
    base = os.path.dirname(os.path.abspath(script_path))
    parts = module.split(".")
    for rel in (os.path.join(*parts) + ".py", os.path.join(*parts, "__init__.py")):
        path = os.path.join(base, rel)
        try:
            if not os.path.isfile(path) or os.path.getsize(path) > MAX_BYTES:
                continue
            with open(path, "rb") as fh:
                tree = ast.parse(fh.read())
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func:
                return Builder(rel.replace(os.sep, "/"), node.lineno, _sampler_kind(node, _imports(tree)))
        return None
    return None


# what the module's calls are compared with: names as its imports resolve them (library knowledge
# from distify.library; never how the module spells them)
LOADERS = names_of("loader", shard="sampler")
DISTRIBUTED_SAMPLERS = frozenset({"torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler"})


def _imports(tree: ast.Module) -> Dict[str, str]:
    """Local name -> the dotted name it stands for, from the module's imports."""
    aliases: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    aliases[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _callee(node: ast.expr, aliases: Dict[str, str]) -> str:
    """The dotted name a call's callee resolves to through the module's imports ("" when unknown)."""
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return ""
    return ".".join([aliases[node.id], *reversed(parts)])


def _sampler_kind(fn: ast.AST, aliases: Dict[str, str]) -> Optional[str]:
    assigned: Dict[str, ast.expr] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            assigned[node.targets[0].id] = node.value
    kinds: List[Optional[str]] = []
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Call) and _callee(node.func, aliases) in LOADERS):
            continue
        kind = None
        for kw in node.keywords:
            if kw.arg not in ("sampler", "batch_sampler"):
                continue
            value = kw.value
            if isinstance(value, ast.Name) and value.id in assigned:
                value = assigned[value.id]
            if isinstance(value, ast.Constant) and value.value is None:
                continue
            if kw.arg == "sampler" and isinstance(value, ast.Call) and _callee(value.func, aliases) in DISTRIBUTED_SAMPLERS:
                kind = kind or "distributed"
            else:
                kind = kw.arg
        kinds.append(kind)
    if not kinds:
        return None
    if any(k in ("sampler", "batch_sampler") for k in kinds):
        return next(k for k in kinds if k in ("sampler", "batch_sampler"))
    return "distributed" if all(k == "distributed" for k in kinds) else None
