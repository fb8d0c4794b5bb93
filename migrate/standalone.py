"""``distify --standalone``: the launcher plumbing written into the script instead of imported.

By default a migrated script imports ``from distify import runtime``. With ``--standalone`` the
script gets a small class named ``runtime`` instead, placed right after its imports, holding only
the helpers the script calls (``runtime.init_kwargs()``, ``runtime.device()``, ...) written in plain
torch and ``os.environ``. The rules do not know the difference: they emit ``runtime.<helper>()``
either way, and :func:`finish` writes the class once all edits are applied, when it is known which
helpers the script uses.

The class opens with a marker comment (``# distify: standalone runtime (v1, ddp) ...``). It makes a
standalone script recognisable as distify's output, so that a later run works incrementally: it adds
only helpers that new code needs (appended to the class, the user's edits to it kept) and keeps the
script standalone with or without the flag.

The source of every helper is in inline_helpers.py; this module places the class. It imports libcst
only (the CLI never imports torch).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Tuple

import libcst as cst

from distify.inline_helpers import HELPERS, MODULES, _MARKER_RE, closure, modules_for, source  # noqa: F401 - HELPERS, source: re-exported


# reading a script -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """The inline runtime class of an earlier ``--standalone`` run."""

    node: cst.ClassDef
    name: str
    backend: str
    members: FrozenSet[str]


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


def attributes_used(module: cst.Module, name: str) -> List[str]:
    """`x` for every `<name>.x` in the module, in order of appearance, once each."""
    found: Dict[str, None] = {}

    class Visitor(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            if isinstance(node.value, cst.Name) and node.value.value == name:
                found.setdefault(node.attr.value)

    module.visit(Visitor())
    return list(found)


def top_level_imports(module: cst.Module) -> Dict[str, Tuple[str, cst.CSTNode]]:
    """qualified name -> (local name, statement) for the module's top-level imports."""
    out: Dict[str, Tuple[str, cst.CSTNode]] = {}
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    qualified = _dotted(alias.name)
                    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                        out.setdefault(qualified, (alias.asname.name.value, stmt))
                    elif "." not in qualified:
                        out.setdefault(qualified, (qualified, stmt))
            elif isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
                if isinstance(small.names, cst.ImportStar):
                    continue
                for alias in small.names:
                    local = alias.asname.name if alias.asname is not None else alias.name
                    if isinstance(local, cst.Name):
                        out.setdefault(f"{_dotted(small.module)}.{_dotted(alias.name)}", (local.value, stmt))
    return out


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return node.value if isinstance(node, cst.Name) else ""


# writing it -------------------------------------------------------------------------------------


class _Rename(cst.CSTTransformer):
    """Template names (os, torch, dist, hvd, runtime) -> the script's spellings."""

    def __init__(self, names: Dict[str, str]) -> None:
        super().__init__()
        self.names = names

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        new = self.names.get(updated_node.value)
        return updated_node.with_changes(value=new) if new else updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)  # `x.torch` is no variable


def _parse(code: str, names: Dict[str, str]) -> List[cst.BaseStatement]:
    from distify.edits import parse_stmts

    stmts = parse_stmts(code)
    renames = {k: v for k, v in names.items() if k != v}
    if renames:
        stmts = [s.visit(_Rename(renames)) for s in stmts]
    return stmts


@dataclass
class Outcome:
    module: cst.Module
    warning: str = ""  # why the script is not (entirely) standalone


def finish(module: cst.Module, backend: str, name: Optional[str], fresh) -> Outcome:
    """Write (or complete) the inline runtime class of ``module`` after all rules' edits.

    ``name`` is the name the rules used for the runtime (None when none did); ``fresh(preferred)``
    hands out unused names for imports the class needs. A script that imports
    ``from distify import runtime`` loses that import for the class. Helpers with no inline
    version are returned as ``unsupported``: such a script keeps (or gets) the distify import.
    """
    from distify.edits import _insert_imports, import_anchor

    block = find_block(module)
    if block is not None:
        name = block.name
    if name is None:
        return Outcome(module)
    imports = top_level_imports(module)
    converting = block is None and imports.get("distify.runtime", ("",))[0] == name
    used = [u for u in attributes_used(module, name) if block is None or u not in block.members]
    unsupported = tuple(u for u in used if backend not in HELPERS.get(u, {}))
    if unsupported:
        helpers = ", ".join(f"{name}.{u}" for u in unsupported)
        if block is not None:
            return Outcome(module, f"{helpers}: not in the inline runtime class, and no inline version exists")
        if not converting:  # the rules' calls need distify after all
            line = "from distify import runtime" + ("" if name == "runtime" else f" as {name}")
            module = module.with_changes(body=_insert_imports(list(module.body), [line]))
        return Outcome(module, f"{helpers}: no inline version; the script imports distify for it")
    wanted = closure(used, backend)
    if block is not None:
        wanted = [n for n in wanted if n not in block.members]
    if not wanted:
        return Outcome(module)

    body = list(module.body)
    if converting:
        stmt = imports["distify.runtime"][1]
        if len(stmt.body) != 1 or len(stmt.body[0].names) != 1:
            return Outcome(module, "`from distify import runtime` shares its line: the script still imports distify")
        body.remove(stmt)

    # the script's spellings of the modules the helpers use; missing ones are imported
    names, lines = {"runtime": name}, []
    for template in modules_for(wanted, backend):
        qualified = MODULES[template]
        local = imports.get(qualified, (None,))[0]
        if local is None:
            local = fresh(template)
            head, _, last = qualified.rpartition(".")
            if head and local == last:
                lines.append(f"from {head} import {last}")
            elif local == qualified:
                lines.append(f"import {qualified}")
            else:
                lines.append(f"import {qualified} as {local}")
        names[template] = local
    if lines:
        body = _insert_imports(body, lines, also_needed={name})  # the class reads them where it stands

    if block is not None:
        methods = _parse("class _:\n" + source(wanted, backend, header=False), names)[0].body.body
        cls = block.node.with_changes(body=block.node.body.with_changes(body=[*block.node.body.body, *methods]))
        body = [cls if stmt is block.node else stmt for stmt in body]
        return Outcome(module.with_changes(body=body))

    cls = _parse("\n\n" + source(wanted, backend), names)[0]
    at = import_anchor(body, {name}) + 1  # bound before the first statement that calls it
    if at < len(body):  # two blank lines after the class, as after any top-level class
        nxt = body[at]
        blanks = 0
        while blanks < len(nxt.leading_lines) and nxt.leading_lines[blanks].comment is None:
            blanks += 1
        if blanks < 2:
            body[at] = nxt.with_changes(leading_lines=[*[cst.EmptyLine()] * (2 - blanks), *nxt.leading_lines])
    body.insert(at, cls)
    return Outcome(module.with_changes(body=body))
