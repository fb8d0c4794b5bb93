"""The training path of a project seen as one module, so that the rules migrate it where it lives.

When a script's training loop runs in a function of another module of the project
(``from utils import train_one_epoch`` ... ``train_one_epoch(model, optimizer, loader, device,
epoch)`` in the epoch loop), the anatomy of the script alone has no loop to migrate. ``view``
builds one module for the analysis: the script's statements, then the imports, functions and
classes of each project module whose function trains, as the *same* libcst nodes. The anatomy of
that module sees the loop, the epoch loop around its call, the loader handed to it and the model it
trains, across the files; the rules record their edits against nodes of the original trees; each
file is then rendered from its own tree (``render``) with the edits that fall in it, and findings
are reported against the file and line where their node lives (``locate``).

However the script spells the call (``from utils import train_one_epoch``, ``... as step``,
``import utils as U`` then ``U.train_one_epoch``, ``from . import utils``), the view's anatomy
finds the joined definition by what the callee resolves to: the view hands it the qualified name
of every joined definition (``View.joined``, asked through ``distify.names.Defined``). The view is
built only where it is exact: no name of the helper's top level is bound by the script to anything
else; no local import name means different things in the two files. Anything else keeps the
refusal (DST961).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst

from distify.data_sources import foreign_loaders
from distify.findings import Finding
from distify.program import Program, program_of, reached
from distify.project import ProjectModule


@dataclass(eq=False)
class Part:
    """One project module whose code joins the view."""

    module: ProjectModule
    tree: cst.Module
    source: bytes
    stmts: List[cst.CSTNode]  # its top-level statements that joined the view, in order
    imported: frozenset = frozenset()  # the names its own imports bind


@dataclass(eq=False)
class View:
    module: cst.Module  # the script's statements, then each part's
    parts: List[Part]
    script_stmts: int  # how many leading statements are the script's
    # a call of the script into a module distify migrated already (for another entry script) while
    # the script itself is not: the two cannot be migrated apart (see `half_migrated`)
    half: Optional[Tuple[cst.Call, str]] = None
    _spans: Optional[List[Tuple[int, int, Part, int]]] = None  # (first, last line in the view, part, first line there)
    # for the analysis of the view (``distify.anatomy.analyse``): the qualified name of each joined
    # definition -> its name in the view, and the relative imports of the script and the parts
    joined: Tuple[Dict[str, str], Dict[str, str]] = ({}, {})


def view(script: cst.Module, anatomy, path: Optional[str], options) -> Optional[View]:
    """The one-module view of the script and the project modules where its training runs, or None
    when its training does not run in the project or the view would not be exact."""
    if not path:
        return None
    parts: Dict[str, Tuple[ProjectModule, object]] = {}
    half = None
    for site, t in _joining(anatomy, path, options):
        if half is None and t.unit.anatomy.migrated_by_distify and not anatomy.migrated_by_distify:
            half = (site.call, f"{t.qualname}() at {t.where}")
        parts.setdefault(t.unit.module.path, (t.unit.module, t.unit))
    if not parts:
        return None
    prog = program_of(anatomy)
    relative = prog.project.relative_aliases(prog.project.script(path))
    aliases = {**anatomy.aliases, **relative}  # the script's imports, as the program model resolves them
    bound = set(anatomy.name_bindings) | set(anatomy.functions) | set(anatomy.classes) | set(relative)
    homes: Dict[str, str] = {}
    joined: List[Part] = []
    for key, (mod, unit) in parts.items():
        tree = unit.anatomy.module
        stmts = [s for s in tree.body if _joins(s)]
        names = {s.name.value for s in stmts if isinstance(s, (cst.FunctionDef, cst.ClassDef))}
        # a name the script binds may be a helper's own only where it imports that very definition
        if any(aliases.get(n) != f"{mod.name}.{n}" for n in names & bound):
            return None  # a helper's function shares a name the script binds to something else
        for local, q in unit.aliases.items():
            if local in aliases and aliases[local] != q and local not in names:
                return None  # `F` or `np` meaning one thing here and another there
            aliases.setdefault(local, q)
            if local not in unit.anatomy.aliases:
                relative.setdefault(local, q)
        if any(local in names for local in unit.aliases):
            return None  # the helper imports a name it also defines
        if names & set(homes.values()):
            return None  # two modules defining the same name: one module cannot hold both
        homes.update({f"{mod.name}.{n}": n for n in names})
        joined.append(Part(mod, tree, unit.source, stmts, frozenset(unit.anatomy.aliases)))
    body = list(script.body) + [s for p in joined for s in p.stmts]
    return View(script.with_changes(body=body), joined, len(script.body), half=half, joined=(homes, relative))


def _joining(anatomy, path: str, options):
    """(call site, project function) for each call of the script whose function joins the view: one
    that trains, and one that builds and returns a loader the script's own training reads
    (``train_loader, val_loader = get_loaders(...)``), so that its loaders are sharded where they
    are built."""
    for site in anatomy.calls:
        t = reached(anatomy, path, options, site).target
        if t is not None and program_of(anatomy).trains(t):
            yield site, t
    if anatomy.has_training:
        from distify.helper_effects import project_calls

        for site in project_calls(anatomy):
            t = reached(anatomy, path, options, site).target
            if t is not None and _evaluates(t, program_of(anatomy).bind(t, site.call)):
                yield site, t
        seen = set()
        for f in foreign_loaders(anatomy):
            if id(f.call.call) in seen:
                continue
            seen.add(id(f.call.call))
            t = reached(anatomy, path, options, f.call).target
            if t is not None and program_of(anatomy).returned_loaders(t):
                yield f.call, t


def _evaluates(t, bound) -> bool:
    """`t` runs a batch loop of its own over data the call hands it (`bound`: its parameters the
    call binds): an evaluation (``evaluate(model, val_loader)``), not a loop over its own state."""
    return any(bl.scope is t.fn and bl.via != "pass" and bl.ref.split(".")[0].split("[")[0] in bound
               for bl in t.unit.anatomy.batch_loops)


def _joins(stmt: cst.CSTNode) -> bool:
    """A top-level statement of a helper that joins the view: its imports, functions and classes
    (module-level code runs at import time, before the script: it is not the training path)."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return True
    return isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def locate(v: View, anatomy, line: int) -> Tuple[Optional[Part], int]:
    """The part (None: the script) and the line there of a line of the view."""
    if v._spans is None:
        from distify.records import positions as _positions
        from libcst.metadata import MetadataWrapper

        spans = []
        mine = _positions(MetadataWrapper(v.module, unsafe_skip_copy=True))
        for p in v.parts:
            own = _positions(MetadataWrapper(p.tree, unsafe_skip_copy=True))
            for s in p.stmts:
                here, there = mine.get(s), own.get(s)
                if here is not None and there is not None:
                    spans.append((here.start.line, here.end.line, p, there.start.line))
        v._spans = spans
    for first, last, part, start in v._spans:
        if first <= line <= last:
            return part, start + line - first
    return None, line


