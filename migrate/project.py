"""The user's project: which modules an entry script reaches through its imports, where they live,
and which of them distify may read and rewrite.

``distify train.py`` starts from one script; its training often lives in modules it imports
(``from utils import train_one_epoch``, ``import models.resnet as resnet``, ``from .data import
get_loader``). ``Project`` finds those modules the way Python would for ``python train.py``: from
the script's folder and from its package root (the folder above the topmost folder holding an
``__init__.py``), or from ``[tool.distify] project-root`` when the configuration names it. A module
outside that root, in a ``site-packages`` or ``dist-packages`` folder, or matched by ``[tool.distify]
exclude`` is never read as part of the project and never written.

Discovery is lazy: ``module(name)`` locates one module when a fact asks about it, and ``imports``
reads a module's import statements (with ``ast``: no libcst, nothing run) only when someone follows
them. ``reachable`` follows imports transitively for the commands that want the whole picture.
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re
from collections import deque
from typing import Collection, Dict, Iterator, List, Optional, Sequence, Tuple

from distify.values import Record, Value

MAX_BYTES = 1024 * 1024  # a module larger than this is not read as part of the project
_FOREIGN_DIRS = frozenset({"site-packages", "dist-packages"})


class ProjectModule(Value):
    """One module of the project: its dotted name from a search root, its file, and whether it is a
    package's ``__init__.py`` (relative imports inside it are relative to itself)."""

    __slots__ = ("name", "path", "is_package")
    name: str
    path: str  # absolute, real path
    is_package: bool

    def __init__(self, name: str, path: str, is_package: bool = False) -> None:
        self._set(name, path, is_package)

    @property
    def package(self) -> str:
        """The package relative imports start from (``from . import x``)."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


class Import(Value):
    """One import of a module of the project: what it names, absolute, and its line."""

    __slots__ = ("module", "names", "line", "binds")
    module: str  # the module imported ("utils", "models.resnet", "pkg.sub")
    names: Tuple[str, ...]  # the names a `from ... import` takes from it (empty for `import m`)
    line: int
    # local name -> qualified name it binds (`from .data import get_loader as gl`: gl -> pkg.data.get_loader)
    binds: Tuple[Tuple[str, str], ...]

    def __init__(self, module: str, names: Tuple[str, ...], line: int, binds: Tuple[Tuple[str, str], ...] = ()) -> None:
        self._set(module, names, line, binds)


class Project(Record):
    """The project around one or more entry scripts. Build it with ``Project.around``."""

    __slots__ = ("root", "search", "exclude", "_modules", "_imports", "_outside", "__dict__")
    root: str  # nothing outside it is the project
    search: Tuple[str, ...]  # where module names are looked up, in order
    exclude: Tuple[str, ...]  # fnmatch patterns (full path or file name) never read nor written
    _modules: Dict[str, Optional[ProjectModule]]
    _imports: Dict[str, Tuple[Import, ...]]
    _outside: Dict[str, str]  # module name -> file, not the project's

    def __init__(self, root: str, search: Tuple[str, ...], exclude: Tuple[str, ...] = ()) -> None:
        self._set(root, search, exclude)
        self._modules = {}
        self._imports = {}
        self._outside = {}

    @classmethod
    def around(cls, script: str, root: Optional[str] = None, exclude: Sequence[str] = ()) -> "Project":
        """The project of `script`: `root` when the configuration names one (relative paths are
        taken from the current folder), else the script's package root, searched after the
        script's own folder (what ``python script.py`` puts first on ``sys.path``)."""
        here = os.path.dirname(os.path.realpath(script))
        top = package_root(here)
        if root:
            # the script's folder is searched all the same (Python does): a module found there
            # but outside the root is known, and said to be outside (``outside``), never read
            base = os.path.realpath(root)
            return cls(base, (here,) if here == base else (here, base), tuple(exclude))
        search = (here,) if top == here else (here, top)
        return cls(top, search, tuple(exclude))

    # locating ------------------------------------------------------------------------------
    def allowed(self, path: str) -> bool:
        """`path` is the project's: under its root, in no site-packages, not excluded."""
        real = os.path.realpath(path)
        if not _inside(real, self.root):
            return False
        if _FOREIGN_DIRS & set(os.path.relpath(real, self.root).split(os.sep)):
            return False
        base = os.path.basename(real)
        return not any(fnmatch.fnmatch(real, p) or fnmatch.fnmatch(base, p) for p in self.exclude)

    def module(self, name: str) -> Optional[ProjectModule]:
        """The project's module `name` ("models.resnet"), or None when it is not the project's
        (a library, a module outside the root or excluded, or no such file)."""
        if name in self._modules:
            return self._modules[name]
        found = None
        parts = name.split(".")
        if all(p.isidentifier() for p in parts):
            for base in self.search:
                for rel, is_pkg in ((os.path.join(*parts) + ".py", False), (os.path.join(*parts, "__init__.py"), True)):
                    path = os.path.join(base, rel)
                    if os.path.isfile(path):
                        if self.allowed(path):
                            found = ProjectModule(name, os.path.realpath(path), is_pkg)
                        else:
                            self._outside[name] = os.path.realpath(path)
                        break
                else:
                    continue
                break
        self._modules[name] = found
        return found

    def outside(self, qualified: str) -> Optional[str]:
        """The file of the module a qualified name lives in when that file was found but is not
        the project's (outside the root, excluded, in site-packages): distify never writes it."""
        parts = qualified.split(".")
        for i in range(len(parts), 0, -1):
            name = ".".join(parts[:i])
            if self.module(name) is None and name in self._outside:
                return self._outside[name]
        return None

    def script(self, path: str) -> ProjectModule:
        """An entry script as a module: its dotted name from the root when it sits in a package
        (``pkg/train.py``: ``pkg.train``, so that its relative imports resolve), else ``__main__``."""
        real = os.path.realpath(path)
        here = os.path.dirname(real)
        if os.path.isfile(os.path.join(here, "__init__.py")) and _inside(here, self.root):
            rel = os.path.relpath(os.path.splitext(real)[0], package_root(here))
            return ProjectModule(".".join(rel.split(os.sep)), real, False)
        return ProjectModule("__main__", real, False)

    def locate(self, qualified: str) -> Optional[Tuple[ProjectModule, str]]:
        """The project module a qualified name lives in and the rest of the name
        (``models.resnet.build``: (models.resnet, "build")); the longest module prefix wins."""
        parts = qualified.split(".")
        for i in range(len(parts), 0, -1):
            mod = self.module(".".join(parts[:i]))
            if mod is not None:
                return mod, ".".join(parts[i:])
        return None

    # imports -------------------------------------------------------------------------------
    def imports(self, mod: ProjectModule) -> Tuple[Import, ...]:
        """The imports of `mod` (at any depth: a function's own imports count), absolute."""
        if mod.path in self._imports:
            return self._imports[mod.path]
        tree = read_ast(mod.path)
        out: List[Import] = []
        for node in statements(tree) if tree is not None else ():
            if isinstance(node, ast.Import):
                for a in node.names:
                    binds = ((a.asname, a.name),) if a.asname else ((a.name.split(".")[0], a.name.split(".")[0]),)
                    out.append(Import(a.name, (), node.lineno, binds))
            elif isinstance(node, ast.ImportFrom):
                base = absolute(mod, node.module, node.level)
                if base is None:
                    continue
                names = tuple(a.name for a in node.names if a.name != "*")
                binds = tuple((a.asname or a.name, f"{base}.{a.name}") for a in node.names if a.name != "*")
                out.append(Import(base, names, node.lineno, binds))
        out.sort(key=lambda i: i.line)
        self._imports[mod.path] = tuple(out)
        return self._imports[mod.path]

    def relative_aliases(self, mod: ProjectModule) -> Dict[str, str]:
        """Local name -> qualified name for the relative imports of `mod` (``from .data import
        get_loader``), which a module's own alias map leaves out: it does not know its package.
        A file whose text holds no ``from`` followed by a dot is not parsed: it has none."""
        tree = read_ast(mod.path, RELATIVE_IMPORT)
        out: Dict[str, str] = {}
        for node in statements(tree) if tree is not None else ():
            if isinstance(node, ast.ImportFrom) and node.level:
                base = absolute(mod, node.module, node.level)
                for a in node.names if base is not None else ():
                    if a.name != "*":
                        out[a.asname or a.name] = f"{base}.{a.name}"
        return out

    def star_modules(self, mod: ProjectModule) -> List[str]:
        """The modules `mod` re-exports with ``from .trainer import *`` / ``from pkg.x import *``,
        as absolute names, in source order."""
        tree = read_ast(mod.path)
        out: List[str] = []
        for node in tree.body if tree is not None else ():
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                base = absolute(mod, node.module, node.level) if node.level else node.module
                if base:
                    out.append(base)
        return out

    def imported_modules(self, mod: ProjectModule) -> Iterator[Tuple[ProjectModule, int]]:
        """The project modules `mod` imports, with the line: `import pkg.sub` reaches pkg and
        pkg.sub, `from pkg import sub` reaches pkg and, when it is a module, pkg.sub."""
        for imp in self.imports(mod):
            parts = imp.module.split(".")
            names = [".".join(parts[: i + 1]) for i in range(len(parts))] + [f"{imp.module}.{n}" for n in imp.names]
            for name in names:
                found = self.module(name)
                if found is not None and found.path != mod.path:
                    yield found, imp.line

    def reachable(self, script: str) -> List[ProjectModule]:
        """Every project module `script` reaches through imports, transitively, in the order found."""
        start = self.script(script)
        seen = {start.path}
        order: List[ProjectModule] = []
        todo = [start]
        while todo:
            for found, _ in self.imported_modules(todo.pop(0)):
                if found.path not in seen:
                    seen.add(found.path)
                    order.append(found)
                    todo.append(found)
        return order


