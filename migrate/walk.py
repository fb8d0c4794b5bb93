"""A read-only walk over a libcst tree, several times cheaper than ``node.visit(visitor)``.

libcst's ``visit`` rebuilds every node it passes through (even for a read-only ``CSTVisitor``: each
``_visit_and_replace_children`` constructs and validates a new node) and descends into every
whitespace, comment, parenthesis, comma and operator token. A full visit therefore costs about as
much as parsing the file again.

``walk(node, visitor)`` calls the hooks of a ``cst.CSTVisitor`` (``on_visit`` / ``visit_<Type>``,
``on_visit_attribute`` / ``visit_<Type>_<attribute>``, their ``leave`` counterparts) on the same,
original nodes and in the same order as ``node.visit(visitor)``, but

* rebuilds nothing (it reads the nodes' fields in the order libcst's own visit uses, recorded
  once per node type from ``_visit_and_replace_children``), and
* skips syntactic trivia (whitespace, comments, newlines, parentheses, brackets, commas, colons,
  operators: nodes that can only contain more trivia), unless the visitor class defines a
  ``visit_``/``leave_`` hook for one of those types, in which case everything is walked. Fields
  whose libcst annotation admits nothing but trivia or plain data are not even read (a ``Name``
  has none left to read).

The test suite (tests/test_walk.py) checks the hook sequence against ``node.visit`` on every fixture.

So it is a drop-in for visitors that look at statements and expressions; a visitor whose own
``on_visit`` override inspects trivia nodes must keep using ``node.visit``.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Callable, Dict, FrozenSet, Iterator, List, Optional, Tuple

import libcst as cst

_TRIVIA_NAMES = (
    # whitespace and comments
    "SimpleWhitespace", "ParenthesizedWhitespace", "TrailingWhitespace", "EmptyLine", "Comment", "Newline",
    # punctuation
    "Comma", "Dot", "Colon", "Semicolon", "AssignEqual", "ImportStar", "Asynchronous",
    "LeftParen", "RightParen", "LeftSquareBracket", "RightSquareBracket", "LeftCurlyBrace", "RightCurlyBrace",
    # operators
    "Plus", "Minus", "BitInvert", "Not", "And", "Or",
    "Add", "Subtract", "Multiply", "Divide", "FloorDivide", "Modulo", "Power", "LeftShift", "RightShift",
    "BitOr", "BitAnd", "BitXor", "MatrixMultiply",
    "LessThan", "GreaterThan", "Equal", "LessThanEqual", "GreaterThanEqual", "NotEqual", "In", "NotIn",
    "Is", "IsNot",
    "AddAssign", "SubtractAssign", "MultiplyAssign", "MatrixMultiplyAssign", "DivideAssign", "ModuloAssign",
    "BitAndAssign", "BitOrAssign", "BitXorAssign", "LeftShiftAssign", "RightShiftAssign", "PowerAssign",
    "FloorDivideAssign",
)
TRIVIA: FrozenSet[type] = frozenset(t for t in (getattr(cst, n, None) for n in _TRIVIA_NAMES) if t is not None)

_TRIVIA_BASES = tuple(
    t for t in (getattr(cst, n, None) for n in (
        "BaseParenthesizableWhitespace", "BaseUnaryOp", "BaseBooleanOp", "BaseBinaryOp", "BaseCompOp", "BaseAugOp",
    )) if t is not None
)


class _Recorder(cst.CSTVisitor):
    """Notes the attribute names a node's ``_visit_and_replace_children`` visits, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.names: List[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        pass

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if attribute not in self.names:
            self.names.append(attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass


def _may_hold_code(annotation) -> bool:
    """False when a field's annotation admits only trivia or plain data (str, bool, sentinels).

    Class tests read the MRO: ``issubclass`` against libcst's node bases (ABCs with hundreds of
    subclasses) searches every subclass for a class that is not one, and the first walk of a process
    asked that for each field of each node type (several ms of a cold one-file run)."""
    if annotation is None or annotation is type(None):
        return False
    origin = typing.get_origin(annotation)
    if origin is typing.Literal or origin is typing.ClassVar:
        return False
    if origin is not None:  # Union / Optional / Sequence[...]
        return any(_may_hold_code(a) for a in typing.get_args(annotation))
    if not isinstance(annotation, type):
        return True  # a forward reference or something unforeseen: walk it
    mro = annotation.__mro__
    if cst.CSTNode not in mro:
        return False
    return not (annotation in TRIVIA or any(base in mro for base in _TRIVIA_BASES))


class _Fields:
    """A node type's fields as the walk reads them. This module's two records are plain classes:
    the dataclass machinery costs ~0.7 ms a class at every start-up, as much as the rest of it."""

    __slots__ = ("every", "names", "code")

    def __init__(self, every: Tuple[Tuple[str, bool], ...], code: Tuple[str, ...]) -> None:
        self.every = every  # (name, visited by libcst even when unset) in libcst's order
        self.names = tuple(n for n, _ in every)  # the names of `every`
        self.code = code  # those that can hold anything but trivia


_FIELDS: Dict[type, _Fields] = {}


def _fields(node: cst.CSTNode) -> _Fields:
    t = type(node)
    rec = _Recorder()
    node._visit_and_replace_children(rec)  # children are not entered: only this node is rebuilt
    # fields a conditional visit skipped on this instance (FormattedStringExpression.format_spec
    # when it is None) come last, where libcst visits them, and get hooks only when set
    every = tuple((n, True) for n in rec.names) + tuple(
        (f.name, False) for f in dataclasses.fields(t) if f.name not in rec.names
    )
    # the fields' annotations as the dataclass holds them: libcst's are objects, not strings (a
    # forward reference left in one, such as ``Optional["CompFor"]``, is walked); resolving them
    # with typing.get_type_hints cost more than the rest of this function
    hints = {f.name: f.type for f in dataclasses.fields(t)}
    code = tuple(n for n, _ in every if n not in hints or _may_hold_code(hints[n]))
    info = _Fields(every, code)
    _FIELDS[t] = info
    return info


_NODE, _SEQUENCE, _DATA = 1, 2, 0
_KIND: Dict[type, int] = {tuple: _SEQUENCE, list: _SEQUENCE, type(None): _DATA, str: _DATA}


def _kind(t: type) -> int:
    k = _SEQUENCE if issubclass(t, (tuple, list)) else _NODE if cst.CSTNode in t.__mro__ else _DATA
    _KIND[t] = k
    return k


class _Plan:
    """Per visitor class: which hooks it has, looked up once per node type."""

    __slots__ = ("generic_visit", "generic_attr", "skip", "attr_types", "visit", "leave", "local")

    def __init__(self, generic_visit: bool, generic_attr: bool, skip: FrozenSet[type], attr_types: FrozenSet[str],
                 local: bool = False) -> None:
        self.generic_visit = generic_visit  # on_visit / on_leave are CSTVisitor's: dispatch by name, cached here
        self.generic_attr = generic_attr  # on_visit_attribute / on_leave_attribute are CSTVisitor's
        self.skip = skip  # node types not walked
        self.attr_types = attr_types  # node type names with a visit_<Type>_<attribute> / leave_ hook
        self.visit: Dict[type, Optional[Callable]] = {}
        self.leave: Dict[type, Optional[Callable]] = {}
        self.local = local  # a class made per call: `visit`/`leave` hold hook names, not functions


# a class made per call (a visitor defined in a function) has the hooks of its class statement:
# its plan is kept by the code of its first method (one class statement, one code object)
_LOCAL_PLANS: Dict[tuple, _Plan] = {}


def _local_key(cls: type) -> Optional[tuple]:
    for v in vars(cls).values():
        code = getattr(v, "__code__", None)
        if code is not None:
            return (cls.__qualname__, code, cls.__bases__)
    return None


_PLANS: Dict[type, _Plan] = {}
_LIBCST_BASES = frozenset(cst.CSTVisitor.__mro__)


def _own_hooks(cls: type) -> List[str]:
    """visit_/leave_ names defined by the visitor's own classes (libcst's bases define a no-op stub
    for every node type and attribute)."""
    out: List[str] = []
    for k in cls.__mro__:
        if k not in _LIBCST_BASES:
            out += [n for n in vars(k) if n.startswith(("visit_", "leave_")) and n not in out]
    return out


def _hook(cls: type, name: str) -> Optional[Callable]:
    """The visitor's own hook `name`, or None where only libcst's no-op stub exists."""
    for k in cls.__mro__:
        if name in vars(k):
            if k in _LIBCST_BASES:
                return None
            fn = vars(k)[name]
            return fn if inspect.isfunction(fn) else (lambda visitor, node: getattr(visitor, name)(node))
    return None


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is not None:
        return plan
    local = "<locals>" in cls.__qualname__
    key = _local_key(cls) if local else None
    if key is not None and key in _LOCAL_PLANS:
        return _LOCAL_PLANS[key]
    hooks = [n.split("_", 1)[1] for n in _own_hooks(cls)]
    hooked_types = {h.split("_", 1)[0] for h in hooks}
    plan = _Plan(
        generic_visit=cls.on_visit is cst.CSTVisitor.on_visit and cls.on_leave is cst.CSTVisitor.on_leave,
        generic_attr=cls.on_visit_attribute is cst.CSTVisitor.on_visit_attribute
        and cls.on_leave_attribute is cst.CSTVisitor.on_leave_attribute,
        skip=frozenset() if any(t.__name__ in hooked_types for t in TRIVIA) else TRIVIA,
        attr_types=frozenset(h.split("_", 1)[0] for h in hooks if "_" in h),
        local=local,
    )
    if not local:
        _PLANS[cls] = plan
    elif key is not None and not any("<locals>" in b.__qualname__ for b in cls.__bases__):
        _LOCAL_PLANS[key] = plan  # not by class: a class made per call would pile up
    return plan


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """``node.visit(visitor)`` for a read-only visitor, without rebuilding the tree (see above)."""
    cls = type(visitor)
    plan = _plan(cls)
    skip = plan.skip
    fields_of = _FIELDS
    kind_of = _KIND
    visit_fns = plan.visit
    leave_fns = plan.leave
    generic_visit = plan.generic_visit
    generic_attr = plan.generic_attr
    attr_types = plan.attr_types
    walk_trivia = not skip

    if plan.local:  # the plan keeps hook names; the functions are this class's own
        names_visit, names_leave = visit_fns, leave_fns
        visit_fns, leave_fns = {}, {}

    def lookup(table: dict, prefix: str, t: type):
        if not plan.local:
            fn = table[t] = _hook(cls, f"{prefix}_{t.__name__}")
            return fn
        names = names_visit if prefix == "visit" else names_leave
        if t in names:
            name = names[t]
        else:
            name = f"{prefix}_{t.__name__}"
            names[t] = name = name if _hook(cls, name) is not None else None
        fn = table[t] = None if name is None else _hook(cls, name)
        return fn

    def child(value) -> None:
        tv = type(value)
        if tv is tuple:
            for c in value:
                if type(c) not in skip:
                    go(c)
            return
        k = kind_of.get(tv)
        if k is None:
            k = _kind(tv)
        if k == _NODE:
            if tv not in skip:
                go(value)
        elif k == _SEQUENCE:
            for c in value:
                if type(c) not in skip:
                    go(c)

    def go(node: cst.CSTNode) -> None:
        t = type(node)
        if generic_visit:
            fn = visit_fns[t] if t in visit_fns else lookup(visit_fns, "visit", t)
            descend = fn is None or fn(visitor, node) is not False
        else:
            descend = visitor.on_visit(node)
        if descend:
            info = fields_of.get(t) or _fields(node)
            tname = t.__name__
            if generic_attr and tname not in attr_types:
                for name in (info.names if walk_trivia else info.code):
                    child(getattr(node, name))
            else:  # attribute hooks to call, exactly where libcst calls them
                for name, always in info.every:
                    value = getattr(node, name)
                    k = kind_of.get(type(value))
                    if not always and not (_kind(type(value)) if k is None else k):
                        continue
                    if generic_attr:
                        fn = getattr(visitor, f"visit_{tname}_{name}", None)
                        if fn is not None:
                            fn(node)
                    else:
                        visitor.on_visit_attribute(node, name)
                    child(value)
                    if generic_attr:
                        fn = getattr(visitor, f"leave_{tname}_{name}", None)
                        if fn is not None:
                            fn(node)
                    else:
                        visitor.on_leave_attribute(node, name)
        if generic_visit:
            fn = leave_fns[t] if t in leave_fns else lookup(leave_fns, "leave", t)
            if fn is not None:
                fn(visitor, node)
        else:
            visitor.on_leave(node)

    go(node)


def children(node: cst.CSTNode) -> List[cst.CSTNode]:
    """``node.children`` without syntactic trivia (see TRIVIA), in the same order, read from the
    node's fields. libcst's property rebuilds the node through ``_visit_and_replace_children`` on
    every call; this reads the fields ``walk`` reads. For a search that trivia cannot answer (names,
    expressions, statements: trivia holds none of them) it is a drop-in (tests/test_walk.py compares
    the two on every fixture)."""
    info = _FIELDS.get(type(node)) or _fields(node)
    out: List[cst.CSTNode] = []
    for name in info.code:
        value = getattr(node, name)
        tv = type(value)
        k = _KIND.get(tv)
        if k is None:
            k = _kind(tv)
        if k == _NODE:
            if tv not in TRIVIA:
                out.append(value)
        elif k == _SEQUENCE:
            out += [c for c in value if type(c) not in TRIVIA]
    return out


def preorder(node: cst.CSTNode, prune: Optional[Callable[[cst.CSTNode], bool]] = None) -> Iterator[cst.CSTNode]:
    """`node` and every node below it but trivia, in the order ``walk`` visits them, lazily (a search
    that stops early reads no further); below a node for which ``prune`` is true, nothing."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if prune is None or not prune(n):
            below = children(n)
            below.reverse()
            stack += below
