"""The instance a method is called on, by what it is, not by how it is spelled.

The first positional parameter of a function defined directly in a class body is the instance the
method is called on (``self`` by convention only: ``this``, ``me``, ``trainer`` are the same), or
the class for a ``classmethod``; a ``staticmethod`` has none. A function nested in a method (a
closure, which a lambda is too) sees the same instance unless it binds the name itself, and a
method that rebinds the name (``self = other``) no longer holds the instance under it. A plain
function's parameter, a staticmethod's or a module-level variable spelled ``self`` is no instance.

Dotted names on the instance (``this.train_loader``) are keys across the methods of a class: the
method that binds an attribute and the one that reads it may spell the instance differently.
`canonical` gives the key every method shares (``INSTANCE.train_loader``, a spelling no script can
have), `spelled` the name a given method writes for it, so that code distify adds to a method says
what the user's own spelling of the instance there is.

The pure functions read one method's syntax (model classes read without an analysis); the anatomy's
``Facts.instance`` adds the scopes (closures) on top of them.
"""

from __future__ import annotations

from typing import Mapping, Optional, Tuple

import libcst as cst

from distify.syntax import all_nodes, by_node, dotted, names

INSTANCE = "<instance>"  # the root of a canonical key: no identifier is spelled like it

_BINDERS = (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.WithItem, cst.NamedExpr, cst.Del)


def method_kind(fn: cst.FunctionDef) -> str:
    """"static", "class" or "instance" for a function defined directly in a class body (by its
    decorator: the builtins ``staticmethod`` and ``classmethod``)."""
    for d in fn.decorators:
        name = dotted(d.decorator)
        if name in ("staticmethod", "builtins.staticmethod"):
            return "static"
        if name in ("classmethod", "builtins.classmethod"):
            return "class"
    return "instance"


def first_param(fn: cst.FunctionDef) -> Optional[str]:
    """The name of `fn`'s first positional parameter (positional-only ones count), None without one."""
    params = (*fn.params.posonly_params, *fn.params.params)
    return params[0].name.value if params else None


def binds(fn: cst.FunctionDef, name: str) -> bool:
    """`fn`'s own body (not a function nested in it) binds `name`: an assignment, a loop or ``with``
    target, a walrus, ``del``, an import, a nested def or class of that name, a global statement."""
    for n in all_nodes(fn.body, skip_nested=True):
        t = type(n)
        if t in _BINDERS:
            if any(x.value == name and how != "load" for target in _targets(n) for x, how in names(target, "store")):
                return True
        elif t is cst.FunctionDef or t is cst.ClassDef:
            if n.name.value == name:
                return True
        elif t is cst.Import or t is cst.ImportFrom:
            if not isinstance(n.names, cst.ImportStar):
                for alias in n.names:
                    bound = dotted(alias.asname.name) if alias.asname is not None else (dotted(alias.name) or "").split(".")[0]
                    if bound == name:
                        return True
        elif t is cst.Global or t is cst.Nonlocal:
            if any(item.name.value == name for item in n.names):
                return True
    return False


def _targets(n: cst.CSTNode):
    """The target expressions a binding node stores to."""
    t = type(n)
    if t is cst.Assign:
        return [x.target for x in n.targets]
    if t is cst.WithItem:
        return [n.asname.name] if n.asname is not None else []
    return [n.target]


@by_node
def receiver(fn: cst.FunctionDef, kind: str = "instance") -> Optional[str]:
    """The name under which the method `fn` (a function defined directly in a class body) holds its
    instance (`kind` "instance") or its class ("class", a classmethod): its first positional
    parameter, unless `fn` is another kind of method or rebinds that name. None otherwise."""
    if method_kind(fn) != kind:
        return None
    name = first_param(fn)
    if name is None or binds(fn, name):
        return None
    return name


def instance_name(fn: cst.FunctionDef) -> Optional[str]:
    """The instance parameter of the method `fn` (see `receiver`), whatever it is spelled."""
    return receiver(fn, "instance")


def instance_of(scope, methods: Mapping, stmt_scope: Mapping) -> Optional[Tuple[str, cst.ClassDef]]:
    """(name, class) when code in `scope` holds the instance of a method of `class` under `name`:
    `scope` is a method (in `methods`, method -> class) that is no static- or classmethod and does
    not rebind its instance parameter, or a function nested in one (`stmt_scope`: the scope a def
    sits in) that does not bind the name itself. None for a plain function or the module."""
    if type(scope) is not cst.FunctionDef:
        return None
    cls = methods.get(scope)
    if cls is not None:
        name = instance_name(scope)
        return (name, cls) if name is not None else None
    outer = instance_of(stmt_scope.get(scope), methods, stmt_scope)
    if outer is None:
        return None
    p = scope.params
    own = [*p.posonly_params, *p.params, *p.kwonly_params, *(x for x in (p.star_arg, p.star_kwarg) if isinstance(x, cst.Param))]
    if any(x.name.value == outer[0] for x in own) or binds(scope, outer[0]):
        return None
    return outer


def on(name: Optional[str], root: Optional[str]) -> Optional[str]:
    """The attribute path `name` reads on `root` (``a.b`` for ``root.a.b``), None when it reads none."""
    if name is None or root is None or not name.startswith(root) or name[len(root):len(root) + 1] != ".":
        return None
    return name[len(root) + 1:]


def is_attribute_of(node: cst.CSTNode, root: Optional[str]) -> bool:
    """`node` is ``<root>.<attr>`` (one attribute on the instance name `root`)."""
    return root is not None and isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == root