def project_files(script: str, options) -> Tuple[str, ...]:
    """The files of every project module `script` reaches through its imports (what a result of
    the script may depend on: ``distify.cache`` keys an entry on their bytes too)."""
    project = Project.around(script, getattr(options, "project_root", None), tuple(getattr(options, "exclude", ())))
    return tuple(m.path for m in project.reachable(script))


def absolute(mod: ProjectModule, module: Optional[str], level: int) -> Optional[str]:
    """The absolute module of ``from <level dots><module> import ...`` written in `mod`; None when
    the dots climb above the top package."""
    if not level:
        return module
    parts = mod.package.split(".") if mod.package else []
    if level - 1 > len(parts) or (mod.name == "__main__"):
        return None
    base = parts[: len(parts) - (level - 1)]
    if module:
        base += module.split(".")
    return ".".join(base) or None


def package_root(folder: str) -> str:
    """The folder above the topmost package around `folder` (walking up while ``__init__.py``
    exists), or `folder` itself when it is no package."""
    top = folder
    while os.path.isfile(os.path.join(top, "__init__.py")) and os.path.dirname(top) != top:
        top = os.path.dirname(top)
    return top


# `from .x import y`, `from . import y`, also across a line continuation: a relative import's text
# always matches (a match that is none, in a string or a comment, costs only the parse)
RELATIVE_IMPORT = re.compile(rb"\bfrom[ \t\f\\\r\n]*\.")