def seen_as_script(v: View, seen, script_anatomy) -> None:
    """The view's anatomy names the imports an edit needs as the script spells them: a name only
    a helper imports (its `from distify import runtime`, once migrated) is not bound in the script."""
    seen.local_name_for = script_anatomy.local_name_for
    seen.script_bindings = frozenset(script_anatomy.name_bindings)  # see Context._bound_alike


def split_findings(v: View, anatomy, findings: Sequence[Finding]) -> Tuple[List[Finding], Dict[str, List[Finding]]]:
    """The script's findings and each part's (by path), with their own lines."""
    mine: List[Finding] = []
    theirs: Dict[str, List[Finding]] = {p.module.path: [] for p in v.parts}
    for f in findings:
        part, line = locate(v, anatomy, f.line)
        if part is None:
            mine.append(f)
        else:
            theirs[part.module.path].append(f.replace(line=line))
    return mine, theirs


def render(part: Part, edits) -> bytes:
    """The part's module with the edits that fall in it; of the imports the edits queued, only
    those whose names the rewritten module reads."""
    return _render(part.tree, part.source, part.imported, edits)


def render_script(v: View, script: cst.Module, source: bytes, edits) -> bytes:
    """The script with the edits that fall in it, and of the queued imports only those it reads (a
    sampler added in a helper's factory needs no import in the script)."""
    return _render(script, source, frozenset(), edits)


