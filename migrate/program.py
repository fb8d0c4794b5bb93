"""One program model across the modules of the user's project: which project function a call
reaches, which parameter each argument binds, what a function returns, which attributes a function
reads on a parameter, and whether a function trains.

The facts of one module come from its anatomy (``distify.anatomy.analyse``), built once per module
and only for the modules a question reaches (``Program.unit``). What a name is goes through the
one resolver, ``distify.names.resolve``, with the module's alias map completed by its relative
imports (``distify.project.Project.relative_aliases``); a qualified name then lands in a module of
the project through ``Project.locate``. Nothing here depends on how a user's identifier is spelled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import libcst as cst

from distify.instance import method_kind
from distify.facts import keyword_bindings
from distify.syntax import dotted
from distify.library import known
from distify.names import resolve
from distify.project_reach import ProjectReach
from distify.project import MAX_BYTES, Project, ProjectModule, read_ast
from distify.records import DIST_SAMPLER, MODULE_API, NAMED_API, STATE_API, BatchLoop, CallSite, Scope

_DEPTH = 6  # re-exports followed (`from .train import fit` in a package's __init__)


@dataclass(eq=False)
class Unit:
    """One analysed module of the project."""

    module: ProjectModule
    anatomy: object  # distify.anatomy.Anatomy
    aliases: Dict[str, str]  # the module's imports, relative ones made absolute
    source: bytes = b""  # the bytes analysed (what a rewrite starts from)


@dataclass(eq=False)
class Target:
    """The project function (or method) a call reaches."""

    unit: Unit
    fn: cst.FunctionDef
    cls: Optional[cst.ClassDef]
    qualname: str  # "utils.train_one_epoch", "simclr.SimCLR.train"
    root: str = ""  # the project's root, for `where`

    @property
    def line(self) -> int:
        return self.unit.anatomy.position(self.fn)[0] or _def_line(self.unit.module.path, self.fn.name.value)

    @property
    def where(self) -> str:
        """``utils.py:12``: the file relative to the project's search root, and the `def` line."""
        return f"{os.path.relpath(self.unit.module.path, self.root or os.sep).replace(os.sep, '/')}:{self.line}"


