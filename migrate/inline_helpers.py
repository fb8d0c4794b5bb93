"""The inline runtime of ``distify --standalone``, generated from distify.runtime's own source.

The runtime package (``runtime/__init__.py`` and the modules it imports relatively, such as
``runtime/_env.py``) is read as text and parsed with libcst, never imported: the CLI does not import
torch. Every top-level definition there -- function, class, constant, module state -- can become a
member of the inline class; a script gets the ones it calls and everything they reach, in the
runtime's own order (a relatively imported module before its importer). The rewriting is
mechanical, and the only one:

* a function becomes a ``@staticmethod``; a class, a constant or a piece of state stays what it is;
* in a function body, a name the runtime module resolves to one of its own definitions is read
  through the class (``rank()`` -> ``runtime.rank()``; ``global _x`` ... ``_x = v`` ->
  ``runtime._x = v``); at class level (bases, decorators, defaults) it stays bare, which the class
  body has bound by then;
* a module the runtime imports is read under the script's own spelling (imported when missing);
* annotations go (a class's field annotations stay, as strings, for dataclasses), docstrings keep
  their first paragraph, ruler comments between sections go.

A definition the rewrite cannot carry (a module dunder such as ``__name__``, a global bound only
inside a function, a runtime name read in a nested class body) is not inlinable: a script that needs
it keeps ``from distify import runtime``. tests/test_standalone.py checks that every generated
member equals its runtime source under exactly these rewrites, and that the two behave alike.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import libcst as cst
from libcst.metadata import BuiltinAssignment, ClassScope, FunctionScope, GlobalScope, MetadataWrapper, ScopeProvider

from distify.runtime_class import MARKER  # opens the class; found by runtime_class.find_block

VERSION = 2

_HEADER = MARKER + ''' -- written by `distify --standalone`.
# Generated from distify.runtime: torchrun, Kubeflow, srun, mpirun and horovodrun tell each process
# its rank; run with plain `python` the script is rank 0 of a world of one.
class {name}:
    """Where this process sits in the job, and the device it trains on: the parts of distify.runtime
    this script calls, and what they need."""
'''

_MODULE_DUNDERS = frozenset({"__name__", "__file__", "__spec__", "__package__", "__loader__", "__path__", "__all__"})
_RULER = re.compile(r"#\s*-{3,}")


@dataclass(frozen=True)
class Definition:
    name: str
    node: cst.BaseStatement  # the top-level statement as the runtime writes it
    needs: Tuple[str, ...]  # the runtime definitions it reaches
    imports: Tuple[str, ...]  # the runtime's import bindings it reads
    inner: FrozenSet[str]  # the names bound inside it (a module's spelling must not be one of them)
    free: FrozenSet[str]  # the builtins it reads (a script must not bind one of them at top level)
    why_not: str = ""  # non-empty: the rewrite cannot carry it


@dataclass(frozen=True)
class Runtime:
    """The runtime package, as the inline class's generator sees it."""

    order: Tuple[str, ...]  # definition names in class order
    defs: Dict[str, Definition]
    imports: Dict[str, Tuple[str, Optional[str]]]  # binding -> (module, name) of `from module import name`, or (module, None)
    refs: Dict[cst.Name, Tuple[str, str]]  # a name node -> ("member" | "bare" | "import", the definition or binding)
    # (definition, class name, the spellings it reads) -> its class-level statement: the scripts of
    # one run mostly share the class name and the spellings; libcst nodes are immutable
    rendered: Dict[Tuple[str, str, Tuple[Tuple[str, str], ...]], cst.BaseStatement] = field(default_factory=dict, compare=False)

    def inlinable(self, name: str) -> bool:
        return name in self.defs and not any(self.defs[n].why_not for n in self.closure([name]))

    def why_not(self, name: str) -> str:
        if name not in self.defs:
            return "not a part of distify.runtime"
        return next((f"{n}: {self.defs[n].why_not}" for n in self.closure([name]) if self.defs[n].why_not), "")

    def closure(self, names: Sequence[str]) -> List[str]:
        """The definitions `names` need, themselves included, in class order. Unknown names are skipped."""
        todo, found = [n for n in names if n in self.defs], set()
        while todo:
            name = todo.pop()
            if name not in found:
                found.add(name)
                todo += self.defs[name].needs
        return [n for n in self.order if n in found]

    def imports_for(self, names: Sequence[str]) -> List[str]:
        """The import bindings the definitions read, in a stable order."""
        used = {b for n in names for b in self.defs[n].imports}
        return [b for b in self.imports if b in used]

    def bound_inside(self, names: Sequence[str]) -> FrozenSet[str]:
        return frozenset().union(*(self.defs[n].inner for n in names))

    def builtins_read(self, names: Sequence[str]) -> FrozenSet[str]:
        return frozenset().union(*(self.defs[n].free for n in names))

    def render(self, names: Sequence[str], cls: str, spellings: Dict[str, str]) -> List[cst.BaseStatement]:
        """The class-level statements of `names` (exactly those), for a class named `cls`, with the
        runtime's imports spelled as `spellings` says (binding -> the script's name)."""
        out = []
        for name in names:
            reads = tuple((b, spellings.get(b, b)) for b in self.defs[name].imports)
            key = (name, cls, reads)
            if key not in self.rendered:
                self.rendered[key] = self._render(name, cls, dict(reads))
            out.append(self.rendered[key])
        return out

    def _render(self, name: str, cls: str, spellings: Dict[str, str]) -> cst.BaseStatement:
        node = self.defs[name].node
        stmt = node.visit(_Inline(self.refs, cls, spellings))
        if isinstance(stmt, cst.FunctionDef):
            stmt = stmt.with_changes(decorators=[cst.Decorator(cst.Name("staticmethod")), *stmt.decorators])
        comments = [line for line in node.leading_lines if line.comment is not None and not _RULER.match(line.comment.value)]
        return stmt.with_changes(leading_lines=[cst.EmptyLine(indent=False), *comments])