def _render(tree0: cst.Module, source: bytes, imported: frozenset, edits) -> bytes:
    from copy import copy

    from distify.edits import ApplyEdits, bound_by_import

    plain = copy(edits)
    plain.imports = []
    tree = tree0.visit(ApplyEdits(plain))
    if tree.code == tree0.code:
        return source
    read = {n.value for n in _names(tree)}
    wanted = [line for line in edits.imports if bound_by_import(line) & read and not bound_by_import(line) <= imported]
    if wanted:
        only = copy(edits)
        only.imports = wanted
        tree = tree0.visit(ApplyEdits(only))
    return tree.bytes


def _names(tree: cst.CSTNode):
    out = []

    class _V(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            out.append(node)

    tree.visit(_V())
    return out


def finish(v: View, anatomy, ctx, rules, source: bytes, output: bytes, findings: List[Finding], encoding: str, options):
    """The MigrationResult of a migration seen through `v`: the script's output and findings, and
    each part's (``others``); refused when any file would read a name it does not bind (DST962).
    The audit runs on the view of the outputs, so it judges the training path across the files."""
    from distify.anatomy import analyse
    from distify.engine import _audit, _drift, _line_map, _refusal

    mine, theirs = split_findings(v, anatomy, findings)
    outputs = [render(p, ctx.edits) for p in v.parts]
    files = [(source, output)] + [(p.source, out) for p, out in zip(v.parts, outputs)]
    unbound: List[Finding] = []
    for i, (before, after) in enumerate(files):
        if before == after:
            continue
        compile(after, "<distify output>", "exec", dont_inherit=True)  # invalid output: distify's bug
        found = [f for r in rules if hasattr(r, "check_output") for f in r.check_output(before.decode(encoding), after.decode(encoding))]
        if found:
            where = v.parts[i - 1].module.path if i else None
            to_source = _line_map(before, after)
            unbound += [f.replace(line=to_source(f.line), message=f"{where}: {f.message}" if where else f.message) for f in found]
    if unbound:
        return _refusal(source, mine, unbound, encoding)
    # the audit, on the outputs seen as one module again
    new_parts = []
    for p, out in zip(v.parts, outputs):
        tree = cst.parse_module(out)
        new_parts.append(Part(p.module, tree, out, [s for s in tree.body if _joins(s)]))
    new_script = cst.parse_module(output)
    new_view = View(new_script.with_changes(body=list(new_script.body) + [s for p in new_parts for s in p.stmts]), new_parts,
                    len(new_script.body), joined=v.joined)
    seen = analyse(new_view.module, joined=v.joined)
    seen.want_positions = options.positions
    audited = _audit(seen, options, findings, migrated=True, path=ctx.plan.script_path)
    drift = _drift(audited) if not (options.select or options.ignore) else []
    if drift:  # an output whose replicas would drift apart is refused, as in the one-file path
        mine = [f for f in mine if f.kind == "warning"]
        theirs = {k: [f for f in fs if f.kind == "warning"] for k, fs in theirs.items()}
        _place(v, new_view, seen, source, output, [f.replace(message=f"{f.message}: files not migrated") for f in drift],
               mine, theirs)
        return _result(v, source, source, [p.source for p in v.parts], mine, theirs, encoding, refused=True,
                       note="not migrated: see warnings")
    _place(v, new_view, seen, source, output, audited, mine, theirs)
    return _result(v, source, output, outputs, mine, theirs, encoding)


def _place(v: View, new_view: View, seen, source: bytes, output: bytes, found, mine: List[Finding], theirs) -> None:
    """Each finding of the audit on `new_view` (the outputs seen as one module) added to the
    script's findings or to its part's, at the line of the original file."""
    from distify.engine import _line_map

    for f in found:
        part, line = locate(new_view, seen, f.line)
        if part is None:
            mine.append(f.replace(line=_line_map(source, output)(line)))
        else:
            old = next(p for p in v.parts if p.module.path == part.module.path)
            theirs[old.module.path].append(f.replace(line=_line_map(old.source, part.source)(line)))


def _result(v: View, source: bytes, output: bytes, outputs, mine, theirs, encoding: str, **kw):
    from distify.engine import MigrationResult

    order = lambda f: (f.line, f.col, f.code)  # noqa: E731
    others = tuple((p.module.path, p.source, out, tuple(sorted(theirs[p.module.path], key=order))) for p, out in zip(v.parts, outputs))
    return MigrationResult(source, output, tuple(sorted(mine, key=order)), encoding=encoding, others=others, **kw)