@dataclass(eq=False)
class Program:
    """The program model of a project, computed once per project and extended lazily."""

    project: Project
    _units: Dict[str, Optional[Unit]] = field(default_factory=dict)

    def unit(self, mod: ProjectModule) -> Optional[Unit]:
        """`mod` parsed and analysed (once); None when it cannot be read or parsed."""
        if mod.path in self._units:
            return self._units[mod.path]
        from distify.anatomy import analyse

        found = None
        try:
            with open(mod.path, "rb") as fh:
                source = fh.read()
            if len(source) <= MAX_BYTES:
                found = self.adopt(mod, analyse(cst.parse_module(source)), source)
        except (OSError, cst.ParserSyntaxError, RecursionError, MemoryError, ValueError):
            pass
        self._units[mod.path] = found
        return found

    def adopt(self, mod: ProjectModule, anatomy, source: bytes = b"") -> Unit:
        """A module already analysed (the entry script) joins the model without a second parse."""
        unit = Unit(mod, anatomy, {**anatomy.aliases, **self.project.relative_aliases(mod)}, source)
        self._units[mod.path] = unit
        return unit

    # calls --------------------------------------------------------------------------------
    def target(self, unit: Unit, call: cst.Call, scope: Scope, stmt: Optional[cst.CSTNode] = None) -> Optional[Target]:
        """The project function `call` (in `unit`, `scope`) runs: an imported function
        (``utils.train_one_epoch(...)``, ``train_one_epoch(...)`` after ``from utils import``), a
        class's ``__init__`` (``SimCLR(...)``), or a method of an object bound in `scope` to an
        instance of a project class (``simclr = SimCLR(...)``; ``simclr.train(...)``)."""
        q = resolve(unit.aliases, call.func)
        if q is not None:
            return self._named(q, _DEPTH)
        func = call.func
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and stmt is not None:
            cls_q = self._instance_of(unit, scope, func.value.value, stmt)
            if cls_q is not None:
                return self._named(f"{cls_q}.{func.attr.value}", _DEPTH)
        return None

    def function_value(self, unit: Unit, expr: cst.BaseExpression) -> Optional[Target]:
        """The project function an expression names as a value, not a call: the ``train`` of
        ``Process(target=train)``, ``mp.spawn(train, ...)`` or ``pool.map(utils.step, ...)``."""
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return None
        q = resolve(unit.aliases, expr)
        found = self._named(q, _DEPTH) if q is not None else None
        return found if isinstance(found, Target) else None

    def _instance_of(self, unit: Unit, scope: Scope, name: str, stmt: cst.CSTNode) -> Optional[str]:
        """The qualified name of the project class whose instance `name` holds at `stmt`."""
        call = unit.anatomy.facts.instance_call(scope, name, stmt)
        q = resolve(unit.aliases, call.func) if call is not None else None
        return self._named(q, _DEPTH, want_class=True) if q else None

    def _named(self, q: str, depth: int, want_class: bool = False):
        """The Target (or, with `want_class`, the class's qualified name) a qualified name is."""
        where = self.project.locate(q)
        if where is None or depth <= 0:
            return None
        mod, rest = where
        unit = self.unit(mod)
        if unit is None or not rest:
            return None
        a = unit.anatomy
        head, _, tail = rest.partition(".")
        if head in a.classes:
            if want_class:
                return f"{mod.name}.{head}" if not tail else None
            cls = a.classes[head]
            method = _method(cls, tail or "__init__")
            if method is None and tail and "." not in tail:  # inherited: `class Trainer(BaseTrainer)`
                for base in cls.bases:
                    q = resolve(unit.aliases, base.value) or (f"{mod.name}.{dotted(base.value)}" if dotted(base.value) in a.classes else None)
                    found = self._named(f"{q}.{tail}", depth - 1) if q else None
                    if found is not None:
                        return found
            return Target(unit, method, cls, f"{mod.name}.{head}.{tail or '__init__'}", self.project.root) if method is not None else None
        if head in a.functions and not tail and not want_class:
            return Target(unit, a.functions[head], None, f"{mod.name}.{head}", self.project.root)
        if head in unit.aliases:  # a re-export: `from .engine import train` in the package's __init__
            return self._named(f"{unit.aliases[head]}{'.' + tail if tail else ''}", depth - 1, want_class)
        for star in self.project.star_modules(mod):  # `from .trainer import *` in the package's __init__
            found = self._named(f"{star}.{rest}", depth - 1, want_class)
            if found is not None:
                return found
        return None

    def loader_base(self, unit: Unit, cls: cst.ClassDef) -> Optional[Tuple[str, bool]]:
        """For a project class (`cls` of `unit`): the library loader it derives from and whether it
        shards itself (``loader_chain``), its bases in other modules found through the project."""
        return loader_chain(unit.anatomy, unit.aliases, cls, lambda q: self._class(q, _DEPTH))

    def _class(self, q: str, depth: int) -> Optional[Tuple[Unit, cst.ClassDef]]:
        """The project class a qualified name is, with its module's unit (through re-exports)."""
        where = self.project.locate(q)
        unit = self.unit(where[0]) if where is not None and depth > 0 else None
        if unit is None or not where[1] or "." in where[1]:
            return None
        if where[1] in unit.anatomy.classes:
            return unit, unit.anatomy.classes[where[1]]
        return self._class(unit.aliases[where[1]], depth - 1) if where[1] in unit.aliases else None

    def bind(self, target: Target, call: cst.Call) -> Dict[str, cst.BaseExpression]:
        """Parameter -> the expression `call` passes for it (positional or keyword); a call with
        ``*args``/``**kwargs`` binds nothing it cannot be sure of."""
        params = [p.name.value for p in (*target.fn.params.posonly_params, *target.fn.params.params)]
        if target.cls is not None and params and method_kind(target.fn) != "static":
            params = params[1:]  # the instance (or the class), whatever it is called
        kwonly = {p.name.value for p in target.fn.params.kwonly_params}
        out: Dict[str, cst.BaseExpression] = {}
        positional = [a for a in call.args if a.keyword is None]
        if any(a.star for a in call.args):
            return out
        for i, a in enumerate(positional):
            if i < len(params):
                out[params[i]] = a.value
        for a in call.args:
            if a.keyword is not None and (a.keyword.value in params or a.keyword.value in kwonly):
                out[a.keyword.value] = a.value
        out.update(keyword_bindings(target.fn, call, params))  # `**kwargs`: kwargs["model"] -> model=...
        return out

    # what a function does ---------------------------------------------------------------------
    def training_loops(self, target: Target) -> List[BatchLoop]:
        """The batch loops of `target`'s body that reach backward() or an optimizer step, and what
        each iterates (a parameter, an attribute of self, a loader built there)."""
        return [bl for bl in target.unit.anatomy.batch_loops if bl.scope is target.fn and bl.trains and bl.via != "pass"]

    def trains(self, target: Target) -> bool:
        """`target` runs a training loop, itself or through the functions of its module it calls."""
        return bool(self.training_loops(target)) or target.unit.anatomy.facts.trains(target.fn)

    def returned_loaders(self, target: Target) -> List[CallSite]:
        """The DataLoader calls (any loader of ``distify.library``) whose loader `target` returns:
        ``return DataLoader(...)`` or ``loader = DataLoader(...)`` ... ``return loader``."""
        a = target.unit.anatomy
        built = [c for c in a.calls if c.scope is target.fn and _is_loader(c)]
        if not built:
            return []
        returned = set()
        for node in _returns(target.fn):
            if node.value is None:
                continue
            for e in node.value.elements if isinstance(node.value, cst.Tuple) else (node.value,):
                v = e.value if isinstance(e, cst.Element) else e
                returned.add(id(v))
                d = dotted(v)
                if d is not None:
                    returned.add(d)
        out = []
        for c in built:
            from distify.records import assigned_name

            if id(c.call) in returned or assigned_name(c.stmt, c.call) in returned:
                out.append(c)
        return out

    def attribute_reads(self, target: Target, param: str) -> List[Tuple[str, cst.Attribute]]:
        """The attributes `target` reads on its parameter `param` that an ``nn.Module`` wrapper
        (DDP) does not forward: ``model.pos_emb`` in a helper handed the model. The wrapper's
        own API (``train()``, ``parameters()``, ``state_dict()``...) is left out."""
        out = []
        for attr, scope, _cls, _stmt in target.unit.anatomy.attr_uses:
            if scope is target.fn and isinstance(attr.value, cst.Name) and attr.value.value == param:
                name = attr.attr.value
                if name not in MODULE_API and name not in STATE_API and name not in NAMED_API:
                    out.append((name, attr))
        return out