def _runtime_dir() -> Path:
    spec = importlib.util.find_spec("distify.runtime")  # finds the package without running it (no torch)
    assert spec is not None and spec.origin is not None, "distify.runtime is not installed"
    return Path(spec.origin).parent


@functools.lru_cache(maxsize=None)
def load(folder: Optional[Path] = None) -> Runtime:
    """The runtime package in `folder` (default: distify.runtime's), parsed and analysed once."""
    folder = folder or _runtime_dir()
    defs: Dict[str, Definition] = {}
    imports: Dict[str, Tuple[str, Optional[str]]] = {}
    refs: Dict[cst.Name, Tuple[str, str]] = {}
    order: List[str] = []
    done: set = set()

    def read(stem: str) -> None:
        if stem in done:
            return
        done.add(stem)
        module = cst.parse_module((folder / f"{stem}.py").read_text(encoding="utf-8"))
        for stmt in module.body:  # the modules it imports from come first
            for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.ImportFrom) and small.relative and small.module is not None:
                    read(_dotted(small.module))
        _analyse(module, defs, imports, refs, order)

    read("__init__")
    return Runtime(tuple(order), defs, imports, refs)


def _analyse(module: cst.Module, defs, imports, refs, order) -> None:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scopes = wrapper.resolve(ScopeProvider)
    top: Dict[str, cst.BaseStatement] = {}
    for stmt in module.body:
        for name in _top_level_names(stmt, imports):
            top[name] = stmt
    glob = next(s for s in scopes.values() if isinstance(s, GlobalScope))
    siblings = set(defs)  # what the modules read before this one define: its relative imports
    for stmt in module.body:
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.ImportFrom) and small.relative and not isinstance(small.names, cst.ImportStar):
                if any(alias.asname is not None for alias in small.names):
                    raise ValueError("distify.runtime renames a relative import: the inline class cannot follow it")
    free_nodes = {a.node: a.node.value for scope in set(scopes.values()) if scope is not None
                  for a in scope.accesses
                  if isinstance(a.node, cst.Name) and all(isinstance(r, BuiltinAssignment) for r in a.referents)}
    names_in: Dict[int, List[cst.Name]] = {}  # statement -> its name nodes, annotations' left out
    owner: Dict[int, cst.CSTNode] = {}
    for stmt in module.body:
        names_in[id(stmt)] = _names(stmt)
        owner.update((id(n), stmt) for n in names_in[id(stmt)])
    per_stmt: Dict[int, List[Tuple[cst.Name, str]]] = {}
    orphans: Dict[int, str] = {}
    for assignment in glob.assignments:
        name = assignment.name
        nodes = [r.node for r in assignment.references]
        if isinstance(assignment.node, cst.Name) and assignment.node not in _targets_of(top.get(name)):
            nodes.append(assignment.node)  # `global x` then `x = ...` in a function
        for node in nodes:
            if isinstance(node, cst.Name) and id(node) in owner:
                per_stmt.setdefault(id(owner[id(node)]), []).append((node, name))
                if name not in top and name not in imports and name not in siblings:
                    orphans[id(owner[id(node)])] = f"the global {name} is bound only inside a function"
    for stmt in module.body:
        names = [n for n in _top_level_names(stmt, imports) if n not in imports]
        if not names:
            continue
        needs, used, why = set(), set(), orphans.get(id(stmt), "")
        for node, name in per_stmt.get(id(stmt), ()):
            if name in imports:
                used.add(name)
                refs[node] = ("import", name)
                continue
            if name not in top and name not in siblings or name in names and _is_definition_name(stmt, node):
                continue
            needs.add(name)
            scope = scopes.get(node)
            if _deferred(scope):
                refs[node] = ("member", name)
            elif isinstance(scope, GlobalScope):
                refs[node] = ("bare", name)
                if name not in order and name not in names:
                    why = why or f"reads {name} at class level before it is defined"
            else:
                why = why or f"reads {name} where the class body cannot see it"
        nodes = names_in[id(stmt)]
        free = frozenset(free_nodes[n] for n in nodes if n in free_nodes) - {"None", "True", "False"}
        if free & _MODULE_DUNDERS:
            why = why or f"reads the module's {', '.join(sorted(free & _MODULE_DUNDERS))}"
        inner = frozenset(a.name for scope in {scopes.get(n) for n in nodes} - {None, glob} for a in scope.assignments)
        for name in names:
            if name in defs and defs[name].node is not stmt:
                raise ValueError(f"distify.runtime defines {name} twice")
            defs[name] = Definition(name, stmt, tuple(sorted(needs - {name})), tuple(sorted(used)), inner, free, why)
            order.append(name)


