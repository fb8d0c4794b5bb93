"""Small facts about syntax that every other fact uses: the dotted text of a name, a call's argument,
whether one node holds another, every node under a node, and the names a statement binds or reads
in its header (part of the fact layer, see facts.py).
"""

from __future__ import annotations

import functools
from typing import Iterator, List, Optional, Tuple, Union

import libcst as cst

from distify.walk import children, preorder, walk


Scope = Union[cst.Module, cst.FunctionDef]

# A fact of a subtree alone, kept per node object: libcst nodes are immutable, and the rewrite leaves
# every subtree it does not edit as the same object in its output (ApplyEdits enters only the paths to
# an edit), so the audit's analysis of the output meets most of the input's functions and statements
# again. The cache holds its nodes (an id is never reused while cached) and is bounded.
by_node = functools.lru_cache(maxsize=8192)


# The hottest facts test a node's type by identity, not ``isinstance``: libcst's node classes are
# ABCs, and every ``isinstance`` of a node that is not of the class asked runs ABCMeta's check (a
# Python-level call), a tenth of the engine's time before. libcst's concrete node classes have no
# subclasses (tests/test_walk.py checks the ones tested here), so identity answers the same.
_NAME, _ATTRIBUTE = cst.Name, cst.Attribute


def dotted(expr: Optional[cst.CSTNode]) -> Optional[str]:
    """'a.b.c' for Name/Attribute chains, else None."""
    t = type(expr)
    if t is _NAME:
        return expr.value
    if t is _ATTRIBUTE:
        base = dotted(expr.value)
        return f"{base}.{expr.attr.value}" if base else None
    return None


def held_name(expr: Optional[cst.CSTNode]) -> Optional[str]:
    """`dotted(expr)`, and for a method called with no argument on a dotted receiver its dotted
    name with ``()`` (``trainer.get_model()``): how the reach facts (distify.instance_reach) name
    what a getter returns, read in place rather than bound to a name first."""
    if type(expr) is cst.Call and not expr.args and type(expr.func) is _ATTRIBUTE:
        base = dotted(expr.func)
        return f"{base}()" if base else None
    return dotted(expr)


def arg(call: cst.Call, pos: Optional[int], kw: Optional[str]) -> Optional[cst.Arg]:
    if kw is not None:
        for a in call.args:
            if a.keyword is not None and a.keyword.value == kw:
                return a
    if pos is not None:
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if len(positional) > pos:
            return positional[pos]
    return None


def call_statement(stmt: cst.CSTNode, call: cst.Call) -> bool:
    """True when `stmt` is exactly the expression statement `call`."""
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and stmt.body[0].value is call
    )