def loader_chain(anatomy, aliases: Dict[str, str], cls: cst.ClassDef, find=None) -> Optional[Tuple[str, bool]]:
    """The library loader a class derives from (``torch.utils.data.DataLoader``, a row of kind
    "loader"), through its bases and theirs, each resolved through its own module's imports: a base
    of the same module by its name there, one of another module of the project by `find`
    (qualified name -> (unit, class), the program model's; none without a project); and whether an
    ``__init__`` of that chain builds a ``DistributedSampler`` itself. None when it derives from no
    loader. One walk for a class of the script and one of another module."""
    todo = [(anatomy, aliases, cls)]
    seen, base_q, shards = set(), None, False
    while todo and len(seen) < _DEPTH:
        a, al, cls = todo.pop()
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        init = _method(cls, "__init__")
        shards = shards or any(c.scope is init and c.qualname in DIST_SAMPLER for c in a.calls)
        for base in cls.bases:
            name = dotted(base.value)
            q = resolve(al, base.value)
            row = known(q) if q else None
            if row is not None and row.kind == "loader":
                base_q = base_q or q
            elif q is None and name in a.classes:
                todo.append((a, al, a.classes[name]))
            elif q is not None and find is not None:
                found = find(q)
                if found is not None:
                    todo.append((found[0].anatomy, found[0].aliases, found[1]))
    return (base_q, shards) if base_q is not None else None