def _top_level_names(stmt: cst.CSTNode, imports: Dict[str, Tuple[str, Optional[str]]]) -> List[str]:
    """Names a top-level statement binds; records the runtime's imports on the way (`__all__` and
    `from __future__` bind nothing the class needs; a relative import binds a sibling's definitions)."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return [stmt.name.value]
    names: List[str] = []
    for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
        if isinstance(small, cst.Import):
            for alias in small.names:
                full = _dotted(alias.name)
                local = alias.asname.name.value if alias.asname else full.split(".")[0]
                imports.setdefault(local, (full if alias.asname else local, None))
        elif isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
            source = _dotted(small.module)
            if source != "__future__" and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    local = alias.asname.name.value if alias.asname else alias.name.value
                    imports.setdefault(local, (source, alias.name.value))
        elif isinstance(small, (cst.Assign, cst.AnnAssign)):
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
            names += [t.value for t in targets if isinstance(t, cst.Name) and t.value != "__all__"]
    return names


def _targets_of(stmt: Optional[cst.CSTNode]) -> List[cst.CSTNode]:
    out: List[cst.CSTNode] = []
    for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
        if isinstance(small, cst.Assign):
            out += [t.target for t in small.targets]
        elif isinstance(small, cst.AnnAssign):
            out.append(small.target)
    return out


def _is_definition_name(stmt: cst.CSTNode, node: cst.Name) -> bool:
    return node is getattr(stmt, "name", None) or node in _targets_of(stmt)


def _deferred(scope) -> bool:
    """True for a scope that runs after the class exists (a function body, or anything inside one)."""
    while scope is not None and not isinstance(scope, GlobalScope):
        if isinstance(scope, FunctionScope):
            return True
        if isinstance(scope, ClassScope):
            return False
        scope = scope.parent
    return False


def _names(node: cst.CSTNode) -> List[cst.Name]:
    """The name nodes under `node`, less those of annotations (which the class drops)."""
    found: List[cst.Name] = []

    class Collect(cst.CSTVisitor):
        def visit_Annotation(self, n: cst.Annotation) -> bool:
            return False

        def visit_Name(self, n: cst.Name) -> None:
            found.append(n)

    node.visit(Collect())
    return found


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return node.value if isinstance(node, cst.Name) else ""


# the rewrite ----------------------------------------------------------------------------------


class _Inline(cst.CSTTransformer):
    def __init__(self, refs: Dict[cst.Name, Tuple[str, str]], cls: str, spellings: Dict[str, str]) -> None:
        super().__init__()
        self.refs, self.cls, self.spellings = refs, cls, spellings
        self.bodies: List[str] = []  # "class" / "def", innermost last

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        kind, name = self.refs.get(original_node, ("", ""))
        if kind == "member":
            return cst.Attribute(value=cst.Name(self.cls), attr=cst.Name(name))
        if kind == "import":
            return updated_node.with_changes(value=self.spellings.get(name, name))
        return updated_node

    def leave_Global(self, original_node: cst.Global, updated_node: cst.Global):
        return cst.RemoveFromParent()  # its names are the class's attributes now

    def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
        if updated_node.annotation is None:
            return updated_node
        equal = updated_node.equal  # `x: int = 0` -> `x=0`
        if isinstance(equal, cst.AssignEqual):
            equal = equal.with_changes(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
        return updated_node.with_changes(annotation=None, equal=equal)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.bodies.append("class")

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.bodies.pop()
        return _short_docstring(updated_node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.bodies.append("def")

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.bodies.pop()
        return _short_docstring(updated_node.with_changes(returns=None))

    def leave_AnnAssign(self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign):
        if self.bodies[-1:] == ["class"] or updated_node.value is None:  # a field: a dataclass reads it
            code = cst.Module([]).code_for_node(original_node.annotation.annotation)
            quoted = repr(code) if '"' in code else f'"{code}"'
            return updated_node.with_changes(annotation=cst.Annotation(cst.SimpleString(quoted)))
        return cst.Assign(targets=[cst.AssignTarget(updated_node.target)], value=updated_node.value)


def _short_docstring(node):
    """The docstring's first paragraph, its lines indented one level deeper (the class's)."""
    body = node.body
    first = body.body[0] if isinstance(body, cst.IndentedBlock) and body.body else None
    small = first.body[0] if isinstance(first, cst.SimpleStatementLine) and first.body else None
    string = small.value if isinstance(small, cst.Expr) else None
    if not isinstance(string, cst.SimpleString) or not string.value.lstrip("rRuU").startswith(('"""', "'''")):
        return node
    prefix = string.value[: len(string.value) - len(string.value.lstrip("rRuU"))]
    quote = string.value[len(prefix): len(prefix) + 3]
    text = string.value[len(prefix) + 3: -3]
    cut = re.search(r"\n[ \t]*\n", text)
    if cut:
        text = text[: cut.start()].rstrip()
        if text.endswith(quote[0]):  # `..."` + `"""` would close the string early
            text += " "
    lines = text.split("\n")
    text = "\n".join([lines[0], *[("    " + line) if line.strip() or i == len(lines) - 2 else line
                                  for i, line in enumerate(lines[1:])]])
    new = string.with_changes(value=f"{prefix}{quote}{text}{quote}")
    stmt = first.with_changes(body=[small.with_changes(value=new), *first.body[1:]])
    return node.with_changes(body=body.with_changes(body=[stmt, *body.body[1:]]))