def read_ast(path: str, needle: Optional["re.Pattern[bytes]"] = None) -> Optional[ast.Module]:
    """The module at `path`, parsed; None when it cannot be, or when its text does not match `needle`."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, "rb") as fh:
            data = fh.read()
        # (an encoding cookie may name a codec in which the needle's ASCII bytes are others: parsed)
        if needle is None or needle.search(data) or b"coding" in b"\n".join(data.split(b"\n", 2)[:2]):
            return ast.parse(data)
        return None
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def statements(tree: ast.Module) -> Iterator[ast.AST]:
    """Every statement of `tree` at any depth (and the except and case clauses that hold some), in
    ``ast.walk``'s order: where imports can be. Expressions are not entered, which makes it a few
    times cheaper than ``ast.walk`` over every node."""
    todo = deque([tree])
    while todo:
        node = todo.popleft()
        for name in node._fields:
            if name in _BODIES:
                for child in getattr(node, name):
                    todo.append(child)
                    yield child


_BODIES = frozenset({"body", "orelse", "finalbody", "handlers", "cases"})


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([os.path.realpath(path), os.path.realpath(root)]) == os.path.realpath(root)
    except ValueError:  # different drives
        return False


def reaching(paths: Sequence[str], options, importers: Optional[Sequence[str]] = None,
             known: Optional[Dict[str, Sequence[str]]] = None) -> Dict[str, List[str]]:
    """The files of a run (`paths`) that another file of the same run reaches through its imports:
    real path -> the paths that reach it. Such a module is migrated with the script that imports it
    (its own run is neither written nor reported in its place: ``with_others``, ``settle_reached``).
    Only the imports of `importers` (default: every path) are followed; `known` gives the modules
    a path reaches where they were already found (``project_files``)."""
    real = {os.path.realpath(p) for p in paths}
    out: Dict[str, List[str]] = {}
    if len(real) < 2:
        return out
    for path in paths if importers is None else importers:
        found = known[path] if known is not None and path in known else project_files(path, options)
        for mod_path in found:
            key = os.path.realpath(mod_path)
            if key in real and key != os.path.realpath(path):
                out.setdefault(key, []).append(path)
    return out


def with_others(results: Sequence, reached: Collection[str] = ()) -> list:
    """Each result followed by the other files of the project its migration rewrites, every file
    listed once: a module two entry scripts rewrite alike appears once (refused when they would
    rewrite it differently), and a module also given as a path of its own (``distify .``) is listed
    as the migration of its entry script rewrites it: its own run changed nothing, or it is a
    module another file of the run reaches (`reached`, real paths: ``reaching``), whose own run
    waited (never written) for this."""
    from distify.engine import Status

    out: list = []
    seen: dict = {}  # real path -> (index in out, listed as another file's rewrite)
    for r in results:
        key = os.path.realpath(r.path)
        own_reached = key in reached and not r.others
        if key in seen and (r.status is Status.UNCHANGED or (own_reached and seen[key][1])):
            pass  # already listed as rewritten for an entry script
        else:
            seen.setdefault(key, (len(out), False))
            out.append(r)
        for o in r.others:
            key = os.path.realpath(o.path)
            if key not in seen:
                seen[key] = (len(out), True)
                out.append(o)
                continue
            i, other = seen[key]
            first = out[i]
            if not other and not first.others and (first.status is Status.UNCHANGED or key in reached):
                out[i] = o  # its own run changed nothing, or waited: the entry script's migration speaks for it
                seen[key] = (i, True)
            elif (first.output or first.source) != (o.output or o.source) and first.status is not Status.ERROR:
                out[i] = first.replace(status=Status.REFUSED, output=first.source,
                                 message="two entry scripts would rewrite it differently; not migrated")
    return out


def settle_reached(results: Sequence, reached: Dict[str, List[str]]) -> list:
    """A module of the run that other files of it import (`reached`: ``reaching``), whose own
    migration changed it and which no entry script's migration rewrote (``with_others`` leaves its
    own result then): refused, not written, when a script that imports it was not migrated (refused,
    or an error): written alone, it would be half a migration (a wrapper and a sampler with no
    process group in the script that runs them)."""
    from distify.engine import Status

    status = {os.path.realpath(r.path): r.status for r in results}
    failed = (Status.REFUSED, Status.ERROR, Status.FAILED)
    out = []
    for r in results:
        key = os.path.realpath(r.path)
        if r.status is Status.CHANGED and not r.others and key in reached:
            stopped = [p for p in reached[key] if status.get(os.path.realpath(p)) in failed]
            if stopped:
                r = r.replace(status=Status.REFUSED, output=r.source, pending=False,
                              message=f"not migrated: {os.path.relpath(stopped[0])}, which imports it, was not "
                              "migrated, and this module alone would be half of that migration")
        out.append(r)
    return out


def write_all(results: Sequence) -> list:
    """Write the files of a run (``with_others``' list) whose writing waited (``pending``: the
    migrations that rewrite several files of the project), each atomically and only if it is still
    as it was read: after every entry script was migrated against the same originals, so that a
    module two entry scripts share is rewritten once, from its original."""
    from distify.engine import InputError, Status, write_atomic

    out = []
    for r in results:
        if r.pending and r.status is Status.CHANGED:
            r = r.replace(pending=False)
            real = os.path.realpath(r.path)
            try:
                with open(real, "rb") as fh:
                    if fh.read() != r.source:
                        raise InputError("file changed on disk while distify was processing it; not written")
                write_atomic(real, r.output)
            except InputError as e:
                r = r.replace(status=Status.ERROR, message=str(e), output=b"")
            except OSError as e:
                r = r.replace(status=Status.ERROR, message=f"cannot write: {e.strerror or e}", output=b"")
        out.append(r)
    return out


# the public entry point ------------------------------------------------------------------------

class ProjectResult(Value):
    """What ``migrate_project`` did to a project: one ``distify.engine.FileResult`` per file it
    migrated or would migrate (``path``, ``status``, ``findings``, ``source``/``output`` bytes),
    each entry script followed by the modules of the project its migration rewrites (listed once
    even when two entry scripts share them), and ``modules``: every project module the entry
    scripts reach (for ``distify verify`` to copy along)."""

    __slots__ = ("root", "files", "modules")
    root: str
    files: Tuple[object, ...]  # distify.engine.FileResult
    modules: Tuple[str, ...]  # real paths, in the order found

    def __init__(self, root: str, files: Tuple[object, ...], modules: Tuple[str, ...]) -> None:
        self._set(root, files, modules)

    @property
    def changed(self) -> bool:
        return any(f.output != f.source and f.output for f in self.files)


def migrate_project(paths: Sequence[str], options, mode=None) -> ProjectResult:
    """Migrate the entry scripts `paths` as one project (``options``: a ``distify.options.Options``;
    ``mode``: a ``distify.engine.Mode``, CHECK by default, which writes nothing; WRITE writes every
    changed file atomically). A training loop that runs in another module of the project is
    migrated where it lives (``distify.project_view``) when the view of the two is exact, else
    refused (DST961, exit 3) with that module's file and line: nothing is written then."""
    from distify.engine import Mode, process_file

    mode = mode or Mode.CHECK
    files = []
    modules: List[str] = []
    root = ""
    reach: Dict[str, List[str]] = {}
    for path in paths:
        project = Project.around(path, getattr(options, "project_root", None), tuple(getattr(options, "exclude", ())))
        root = root or project.root
        reach[path] = [mod.path for mod in project.reachable(path)]
        modules += [p for p in reach[path] if p not in modules]
    reached = reaching(paths, options, known=reach)
    for path in paths:
        files.append(process_file(path, mode, options, defer=os.path.realpath(path) in reached))
    files = settle_reached(with_others(files, reached), reached)
    return ProjectResult(root, tuple(write_all(files)), tuple(modules))