def sole_statement(stmt: Optional[cst.CSTNode]) -> Optional[cst.BaseSmallStatement]:
    """The one small statement a line holds (`x = f()`), None for a line of several (`a = 1; b = 2`)
    or anything that is not a simple statement line."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        return stmt.body[0]
    return None


def contains_node(tree: cst.CSTNode, target: cst.CSTNode) -> bool:
    found = []

    class V(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            if found:
                return False
            if n is target:
                found.append(n)
                return False
            return True

    walk(tree, V())
    return bool(found)


def path_to(tree: cst.CSTNode, target: cst.CSTNode) -> Optional[Tuple[cst.CSTNode, ...]]:
    """The nodes from `tree` down to `target`, both included (None when `target` is not below it):
    the expression context a node sits in (an argument of a call, an element of a list, a lambda's
    body, one arm of a conditional)."""
    if tree is target:
        return (tree,)
    for child in tree.children:
        below = path_to(child, target)
        if below is not None:
            return (tree, *below)
    return None


# ------------------------------------------------------------------------------ name walking


def all_nodes(node: cst.CSTNode, skip_nested: bool = False) -> Iterator[cst.CSTNode]:
    """`node` and everything below it but syntactic trivia, in source order (not below nested
    defs/lambdas/classes with skip_nested). Uses the fast read-only walk, once per node object (see
    ``by_node``)."""
    return iter(_all_nodes(node, skip_nested))


@by_node
def _all_nodes(node: cst.CSTNode, skip_nested: bool) -> Tuple[cst.CSTNode, ...]:
    flat, start, end = _span(node)
    if not skip_nested:
        return flat[start:end]
    out: List[cst.CSTNode] = [node]
    i = start + 1
    while i < end:  # `node`'s preorder, jumping over what lies below a nested scope
        n = flat[i]
        out.append(n)
        if type(n) in NESTED:  # by its subtree's size: a node shared by two trees may be indexed in the other
            _, a, b = _SPANS[n]
            i += b - a
        else:
            i += 1
    return tuple(out)


# The preorder of a subtree is a slice of the preorder of any tree above it: one read of a function
# answers ``all_nodes`` for every statement and expression in it, which the facts then ask one by
# one. node -> (the preorder it lies in, its first index, the index after its subtree); the entries
# hold their nodes (an id is never reused while indexed), and the index is dropped whole when large.
_SPANS: dict = {}
_SPANS_MAX = 1 << 16


def _span(node: cst.CSTNode) -> Tuple[Tuple[cst.CSTNode, ...], int, int]:
    hit = _SPANS.get(node)
    if hit is not None:
        return hit
    order: List[cst.CSTNode] = []
    starts: List[int] = []
    done: List[Tuple[cst.CSTNode, int, int]] = []
    stack: List[Optional[cst.CSTNode]] = [node]
    while stack:  # preorder (as distify.walk.preorder), with each node's end, without recursion
        n = stack.pop()
        if n is None:  # the end of the subtree last opened
            opened = starts.pop()
            done.append((order[opened], opened, len(order)))
            continue
        starts.append(len(order))
        order.append(n)
        stack.append(None)
        below = children(n)
        below.reverse()
        stack += below
    flat = tuple(order)
    if len(_SPANS) + len(done) > _SPANS_MAX:
        _SPANS.clear()
    for n, i, j in done:
        _SPANS[n] = (flat, i, j)
    return _SPANS[node]


NESTED = frozenset({cst.FunctionDef, cst.Lambda, cst.ClassDef})  # the nodes that open a scope


def names(node: cst.CSTNode, how: str = "load") -> Iterator[Tuple[cst.Name, str]]:
    """Every variable name in `node` with how it is used: load, store, or aug (`x += ...`)."""
    t = type(node)
    if t is _NAME:
        yield node, how
    elif t is _ATTRIBUTE:
        yield from names(node.value)
    elif t is cst.Subscript:
        yield from names(node.value)
        for el in node.slice:
            yield from names(el)
    elif (t is cst.Tuple or t is cst.List) and how == "store":
        for el in node.elements:
            yield from names(el.value, how)
    elif t is cst.StarredElement and how == "store":
        yield from names(node.value, how)
    elif t is cst.Assign:
        yield from names(node.value)
        for target in node.targets:
            yield from names(target.target, "store")
    elif t is cst.AugAssign:
        yield from names(node.value)
        yield from names(node.target, "aug" if type(node.target) is _NAME else "load")
    elif t is cst.AnnAssign:
        if node.value is not None:
            yield from names(node.value)
        yield from names(node.target, "store")
    elif t is cst.For or t is cst.CompFor:
        yield from names(node.iter)
        yield from names(node.target, "store")
        for c in children(node):
            if c is not node.iter and c is not node.target:
                yield from names(c)
    elif t is cst.WithItem:
        yield from names(node.item)
        if node.asname is not None:
            yield from names(node.asname.name, "store")
    elif t is cst.NamedExpr:
        yield from names(node.value)
        yield from names(node.target, "store")
    elif t is cst.Del:
        yield from names(node.target, "store")
    elif t is cst.Arg:
        yield from names(node.value)
    elif t is cst.Param:
        if node.default is not None:
            yield from names(node.default)
    elif t is cst.FunctionDef or t is cst.ClassDef:
        for d in node.decorators:
            yield from names(d)
        yield from names(node.body)
    elif t in _NO_NAMES:
        return
    else:
        for c in children(node):
            yield from names(c)


_NO_NAMES = frozenset({cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal})  # bind, but not as variables here
# the classes tested by identity above and in the facts' loops over all_nodes (facts, model_state,
# model_refs, rank_flow, split_draws, obtained, dataflow; tests/test_walk.py: none has a subclass)
EXACT = (cst.Name, cst.Attribute, cst.Subscript, cst.Tuple, cst.List, cst.StarredElement, cst.Assign, cst.AugAssign,
         cst.AnnAssign, cst.For, cst.CompFor, cst.WithItem, cst.NamedExpr, cst.Del, cst.Arg, cst.Param, cst.FunctionDef,
         cst.ClassDef, cst.Lambda, cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal, cst.Call, cst.Return, cst.Expr,
         cst.SimpleStatementLine)


def header_names(stmt: cst.CSTNode) -> List[Tuple[cst.Name, str]]:
    """Names a statement itself reads and binds, in order (not those of nested statements)."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return list(names(stmt))
    if isinstance(stmt, cst.For):
        return list(names(stmt.iter)) + list(names(stmt.target, "store"))
    if isinstance(stmt, (cst.If, cst.While)):
        return list(names(stmt.test))
    if isinstance(stmt, cst.With):
        out: List[Tuple[cst.Name, str]] = []
        for item in stmt.items:
            out += list(names(item))
        return out
    return []


def _number(e: cst.BaseExpression) -> bool:
    return isinstance(e, (cst.Integer, cst.Float))


def flatten_target(t: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    """The names, attributes and subscripts an assignment target binds (`a, (b, *c)`: a, b, c)."""
    if isinstance(t, (cst.Tuple, cst.List)):
        for el in t.elements:
            yield from flatten_target(el.value)
    elif isinstance(t, cst.StarredElement):
        yield from flatten_target(t.value)
    else:
        yield t