def _method(cls: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
    for s in cls.body.body:
        if isinstance(s, cst.FunctionDef) and s.name.value == name:
            return s
    return None


def _is_loader(c: CallSite) -> bool:
    row = known(c.qualname)
    return row is not None and row.kind == "loader"


def _returns(fn: cst.FunctionDef) -> List[cst.Return]:
    out: List[cst.Return] = []

    class _V(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is fn  # a nested function's returns are not this one's

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            out.append(node)

    fn.visit(_V())
    return out


def _def_line(path: str, name: str) -> int:
    import ast

    tree = read_ast(path)
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node.lineno
    return 0


def for_script(path: str, root: Optional[str] = None, exclude: Tuple[str, ...] = ()) -> Tuple[Program, ProjectModule]:
    """A program model of the project around the script at `path`, and the script as its module."""
    prog = Program(Project.around(path, root, exclude))
    return prog, prog.project.script(path)


@dataclass(frozen=True)
class Reached:
    """Where a call of a script lands in the user's project: the project function it runs, or the
    file outside the project that holds it (found, but never read as the project's nor written)."""

    target: Optional[Target] = None
    outside: Optional[str] = None


def reached(anatomy, path: Optional[str], options, site: CallSite) -> Reached:
    """What `site`, a call of the script at `path` analysed as `anatomy`, reaches in the project
    (``options.project_root`` / ``options.exclude`` bound it); an empty answer without a path."""
    if not path:
        return Reached()
    prog, unit = _model(anatomy, path, options)
    target = prog.target(unit, site.call, site.scope, site.stmt)
    if target is not None:
        return Reached(target=target)
    q = resolve(unit.aliases, site.call.func)
    return Reached(outside=prog.project.outside(q)) if q else Reached()


@dataclass(frozen=True)
class LoaderSubclass:
    """A class of the user's project that a call of the script builds and that derives from a
    library loader (``class MyLoader(DataLoader)``)."""

    name: str  # "loaders.MyLoader"
    where: str  # "loaders.py:4", its `class` line
    base: str  # "torch.utils.data.DataLoader"
    shards_itself: bool  # an __init__ of its chain builds a DistributedSampler


def loader_subclass(anatomy, path: Optional[str], options, site: CallSite) -> Optional[LoaderSubclass]:
    """The class deriving from a loader that `site` (a call of the script at `path`) builds: one of
    the script itself (``class MyLoader(DataLoader)`` above the call), or of another module of the
    project, found through the same program model as `reached`; None otherwise. Both go through
    ``loader_chain``."""
    own = anatomy.classes.named(dotted(site.call.func)) if resolve(anatomy.aliases, site.call.func) is None else None
    if own is not None:
        prog = _model(anatomy, path, options)[0] if path else None
        base = loader_chain(anatomy, _model(anatomy, path, options)[1].aliases if path else anatomy.aliases, own,
                            (lambda q: prog._class(q, _DEPTH)) if prog is not None else None)
        if base is None:
            return None
        line = anatomy.position(own)[0] or (_def_line(path, own.name.value) if path else 0)
        where = f"{os.path.relpath(path, prog.project.root or os.sep).replace(os.sep, '/')}:{line}" if path else f"line {line}"
        return LoaderSubclass(own.name.value, where, base[0], base[1])
    if not path:
        return None
    prog, unit = _model(anatomy, path, options)
    q = resolve(unit.aliases, site.call.func)
    found = prog._class(q, _DEPTH) if q else None
    base = prog.loader_base(*found) if found is not None else None
    if base is None:
        return None
    home, cls = found
    line = home.anatomy.position(cls)[0] or _def_line(home.module.path, cls.name.value)
    rel = os.path.relpath(home.module.path, prog.project.root or os.sep).replace(os.sep, "/")
    return LoaderSubclass(f"{home.module.name}.{cls.name.value}", f"{rel}:{line}", base[0], base[1])


def handed_functions(anatomy, path: Optional[str], options, site: CallSite) -> List[Target]:
    """The project functions `site` is handed as values (``Process(target=train)``): code that the
    callee runs, found through the same program model as `reached`; empty without a path."""
    values = [a.value for a in site.call.args if isinstance(a.value, (cst.Name, cst.Attribute))]
    if not path or not values:
        return []
    prog, unit = _model(anatomy, path, options)
    return [t for t in (prog.function_value(unit, v) for v in values) if t is not None]


def _model(anatomy, path: str, options) -> Tuple[Program, Unit]:
    """The program model around the script at `path`, built once per anatomy."""
    cache = anatomy.__dict__.setdefault("_program", {})
    if "model" not in cache:
        reach = getattr(getattr(anatomy, "facts", None), "project", None)
        if isinstance(reach, ProjectReach) and reach.path == path:
            prog = reach.program()  # the one the fact layer already asks: modules analysed once
            mod = prog.project.script(path)
        else:
            prog, mod = for_script(path, getattr(options, "project_root", None), tuple(getattr(options, "exclude", ())))
        cache["model"] = (prog, prog.adopt(mod, anatomy))
    return cache["model"]


def program_of(anatomy) -> Optional[Program]:
    """The program model `reached` built for this anatomy, if any."""
    got = anatomy.__dict__.get("_program", {}).get("model")
    return got[0] if got else None
