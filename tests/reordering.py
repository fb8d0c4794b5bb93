"""Reorder what is free to move, for the metamorphic tests: the transformation and the normal form.

`reorder(source)` changes the order of what the language leaves free, never what runs:

- the keyword arguments of a call, reversed within each run of keywords whose values are all free of
  effects (names, constants, attributes, arithmetic and displays of those); a `*args` or `**kw`
  argument ends a run, and a call to the builtin `dict` keeps its order (it is the dict's order);
- each run of adjacent statements of one block that commute pairwise (`commute`) reversed: plain imports
  of distinct names (never `__future__`, never `*`); or undecorated `def`/`class` statements and simple
  assignments whose definition-time code makes no call, that bind distinct names and read nothing
  another binds; an assignment whose calls all go into imports or builtins (`device =
  torch.device("cpu")`) past the definitions it does not mention (a library function cannot see the
  script's globals; two calls never change order).

`normal_form(source, known)` is the form two migrations are compared in: every such keyword run
sorted by keyword, and every block put in its lexicographically least order among the orders that
swapping adjacent commuting statements reaches: the relation above, and, on the output, a statement
whose calls all go into imports or builtins (distify's `dist.init_process_group(...)`) commutes with
the definitions and assignments it does not mention; guards, loops and the script's own calls commute
with nothing. A transformed input and the original have the same normal form; so must their
migrations, unless distify decided something by position. The sort key masks the names distify made
up (those not in `known`): they are numbered later, by first use.
"""

from __future__ import annotations

import ast
import builtins
import io
import keyword
import symtable
import tokenize
from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Sequence, Set

import libcst as cst

# Expressions free of effects worth ordering: names, constants, attributes, arithmetic, comparisons
# and displays of those.
_PURE = (
    cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString,
    cst.Attribute, cst.BinaryOperation, cst.UnaryOperation, cst.BooleanOperation, cst.Comparison,
    cst.Tuple, cst.List, cst.Set, cst.Dict, cst.Ellipsis,
)


def pure(node: cst.CSTNode) -> bool:
    """True when `node` is built only of the expressions in `_PURE` (and their operators, brackets
    and whitespace): no call, subscript, comprehension, lambda, await, yield, walrus, f-string or
    unpacking (`*a` iterates `a`)."""
    if isinstance(node, (cst.StarredElement, cst.StarredDictElement)):
        return False
    if isinstance(node, cst.BaseExpression) and not isinstance(node, _PURE):
        return False
    return all(pure(c) for c in node.children)


