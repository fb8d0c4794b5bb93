"""What a function of the user's project does that every rank would repeat: files it writes and
lines it prints, itself or through the project functions it calls (a bounded depth).

A script migrated alone calls its project's helpers as they are (``save_checkpoint(state)`` in
``utils.py``): distify guards the writes and prints it sees in the script, but a helper's own
``torch.save`` or ``print`` then runs on every rank. ``effects`` is the one fact the audit
(DST955, DST956) asks about such a call. A write or print the helper already makes on some ranks
only (under a rank test, or saying which rank speaks) is not one. What a call reaches comes from
the program model (``distify.program``), never from how anything is spelled.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, List, Optional, Set, Tuple

import libcst as cst

from distify.data_sources import foreign_loaders
from distify.syntax import all_nodes
from distify.library import TABLE, known
from distify.records import CallSite
from distify.syntax import dotted
from distify.writes import file_write, own_method_names, terminal_print
from distify.values import Value

if TYPE_CHECKING:  # the program model is loaded only when a script calls into its project
    from distify.program import Program, Target

DEPTH = 3  # project calls followed below the helper the script calls


class Effect(Value):
    """A write or a print a project function makes (``effects``), with the names it reads."""

    __slots__ = ("kind", "what", "where", "reads")
    kind: str  # "write" | "print"
    what: str  # "save()", "open(..., 'w')", "print()"
    where: str  # the project function that makes it: "utils.save_checkpoint() at utils.py:12"
    # the names the write or print reads (its file name, its message), as names of the function
    # `effects` was asked about: a deeper function's parameters become what its call hands them
    reads: frozenset

    def __init__(self, kind: str, what: str, where: str, reads: frozenset = frozenset()) -> None:
        self._set(kind, what, where, reads)


def effects(prog: Program, target: Target, depth: int = DEPTH, _seen: Optional[Set[int]] = None) -> List[Effect]:
    """The writes and prints every rank runs when `target` is called: in its own body (not in a
    nested function's), then in the project functions it calls, `depth` levels down."""
    seen = _seen if _seen is not None else set()
    if id(target.fn) in seen:
        return []
    seen.add(id(target.fn))
    a = target.unit.anatomy
    own = own_method_names(a.methods)
    here = f"{target.qualname.rsplit('.', 1)[-1]}() at {target.where}"
    out: List[Effect] = []
    deeper = []
    for c in a.calls:
        if c.scope is not target.fn or a.call_on_some_ranks(c) or a.mentions_rank(c.call):
            continue
        what = file_write(c, own)
        if what is None and terminal_print(c):
            what = "print()"
        if what is not None:
            reads = frozenset(n.value for n in all_nodes(c.call) if isinstance(n, cst.Name))
            out.append(Effect("print" if what == "print()" else "write", what, here, reads))
        elif depth > 0:
            inner = prog.target(target.unit, c.call, c.scope, c.stmt) or same_module(target, c)
            if inner is not None:
                deeper.append((inner, c.call))
    for inner, call in deeper:
        bound = prog.bind(inner, call)
        handed = [x.value for x in call.args]
        for e in effects(prog, inner, depth - 1, seen):
            params = e.reads & set(bound) if len(bound) == len(handed) else e.reads  # *args: all it hands
            via = [bound[p] for p in params if p in bound] if len(bound) == len(handed) else handed
            reads = (e.reads - params) | {n.value for v in via for n in all_nodes(v) if isinstance(n, cst.Name)}
            out.append(Effect(e.kind, e.what, e.where, frozenset(reads)))
    return out


_LIBRARY_ROOTS = frozenset(q.split(".", 1)[0] for q in TABLE) | frozenset(sys.stdlib_module_names)


def unguarded_helper_calls(a, path: Optional[str], options) -> List[Tuple[CallSite, Target, List[Effect]]]:
    """The calls of the script analysed as `a` (at `path`) into functions of its project that
    write files or print on every rank, with what each does: the call itself runs on every rank,
    and the function it reaches is read from disk as it is (not one `a` itself defines, which the
    audit reads directly, and not one distify already migrated)."""
    if not path:
        return []
    sites = project_calls(a)
    if not sites:
        return []  # nothing the project could define: no program model to build
    from distify.program import program_of, reached

    out = []
    for c in sites:
        if a.call_on_some_ranks(c):
            continue
        t = reached(a, path, options, c).target
        if t is None or t.unit.anatomy.migrated_by_distify or _defined_here(a, t):
            continue
        prog = program_of(a)
        ranked = [x for x in c.call.args if a.mentions_rank(x.value)]
        bound = prog.bind(t, c.call)
        per_rank = {p for p, v in bound.items() if any(v is x.value for x in ranked)}
        unsure = len(per_rank) < len(ranked)  # a rank handed through *args / **kwargs
        # a write or print that reads a parameter the call hands a rank (or a device) is the
        # rank's own file or line
        found = [e for e in effects(prog, t) if not (e.reads & per_rank or (ranked and unsure))]
        if found:
            out.append((c, t, found))
    return out


def project_calls(a) -> List[CallSite]:
    """The calls of `a` that a module of the user's project may define: resolved to a qualified
    name that is neither a known library object nor under a library's or the standard library's
    root."""
    return [c for c in a.calls if c.qualname is not None and known(c.qualname) is None
            and c.qualname.split(".", 1)[0] not in _LIBRARY_ROOTS]


def builds_elsewhere(a) -> bool:
    """The script analysed as `a` trains and calls a function another module may define (not a
    library's): worth asking the program model whether a loader, an evaluation or a write is built
    there (``distify.project_view``, which the engine imports only then)."""
    return a.has_training and (bool(foreign_loaders(a)) or bool(project_calls(a)))


def same_module(target: Target, c: CallSite) -> Optional[Target]:
    """The function of `target`'s own module that `c` calls (``with_log(state)`` beside it)."""
    from distify.program import Target as _Target

    a = target.unit.anatomy
    fn = a.callee(c.call, c.scope)
    if fn is None:
        return None
    cls = next((k for k in a.classes.values() if any(s is fn for s in k.body.body)), None)
    name = f"{cls.name.value}.{fn.name.value}" if cls is not None else fn.name.value
    return _Target(target.unit, fn, cls, f"{target.unit.module.name}.{name}", target.root)


def _defined_here(a, t: Target) -> bool:
    """`t`'s code is part of the module audited (a project view joins the helper's functions)."""
    if t.cls is not None:
        return t.cls.name.value in a.classes
    return t.fn.name.value in a.functions


def advice(c: CallSite, t: Target, e: Effect) -> str:
    """The one-line warning for a helper call `c` whose function does `e` on every rank."""
    file = t.where.rsplit(":", 1)[0]
    verb = "writes a file" if e.kind == "write" else "prints"
    via = "" if e.where.endswith(t.where) else f" through {e.where}"
    return (f"{t.qualname.rsplit('.', 1)[-1]}() in {t.where} {verb} ({e.what}{via}) on every rank; guard the call "
            f"with `if runtime.is_main_process():` or let distify migrate {file}")


def loaders_handed_to_training(a, path: Optional[str], options) -> List[Tuple[object, CallSite, Target, bool]]:
    """Loaders of the script analysed as `a` (at `path`) that a call hands, as an argument, to a
    function of the user's project that trains (``simclr.train(train_loader)``): their batches
    reach training in code this analysis did not join, so a missing sampler is not seen by the
    loops of this module. A loader is matched wherever its value flows in the script (the
    anatomy's flow facts: ``ld = train_loader`` ... ``runner.fit(ld)``), never by its name. The
    last field says whether a training loop of the function iterates the very parameter the
    loader binds (it cannot have given the loader a sampler on the way)."""
    if not path or not a.loaders:
        return []
    refs = {}
    for loader in a.loaders:
        for scope, ref in loader.refs or [(loader.call.scope, loader.target)]:
            if ref:
                refs[(id(scope), ref)] = loader
    out = []
    for c in a.calls:
        if c.qualname is not None and (known(c.qualname) is not None or c.qualname.split(".", 1)[0] in _LIBRARY_ROOTS):
            continue
        if c.qualname is None and isinstance(c.call.func, cst.Name):
            continue  # a name no import binds (a builtin, the script's own function): no project function
        handed = [refs.get((id(c.scope), dotted(x.value))) for x in c.call.args]
        handed = [l for l in handed if l is not None]
        if not handed:
            continue
        from distify.program import program_of, reached  # a loader handed to a call: the program model says where

        t = reached(a, path, options, c).target
        if t is None or not program_of(a).trains(t):
            continue
        prog = program_of(a)
        bound = prog.bind(t, c.call)
        iterated = {bl.ref for bl in prog.training_loops(t)}
        for l in handed:
            params = {p for p, v in bound.items() if refs.get((id(c.scope), dotted(v))) is l}
            out.append((l, c, t, bool(params & iterated)))
    return out


def only_writes(prog: Program, target: Target, depth: int = DEPTH, _seen: Optional[Set[int]] = None) -> bool:
    """`target` does nothing but write files, print and read values (``library.FILE_SYSTEM_MODULES``,
    ``PURE_BUILTINS``, ``READ_METHODS``, methods of the files it opens, and project functions that
    do as little): no assignment but to its own local names, no ``global``, no nested code, no
    collective, no random draw, no call distify does not know. Run on one rank only, such a helper
    leaves every other rank's state as it was."""
    seen = _seen if _seen is not None else set()
    if id(target.fn) in seen:
        return True
    seen.add(id(target.fn))
    a = target.unit.anatomy
    opened: Set[str] = set()  # the names bound to a file it opens (`with open(p, "w") as fh`)
    for n in all_nodes(target.fn.body):
        if isinstance(n, (cst.Global, cst.Nonlocal, cst.Yield, cst.Await, cst.Del, cst.NamedExpr,
                          cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in n.targets] if isinstance(n, cst.Assign) else [n.target]
            if not all(isinstance(x, cst.Name) for t in targets for x in _elements(t)):
                return False  # `state["k"] = v`, `args.x = v`: the caller's objects changed on one rank
        if isinstance(n, cst.WithItem) and n.asname is not None and isinstance(n.asname.name, cst.Name):
            if isinstance(n.item, cst.Call) and _pure_call(a, n.item, None):
                opened.add(n.asname.name.value)
    own = own_method_names(a.methods)
    for c in a.calls:
        if c.scope is not target.fn:
            continue
        if file_write(c, own) is not None or terminal_print(c) or _pure_call(a, c.call, c.qualname):
            continue
        f = c.call.func
        if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value in opened:
            continue  # fh.write(...) on the file it opened
        inner = prog.target(target.unit, c.call, c.scope, c.stmt) or same_module(target, c)
        if inner is not None and depth > 0 and only_writes(prog, inner, depth - 1, seen):
            continue
        return False
    return True


def _elements(t: cst.BaseExpression):
    return [e.value for e in t.elements] if isinstance(t, (cst.Tuple, cst.List)) else [t]


def _pure_call(a, call: cst.Call, qualname: Optional[str]) -> bool:
    """`call` reads values or touches the file system and does nothing else (library data)."""
    from distify.library import FILE_SYSTEM_MODULES, LOGGING_MODULES, PURE_BUILTINS, READ_METHODS

    if qualname is not None:
        return qualname.startswith(FILE_SYSTEM_MODULES + LOGGING_MODULES)
    f = call.func
    if isinstance(f, cst.Name):  # a builtin, unless the module binds the name itself
        return f.value in PURE_BUILTINS and f.value not in a.name_bindings and f.value not in a.functions
    return isinstance(f, cst.Attribute) and f.attr.value in READ_METHODS


def plain_arguments(a, call: cst.Call) -> bool:
    """Computing the arguments of `call` changes nothing and reaches no collective: every call among
    them reads a value (``model.state_dict()``, ``vars(args)``)."""
    for n in all_nodes(call):
        if n is call:
            continue
        if isinstance(n, (cst.Yield, cst.Await, cst.NamedExpr, cst.Lambda)):
            return False
        if isinstance(n, cst.Call) and not _pure_call(a, n, a.qualname(n.func)):
            return False
    return True


def exact_helper_calls(a, path: Optional[str], options) -> List[Tuple[CallSite, Target, List[Effect]]]:
    """The calls of ``unguarded_helper_calls`` that may run on the main process alone, exactly: the
    call is a statement of its own (its value unused), its arguments only read values, and the
    helper does nothing but write files and print (``only_writes``)."""
    calls = unguarded_helper_calls(a, path, options)
    if not calls:
        return []  # no program model was built: not even its module is needed
    from distify.program import program_of

    out = []
    for c, t, found in calls:
        small = c.stmt.body[0] if isinstance(c.stmt, cst.SimpleStatementLine) and len(c.stmt.body) == 1 else None
        if not (isinstance(small, cst.Expr) and small.value is c.call):
            continue
        if plain_arguments(a, c.call) and only_writes(program_of(a), t):
            out.append((c, t, found))
    return out
