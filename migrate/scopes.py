"""Which names a module reads where nothing binds them, and which of those a rewrite introduced.

A fact of the program, asked by the engine about distify's own output (DST962): an edit that reads a
name in a scope where it is not bound (``backward_passes_per_step=accumulation_steps`` inserted in
``main`` when only ``train``'s parameter is called that) compiles, then raises NameError at run time.

The scopes are CPython's own (``symtable``: the compiler's symbol tables, with Python's rules – a
method does not see its class's names, comprehensions and lambdas are scopes, ``global`` and
``nonlocal``, parameters, imports, every binding form). libcst's ``ScopeProvider`` gives the same
answer, but resolving it for a whole module doubled the time of a migration (measured on 15 fixture
scripts: +129%); the symbol tables cost about one ``compile``. Positions are looked up (``ast``)
only for a read that is reported.

A read is keyed by the name and the chain of named scopes it sits in (``("main",)``,
``("Trainer", "fit")``): a name the input already reads unbound in the same scope (a star import, a
global another module injects) is the user's, not distify's. Order within a scope (a read before
the assignment below it) is not judged: a function's name is bound wherever in it it is assigned.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from typing import List, Set, Tuple

Key = Tuple[str, Tuple[str, ...]]
# names every module has without binding them
MODULE_NAMES = frozenset({"__name__", "__file__", "__doc__", "__builtins__", "__spec__", "__loader__", "__package__",
                          "__annotations__", "__path__", "__cached__"})
_COMPREHENSIONS = {ast.ListComp: "listcomp", ast.SetComp: "setcomp", ast.DictComp: "dictcomp", ast.GeneratorExp: "genexpr"}


def _tables(top: symtable.SymbolTable):
    todo = [(top, ())]
    while todo:
        table, path = todo.pop()
        yield table, path
        for child in table.get_children():
            todo.append((child, path + (child.get_name(),)))


def unbound_reads(source: str) -> Set[Key]:
    """(name, scope path) of every read of a name that nothing binds in a scope the read can see:
    not a local, parameter or import of its scope, not bound in an enclosing function (free), not
    bound at module level (or by a ``global`` declaration anywhere), not a builtin."""
    top = symtable.symtable(source, "<distify>", "exec")
    tables = list(_tables(top))
    module_bound = set(MODULE_NAMES) | set(dir(builtins))
    for table, _path in tables:
        for s in table.get_symbols():
            if s.is_assigned() or s.is_imported() or s.is_namespace():
                if table is top or s.is_declared_global():
                    module_bound.add(s.get_name())
    out: Set[Key] = set()
    for table, path in tables:
        for s in table.get_symbols():
            if not s.is_referenced() or s.get_name() in module_bound:
                continue
            if table is top:
                if not (s.is_assigned() or s.is_imported() or s.is_namespace()):
                    out.add((s.get_name(), path))
            elif s.is_global() and not s.is_assigned():
                out.add((s.get_name(), path))
    return out


def new_unbound_reads(before: str, after: str) -> List[Tuple[str, Tuple[str, ...], int]]:
    """Reads ``after`` makes of names unbound where it reads them that ``before`` does not make in the
    same scope: (name, scope path, line in ``after``), in the order of ``after``'s lines."""
    found = unbound_reads(after)
    if not found:
        return []
    new = found - unbound_reads(before)
    if not new:
        return []
    lines = _first_lines(ast.parse(after), {name for name, _ in new})
    return sorted(((name, path, lines.get((name, path), 1)) for name, path in new), key=lambda x: (x[2], x[0]))


def _first_lines(tree: ast.AST, names: Set[str]) -> dict:
    """The first line each of ``names`` is read on, per scope path, walking ``tree`` with the scopes
    ``symtable`` names (functions and classes by name, ``lambda``, ``listcomp``...)."""
    out: dict = {}
    todo = [(tree, ())]
    while todo:
        node, path = todo.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names:
            key = (node.id, path)
            out[key] = min(out.get(key, node.lineno), node.lineno)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            # decorators, bases and defaults are read in the enclosing scope
            outer = [*getattr(node, "decorator_list", ()), *getattr(node, "bases", ()), *getattr(node, "keywords", ())]
            if not isinstance(node, ast.ClassDef):
                outer += [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]
            inner = path + (getattr(node, "name", "lambda"),)
            todo += [(c, path) for c in outer]
            todo += [(c, inner) for c in (node.body if isinstance(node.body, list) else [node.body])]
        elif type(node) in _COMPREHENSIONS:
            # the first iterable is evaluated outside the comprehension's scope
            inner = path + (_COMPREHENSIONS[type(node)],)
            todo.append((node.generators[0].iter, path))
            todo += [(c, inner) for c in ast.iter_child_nodes(node) if c is not node.generators[0]]
            todo += [(c, inner) for c in (node.generators[0].target, *node.generators[0].ifs)]
        else:
            todo += [(c, path) for c in ast.iter_child_nodes(node)]
    return out


__all__ = ["new_unbound_reads", "unbound_reads"]
