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

inline_helpers.py generates the class's members from distify.runtime's own source; this module
places the class. It imports libcst only (the CLI never imports torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Tuple

import libcst as cst

from distify.inline_helpers import class_def, import_line, load, source  # noqa: F401 - source: re-exported
from distify.runtime_class import find_block


# reading a script (the class of an earlier run: distify.runtime_class) --------------------------


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


def _shadowed(module: cst.Module, builtins: FrozenSet[str]) -> List[str]:
    """The `builtins` the script binds at top level, where the class's code would find them first.
    A cheap pass first: a name bound nowhere (in any scope) needs no scope analysis."""
    if not builtins & _bound_anywhere(module):
        return []
    from libcst.metadata import GlobalScope, MetadataWrapper, ScopeProvider

    scopes = MetadataWrapper(module).resolve(ScopeProvider)
    glob = next((s for s in scopes.values() if isinstance(s, GlobalScope)), None)
    return sorted(builtins & {a.name for a in glob.assignments}) if glob is not None else []


def _bound_anywhere(module: cst.Module) -> FrozenSet[str]:
    """Every name some statement binds or declares, in any scope (a superset of the module's own)."""
    found: set = set()

    def targets(node: cst.CSTNode) -> None:
        if isinstance(node, cst.Name):
            found.add(node.value)
        elif isinstance(node, (cst.Tuple, cst.List)):
            for element in node.elements:
                targets(element.value)
        elif isinstance(node, cst.StarredElement):
            targets(node.value)

    class Collect(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            found.add(node.name.value)

        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            found.add(node.name.value)

        def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
            local = node.asname.name if node.asname is not None else node.name
            found.add(_dotted(local).split(".")[0])

        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            targets(node.target)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            targets(node.target)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            targets(node.target)

        def visit_For(self, node: cst.For) -> None:
            targets(node.target)

        def visit_CompFor(self, node: cst.CompFor) -> None:
            targets(node.target)

        def visit_AsName(self, node: cst.AsName) -> None:  # with ... as x, except ... as x
            targets(node.name)

        def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
            targets(node.target)

        def visit_Global(self, node: cst.Global) -> None:
            found.update(item.name.value for item in node.names)

        def visit_Del(self, node: cst.Del) -> None:
            targets(node.target)

        def visit_MatchAs(self, node: cst.MatchAs) -> None:
            if node.name is not None:
                found.add(node.name.value)

        def visit_MatchStar(self, node: cst.MatchStar) -> None:
            if node.name is not None:
                found.add(node.name.value)

        def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
            if node.rest is not None:
                found.add(node.rest.value)

    module.visit(Collect())
    return frozenset(found)


@dataclass
class Outcome:
    module: cst.Module
    warning: str = ""  # why the script is not (entirely) standalone


def finish(module: cst.Module, backend: str, name: Optional[str], fresh) -> Outcome:
    """Write (or complete) the inline runtime class of ``module`` after all rules' edits.

    ``name`` is the name the rules used for the runtime (None when none did); ``fresh(preferred)``
    hands out unused names for imports the class needs. A script that imports
    ``from distify import runtime`` loses that import for the class. What cannot be inlined (see
    inline_helpers) keeps, or gets, the distify import, with a warning.
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
    if not used:
        return Outcome(module)
    runtime = load()  # parsed once per process, and only when a member is to be written
    wanted = runtime.closure(used)
    if block is not None:
        wanted = [n for n in wanted if n not in block.members]
    problems = [f"{name}.{u}: {runtime.why_not(u)}" for u in used if not runtime.inlinable(u)]
    inside = runtime.bound_inside(wanted)
    if name in inside:
        problems.append(f"the class name {name} is a local name of the inline runtime's code")
    shadowed = _shadowed(module, runtime.builtins_read(wanted)) if wanted else []
    if shadowed:
        problems.append(f"the script binds {', '.join(shadowed)}, which the inline runtime reads as the builtin")
    if problems:
        why = "; ".join(problems)
        if block is not None:
            return Outcome(module, f"not in the inline runtime class: {why}")
        if not converting:  # the rules' calls need distify after all
            line = "from distify import runtime" + ("" if name == "runtime" else f" as {name}")
            module = module.with_changes(body=_insert_imports(list(module.body), [line]))
        return Outcome(module, f"the script imports distify: {why}")
    if not wanted:
        return Outcome(module)

    body = list(module.body)
    if converting:
        stmt = imports["distify.runtime"][1]
        if len(stmt.body) != 1 or len(stmt.body[0].names) != 1:
            return Outcome(module, "`from distify import runtime` shares its line: the script still imports distify")
        body.remove(stmt)

    # the script's spellings of the modules the class reads; missing ones are imported, under a
    # name no code of the class binds for itself
    spellings, lines = {}, []
    for binding in runtime.imports_for(wanted):
        module_name, attr = runtime.imports[binding]
        local = imports.get(f"{module_name}.{attr}" if attr else module_name, (None,))[0]
        if local is None or local in inside:
            local = fresh(binding)
            while local in inside:
                local = fresh(binding)
            lines.append(import_line(binding, local, runtime))
        spellings[binding] = local
    if lines:
        body = _insert_imports(body, lines, also_needed={name})  # the class reads them where it stands

    members = runtime.render(wanted, name, spellings)
    if block is not None:
        cls = block.node.with_changes(body=block.node.body.with_changes(body=[*block.node.body.body, *members]))
        body = [cls if stmt is block.node else stmt for stmt in body]
        return Outcome(module.with_changes(body=body))

    cls = class_def(name, backend, members)
    cls = cls.with_changes(leading_lines=[cst.EmptyLine(indent=False)] * 2 + list(cls.leading_lines))
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
