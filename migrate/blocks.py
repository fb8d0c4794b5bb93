"""FSDP's unit of sharding: the repeated blocks of a model (a ModuleList or Sequential built by
repetition, or holding two or more instances of one class, also inside ModuleDicts and submodule
classes) that fully_shard wraps one by one before the root.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from distify.instance import instance_name, on

from distify.syntax import all_nodes, dotted
from distify.values import Value


# ------------------------------------------------------------------------------ submodule containers

CONTAINERS = frozenset({
    "torch.nn.ModuleList", "torch.nn.Sequential", "torch.nn.modules.container.ModuleList",
    "torch.nn.modules.container.Sequential",
})
MODULE_DICTS = frozenset({"torch.nn.ModuleDict", "torch.nn.modules.container.ModuleDict"})


class RepeatedBlocks(Value):
    """A ModuleList / Sequential attribute of a model class holding repeated blocks.

    ``path`` is the attribute path from the model (``blocks``, ``transformer.h``), ``owner`` the
    class whose ``__init__`` builds it, ``container`` its class as written (``nn.ModuleList``),
    ``member`` the block constructor as written (``Block``) and ``how`` either ``repetition``
    (``[Block(...) for _ in range(n)]``, ``*[...]``, ``.append`` in a ``for`` loop) or
    ``instances`` (two or more ``Block(...)`` of the same class of this file written out)."""

    __slots__ = ("path", "owner", "container", "member", "how")
    path: str
    owner: str
    container: str
    member: str
    how: str

    def __init__(self, path: str, owner: str, container: str, member: str, how: str) -> None:
        self._set(path, owner, container, member, how)


def repeated_blocks(cls: cst.ClassDef, classes: Dict[str, cst.ClassDef], qualname, depth: int = 0) -> List[RepeatedBlocks]:
    """The repeated-block containers a model class's ``__init__`` builds (``self.x = nn.ModuleList(
    [Block() for _ in range(n)])``, ``nn.Sequential(*[...])``, ``nn.ModuleDict(dict(h=...))``), also
    in submodules whose classes this file defines (``self.encoder = Encoder(...)`` -> ``encoder.layers``),
    in source order. `qualname` resolves a callee through the module's imports."""
    init = next(
        (s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None
    ) if isinstance(cls.body, cst.IndentedBlock) else None
    if init is None or depth > 3:
        return []
    code = cst.Module(body=[]).code_for_node
    out: List[RepeatedBlocks] = []
    seen: Set[str] = set()
    empty: Dict[str, str] = {}  # `self.layers = nn.ModuleList()`: attribute -> container as written

    def container_of(path: str, value: cst.BaseExpression) -> None:
        if not isinstance(value, cst.Call):
            return
        q = qualname(value.func)
        if q in MODULE_DICTS:
            for key, item in _dict_items(value):
                container_of(f"{path}.{key}", item)
            return
        if q in CONTAINERS:
            found = _repeated_members(value, classes)
            if found is not None:
                member, how = found
                if path not in seen:
                    seen.add(path)
                    out.append(RepeatedBlocks(path, cls.name.value, code(value.func), code(member), how))
            elif not value.args and q.endswith("ModuleList"):
                empty[path] = code(value.func)
            return
        name = dotted(value.func)
        if name in classes and classes[name] is not cls:
            for inner in repeated_blocks(classes[name], classes, qualname, depth + 1):
                out.append(RepeatedBlocks(f"{path}.{inner.path}", inner.owner, inner.container, inner.member, inner.how))

    me = instance_name(init)  # the instance, whatever __init__ calls it
    for node in all_nodes(init.body):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            attr = on(dotted(node.targets[0].target), me)
            if attr is not None and "." not in attr:
                container_of(attr, node.value)
        elif (
            isinstance(node, cst.For)
            and isinstance(node.iter, cst.Call)
            and dotted(node.iter.func) == "range"
        ):
            for call in all_nodes(node.body):
                if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
                    continue
                path = on(dotted(call.func.value), me)
                if call.func.attr.value == "append" and path in empty and len(call.args) == 1:
                    member = call.args[0].value
                    if isinstance(member, cst.Call) and path not in seen:
                        seen.add(path)
                        out.append(RepeatedBlocks(path, cls.name.value, empty[path], code(member.func), "repetition"))
    return out


def _dict_items(call: cst.Call) -> List[Tuple[str, cst.BaseExpression]]:
    """Constant keys and values of `nn.ModuleDict(dict(a=..., b=...))` / `nn.ModuleDict({"a": ...})`."""
    if len(call.args) != 1:
        return []
    inner = call.args[0].value
    if isinstance(inner, cst.Call) and dotted(inner.func) == "dict":
        return [(a.keyword.value, a.value) for a in inner.args if a.keyword is not None]
    out = []
    if isinstance(inner, cst.Dict):
        for el in inner.elements:
            if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString):
                key = el.key.evaluated_value
                if isinstance(key, str) and key.isidentifier():
                    out.append((key, el.value))
    return out


def _repeated_members(call: cst.Call, classes: Dict[str, cst.ClassDef]) -> Optional[Tuple[cst.BaseExpression, str]]:
    """(the block constructor, how) when a ModuleList / Sequential call holds repeated blocks."""
    args = [a for a in call.args if a.keyword is None]
    if len(args) == 1:
        value = args[0].value
        if isinstance(value, (cst.ListComp, cst.GeneratorExp)):
            elt = value.elt
            comp = value.for_in
            if (
                isinstance(elt, cst.Call)
                and comp.inner_for_in is None
                and isinstance(comp.iter, cst.Call)
                and dotted(comp.iter.func) == "range"
            ):
                return elt.func, "repetition"
            return None
        if isinstance(value, (cst.List, cst.Tuple)) and not args[0].star:
            return _same_instances([e.value for e in value.elements if not isinstance(e, cst.StarredElement)], classes)
    return _same_instances([a.value for a in args if not a.star], classes) if all(not a.star for a in args) else None


def _same_instances(values: List[cst.BaseExpression], classes: Dict[str, cst.ClassDef]) -> Optional[Tuple[cst.BaseExpression, str]]:
    if len(values) < 2 or not all(isinstance(v, cst.Call) for v in values):
        return None
    names = {dotted(v.func) for v in values}
    if len(names) == 1 and next(iter(names)) in classes:
        return values[0].func, "instances"
    return None