def _reads(node: cst.CSTNode) -> Set[str]:
    """Every name spelled as a Name in `node`, attribute names aside (`a.b` reads `a`)."""
    found: Set[str] = set()

    class V(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            found.add(n.value)

        def visit_Attribute(self, n: cst.Attribute) -> bool:
            n.value.visit(self)
            return False

    node.visit(V())
    return found


def _calls(node: cst.CSTNode) -> bool:
    """Whether evaluating `node` may run code other than the pure expressions above."""
    hit = []

    class V(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            if isinstance(n, (cst.Call, cst.Subscript, cst.Await, cst.Yield, cst.NamedExpr, cst.FormattedString,
                              cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
                hit.append(n)
            return not hit

    node.visit(V())
    return bool(hit)


@dataclass(frozen=True)
class Free:
    """What a statement free to move binds and reads when it runs; `kind` says what it may commute
    with: an "import" with imports; a "code" statement (a definition, or an assignment of an
    effect-free value) with code and effects; an "effect" (its calls all go into the library) with
    code only."""

    kind: str
    binds: FrozenSet[str]
    reads: FrozenSet[str]
    # an assignment that reads a library object's attribute (`flag = torch.backends.cudnn.benchmark`):
    # a library call may change what it reads, so it does not pass an "effect"
    reads_library: bool = False
    definition: bool = False  # a `def` or `class` statement


def _bound_by_import(node) -> Optional[FrozenSet[str]]:
    if isinstance(node.names, cst.ImportStar):
        return None
    out = set()
    for alias in node.names:
        if alias.asname is not None:
            out.add(alias.asname.name.value)
        else:
            name = alias.name
            while isinstance(name, cst.Attribute):
                name = name.value
            out.add(name.value)
    return frozenset(out)


def _definition_time(node) -> List[cst.CSTNode]:
    """The parts of a `def` or `class` statement that run when it runs: default values and
    annotations; bases and keywords; a class body's statements (its methods' own definition time)."""
    if isinstance(node, cst.FunctionDef):
        params = node.params
        every = [*params.posonly_params, *params.params, *params.kwonly_params]
        every += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
        parts: List[cst.CSTNode] = [p.default for p in every if p.default is not None]
        parts += [p.annotation for p in every if p.annotation is not None]
        if node.returns is not None:
            parts.append(node.returns)
        return parts
    parts = [*node.bases, *node.keywords]
    for stmt in node.body.body:
        parts.extend(_definition_time(stmt) if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else [stmt])
    return parts


def _decorated(node) -> bool:
    """A decorator is a call made when the statement runs, of a method's too (`@property` as much
    as `@register`): such statements keep their place."""
    if node.decorators:
        return True
    if isinstance(node, cst.ClassDef):
        return any(_decorated(s) for s in node.body.body if isinstance(s, (cst.FunctionDef, cst.ClassDef)))
    return False


def free(stmt: cst.CSTNode, library: FrozenSet[str] = frozenset()) -> Optional[Free]:
    """How `stmt` may move, or None when it may not move at all. With `library` (the names that are
    imports or builtins), also a statement whose calls all go into the library (`dist.init_...()`,
    `print(x)`): kind "effect", which commutes with the definitions and assignments that neither read
    what it binds nor bind what it spells (a library function cannot see the script's globals)."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        if _decorated(stmt):
            return None
        parts = _definition_time(stmt)
        if any(_calls(p) for p in parts) or any(_has_scope_statement(p) for p in parts):
            return None
        reads: Set[str] = set()
        for p in parts:
            reads |= _reads(p)
        return Free("code", frozenset({stmt.name.value}), frozenset(reads), definition=True)
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Import):
        binds = _bound_by_import(small)
        return Free("import", binds, frozenset()) if binds else None
    if isinstance(small, cst.ImportFrom):
        module = small.module
        if small.relative or module is None:
            return None
        if isinstance(module, cst.Name) and module.value == "__future__":
            return None
        binds = _bound_by_import(small)
        return Free("import", binds, frozenset()) if binds else None
    if isinstance(small, cst.Assign):
        targets: Set[str] = set()
        for t in small.targets:
            names = _target_names(t.target)
            if names is None:
                return None
            targets |= names
        if not pure(small.value):
            return _library_effect(small, library) if library else None
        reads = frozenset(_reads(small.value))
        return Free("code", frozenset(targets), reads, reads_library=bool(reads & library))
    if isinstance(small, cst.AnnAssign) and small.value is not None and isinstance(small.target, cst.Name):
        if not pure(small.value) or _calls(small.annotation):
            return None
        reads = frozenset(_reads(small.value) | _reads(small.annotation))
        return Free("code", frozenset({small.target.value}), reads, reads_library=bool(reads & library))
    return _library_effect(small, library) if library else None


def _library_effect(small: cst.CSTNode, library: FrozenSet[str]) -> Optional[Free]:
    if isinstance(small, cst.Expr):
        targets: list = []
    elif isinstance(small, cst.Assign):
        targets = [t.target for t in small.targets]
    else:
        return None
    ok = []

    class V(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            if isinstance(n, cst.Call):
                root = n.func
                while isinstance(root, cst.Attribute):
                    root = root.value
                if not (isinstance(root, cst.Name) and root.value in library):
                    ok.append(False)
            elif isinstance(n, cst.BaseExpression) and not isinstance(n, _PURE + (cst.Call, cst.Subscript)):
                ok.append(False)  # a lambda, a comprehension, await, yield, walrus, f-string
            return not ok

    small.visit(V())
    if ok:
        return None
    binds = set()
    for t in targets:
        binds |= _reads(t)  # `a.b = ...` and `a[i] = ...` change `a`
    return Free("effect", frozenset(binds), frozenset(_reads(small)))


def _has_scope_statement(node: cst.CSTNode) -> bool:
    """`global`/`nonlocal` or an import in a class body: left where they are."""
    hit = []

    class V(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            if isinstance(n, (cst.Global, cst.Nonlocal, cst.Import, cst.ImportFrom, cst.Del)):
                hit.append(n)
            return not hit

    node.visit(V())
    return bool(hit)


def _target_names(target: cst.BaseExpression) -> Optional[Set[str]]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        out: Set[str] = set()
        for el in target.elements:
            if isinstance(el, cst.StarredElement):
                return None
            names = _target_names(el.value)
            if names is None:
                return None
            out |= names
        return out
    return None


def commute(a: Optional[Free], b: Optional[Free]) -> bool:
    """Whether two adjacent statements may run in either order with the same effect."""
    if a is None or b is None or {a.kind, b.kind} not in ({"import"}, {"code"}, {"code", "effect"}):
        return False
    if {a.kind, b.kind} == {"code", "effect"} and (a.reads_library or b.reads_library):
        return False
    return not (a.binds & b.binds) and not (a.binds & b.reads) and not (b.binds & a.reads)


# --- keyword runs ----------------------------------------------------------------------------------


def _keyword_runs(call: cst.Call, every: bool) -> List[List[int]]:
    """Indices of the maximal runs of keyword arguments (a `*args` or `**kw` ends one); of those
    whose values are all free of effects unless `every`."""
    if isinstance(call.func, cst.Name) and call.func.value == "dict":
        return []
    runs: List[List[int]] = []
    current: List[int] = []
    for i, arg in enumerate(call.args):
        if arg.keyword is not None and arg.star == "" and (every or pure(arg.value)):
            current.append(i)
            continue
        if len(current) > 1:
            runs.append(current)
        current = []
    if len(current) > 1:
        runs.append(current)
    return runs


def _permute(call: cst.Call, order, every: bool) -> cst.Call:
    args = list(call.args)
    for run in _keyword_runs(call, every):
        moved = order([call.args[i] for i in run])
        for i, src in zip(run, moved):
            # each position keeps its own comma and spacing; the keyword and its value move
            args[i] = call.args[i].with_changes(keyword=src.keyword, value=src.value, equal=src.equal)
    return call.with_changes(args=args)


# --- blocks ----------------------------------------------------------------------------------------


def _moves(stmt: cst.CSTNode, library: FrozenSet[str]) -> Optional[Free]:
    """What the transformation may move: what `free` says, but a bare library call stays where it is
    (`fire.Fire()` reads the definitions above it; `torch.manual_seed(0)` is left in place too)."""
    fact = free(stmt, library)
    if fact is not None and fact.kind == "effect" and not isinstance(stmt.body[0], cst.Assign):
        return None
    return fact


def _swaps(a: Optional[Free], b: Optional[Free]) -> bool:
    """The transformation's relation: `commute`, but a library call's assignment passes definitions
    only. Past an assignment it could cross a statement distify anchors its own code after
    (`hvd.DistributedOptimizer(..., named_parameters=model.named_parameters())` after the last binding
    it reads), and the normal form cannot show that such code commutes with it."""
    if not commute(a, b):
        return False
    return {a.kind, b.kind} != {"code", "effect"} or a.definition or b.definition


def _reverse_runs(body: Sequence[cst.CSTNode], library: FrozenSet[str]) -> list:
    """Reverse every maximal run of statements that commute pairwise, from the top: a run of four
    imports comes out last first, as does `class Net` ... `def main` when no definition-time code
    reads another's name."""
    out = list(body)
    facts = [_moves(s, library) for s in out]
    i = 0
    while i < len(out):
        j = i + 1
        while j < len(out) and all(_swaps(facts[k], facts[j]) for k in range(i, j)):
            j += 1
        if j - i > 1:
            # the blank lines and comments above a statement stay at their place in the block
            moved = out[i:j][::-1]
            out[i:j] = [m.with_changes(leading_lines=o.leading_lines) for m, o in zip(moved, out[i:j])]
        i = j
    return out


def _least_order(items: Sequence, facts: Sequence, commutes, key) -> list:
    """The lexicographically least order (by `key`) among those reached by swapping adjacent
    items that commute (`commutes(fact, fact)`; a None fact commutes with nothing): repeatedly take
    the least item that commutes with every item still before it."""
    left, facts = list(items), list(facts)
    keys: list = [None] * len(left)
    out = []
    while left:
        candidates = [0]
        for j in range(1, len(left)):
            if facts[j - 1] is None:
                break  # nothing after it may pass it
            if all(commutes(facts[i], facts[j]) for i in range(j)):
                candidates.append(j)
        best = candidates[0]
        if len(candidates) > 1:
            for j in candidates:
                if keys[j] is None:
                    keys[j] = key(left[j])
            best = min(candidates, key=lambda j: keys[j])
        out.append(left.pop(best))
        facts.pop(best)
        keys.pop(best)
    return out


class _Reorder(cst.CSTTransformer):
    def __init__(self, calls, blocks) -> None:
        self.calls = calls
        self.blocks = blocks

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        return self.calls(updated)

    def leave_Module(self, original, updated):
        return updated.with_changes(body=self.blocks(updated.body))

    def leave_IndentedBlock(self, original, updated):
        return updated.with_changes(body=self.blocks(updated.body))


def reorder(source: str) -> str:
    """`source` with what is free to move moved (see the module's docstring)."""
    module = cst.parse_module(source)
    library = _library(module, source)
    t = _Reorder(lambda call: _permute(call, lambda args: args[::-1], every=False),
                 lambda body: _reverse_runs(body, library))
    return module.visit(t).code


_EMPTY = cst.Module(body=[])
# builtins that read or write the caller's namespace: a call to one is no library call
_INTROSPECTION = frozenset({"eval", "exec", "globals", "locals", "vars", "dir", "__import__", "breakpoint"})


def _library(module: cst.Module, source: str) -> FrozenSet[str]:
    """Names that, wherever the script spells them, are imports or builtins: bound by import
    statements only, or never bound at all (`module` is `source` parsed)."""
    imported: Set[str] = set()
    other: Set[str] = set()

    class V(cst.CSTVisitor):
        def visit_Import(self, n) -> None:
            imported.update(_bound_by_import(n) or ())

        def visit_ImportFrom(self, n) -> None:
            imported.update(_bound_by_import(n) or ())

        def visit_Name(self, n) -> None:
            other.add(n.value)

    module.visit(V())
    bound_elsewhere = _bound_names(source)
    never_bound = (set(dir(builtins)) & other) - bound_elsewhere - imported - _INTROSPECTION
    return frozenset((imported - bound_elsewhere) | never_bound)


def _bound_names(source: str) -> Set[str]:
    """Names bound by anything but an import: assignments, loops, `with`, `def`, `class`, params,
    `except ... as`, walrus and `match` captures, in any scope, as Python's own compiler sees them
    (symtable: a binding other than an import is a DEF_LOCAL or a parameter; an import is DEF_IMPORT
    only). libcst's scope metadata said the same, match captures aside, at ~50x the cost: it was
    three quarters of the reorder sweep's time (tests/test_reordering.py holds the two to agree)."""
    out: Set[str] = set()
    tables = [symtable.symtable(source, "<reordering>", "exec")]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        out.update(s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_parameter())
    return out


def normal_form(source: str, known: Set[str]) -> str:
    """`source` in the normal form of the reordering (see the module's docstring)."""
    module = cst.parse_module(source)
    library = _library(module, source)

    def key(stmt: cst.CSTNode) -> str:
        code = ast.unparse(ast.parse(_EMPTY.code_for_node(stmt.with_changes(leading_lines=()))))
        words = []
        for t in tokenize.generate_tokens(io.StringIO(code).readline):
            masked = t.type == tokenize.NAME and t.string not in known and not keyword.iskeyword(t.string)
            words.append("_" if masked else t.string)
        return " ".join(words)

    def calls(call: cst.Call) -> cst.Call:
        # two keyword arguments commute when one of them has no effect: distify putting a call in
        # place of a value (`lr=args.lr * hvd.size()`) keeps the order it found
        def order(args):
            return _least_order(args, [pure(a.value) for a in args], lambda a, b: a or b, lambda a: a.keyword.value)

        return _permute(call, order, every=True)

    def blocks(body):
        return _least_order(body, [free(s, library) for s in body], commute, key)

    return module.visit(_Reorder(calls, blocks)).code