# the class --------------------------------------------------------------------------------------


def header(name: str, backend: str) -> str:
    return _HEADER.format(version=VERSION, backend=backend, name=name)


def import_line(binding: str, local: str, runtime: Optional[Runtime] = None) -> str:
    """The statement that binds the runtime's import `binding` as `local` in a script."""
    module, attr = (runtime or load()).imports[binding]
    if attr is not None:
        return f"from {module} import {attr}" + ("" if local == attr else f" as {local}")
    return f"import {module}" + ("" if local == module else f" as {local}")


def source(names: Sequence[str], backend: str, header_too: bool = True, cls: str = "runtime",
           runtime: Optional[Runtime] = None) -> str:
    """Code of the inline class holding `names` and what they need, its imports first (in the
    runtime's own spellings); without header_too, the code of exactly those members."""
    runtime = runtime or load()
    chosen = runtime.closure(names) if header_too else [n for n in runtime.order if n in names]
    members = runtime.render(chosen, cls, {})
    if not header_too:
        return cst.Module([]).code_for_node(cst.ClassDef(cst.Name("_"), cst.IndentedBlock(members)))
    lines = [import_line(b, b, runtime) + "\n" for b in runtime.imports_for(chosen)]
    return "".join(lines) + "\n\n" + cst.Module([class_def(cls, backend, members)]).code


def class_def(name: str, backend: str, members: List[cst.BaseStatement]) -> cst.ClassDef:
    cls = cst.parse_statement(header(name, backend))
    assert isinstance(cls, cst.ClassDef) and isinstance(cls.body, cst.IndentedBlock)
    return cls.with_changes(body=cls.body.with_changes(body=[*cls.body.body, *members]))
