"""Which methods of a model run its forward computation: FSDP all-gathers a sharded module's
parameters only around ``forward``, so any other method that computes with them must be registered
(``register_fsdp_forward_method``), and a method that only reads or writes state must not be (a
registered method is a collective: it cannot run on rank 0 alone).

A method of a class of the script is judged by what it does, never by its name: it runs the module
when it calls the module itself (``self(x)``, ``self.forward(x)``, ``super().forward(x)``), a
submodule or an attribute's method (``self.dec(z)``, ``self.decoder.generate(ids)``; nn.Module's own
API excepted: ``self.state_dict()``), reads an attribute of a submodule (``self.head.weight``), or
reads a parameter of its own (``self.w`` bound to ``nn.Parameter(...)``), or calls another of its
class's methods that does. A method the script's classes do not define belongs
to another library's class: the library table says which of those are housekeeping
(``distify.library.MODEL_HOUSEKEEPING``)."""

from __future__ import annotations

from typing import Dict, Optional, Set

import libcst as cst

from distify.library import MODEL_HOUSEKEEPING, MODULE_METHODS, NO_GRAD
from distify.syntax import all_nodes, dotted

PARAMETER = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})


def class_method(classes: Dict[str, cst.ClassDef], cls: cst.ClassDef, name: str, depth: int = 0) -> Optional[cst.FunctionDef]:
    """The definition of method `name` in `cls` or its bases of this file (method resolution order
    as far as this file tells), None when no class of the file defines it."""
    for s in cls.body.body:
        if isinstance(s, cst.FunctionDef) and s.name.value == name:
            return s
    for base in cls.bases:
        base_cls = classes.get(dotted(base.value) or "")
        if base_cls is not None and depth < 8:
            found = class_method(classes, base_cls, name, depth + 1)
            if found is not None:
                return found
    return None


def runs_forward(classes: Dict[str, cst.ClassDef], qualname, cls: Optional[cst.ClassDef], name: str,
                 foreign: bool, _seen: Optional[Set[int]] = None) -> bool:
    """Whether calling method `name` on a model of class `cls` (None: a class of another module;
    `foreign`: some base of `cls` is another module's class) runs the model's computation."""
    if name == "forward" or name in MODULE_METHODS:
        return name == "forward"
    fn = class_method(classes, cls, name) if cls is not None else None
    if fn is None:
        return foreign and not name.startswith(MODEL_HOUSEKEEPING)
    seen = _seen if _seen is not None else set()
    if id(fn) in seen:
        return False
    seen.add(id(fn))
    params = fn.params.params
    if not params or any(_decorator(d) in ("staticmethod", "classmethod") for d in fn.decorators):
        return False
    me = params[0].name.value
    calls = {id(n.func): n for n in all_nodes(fn.body) if isinstance(n, cst.Call)}
    own = own_parameters(classes, qualname, cls)
    for node in all_nodes(fn.body):
        if isinstance(node, cst.Attribute) and _is(node.value, me) and node.attr.value in own:
            return True  # self.w, an nn.Parameter of the model itself
        if isinstance(node, cst.Call):
            f = node.func
            if isinstance(f, cst.Name) and f.value == me:
                return True  # self(x)
            if isinstance(f, cst.Attribute) and _is_super(f.value) and f.attr.value == "forward":
                return True
            if isinstance(f, cst.Attribute) and _is(f.value, me):
                attr = f.attr.value  # self.x(...): a method of the class, nn.Module's API, or a submodule
                if class_method(classes, cls, attr) is not None:
                    if runs_forward(classes, qualname, cls, attr, foreign, seen):
                        return True
                elif attr not in MODULE_METHODS and not (foreign and attr.startswith(MODEL_HOUSEKEEPING)):
                    return True
        elif isinstance(node, cst.Attribute) and isinstance(node.value, cst.Attribute) and _is(node.value.value, me):
            # self.sub.x: a submodule's method called, or its parameter read (self.head.weight)
            if node.attr.value in MODULE_METHODS and id(node) in calls:
                continue
            if class_method(classes, cls, node.value.attr.value) is None:
                return True
    return False


def runs_submodule(classes: Dict[str, cst.ClassDef], cls: Optional[cst.ClassDef], name: str) -> bool:
    """``model.<name>(...)`` calls a part the model keeps (``self.encoder = nn.Sequential(...)`` in a
    method of `cls`), not a method of the class: the submodule's own forward runs, not the model's
    (``runs_forward`` says False for it: there is no method to register)."""
    return cls is not None and class_method(classes, cls, name) is None and name in kept_attributes(classes, cls)


def _instance_bindings(classes: Dict[str, cst.ClassDef], cls: cst.ClassDef, depth: int = 0):
    """(attribute, value) for every ``<instance>.<attribute> = <value>`` (or annotated) in the methods
    of `cls` and its bases of this file, whatever each method calls its instance."""
    for fn in cls.body.body:
        if not isinstance(fn, cst.FunctionDef) or not fn.params.params:
            continue
        me = fn.params.params[0].name.value
        for node in all_nodes(fn.body):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else (
                [node.target] if isinstance(node, cst.AnnAssign) else [])
            for t in targets:
                if isinstance(t, cst.Attribute) and _is(t.value, me):
                    yield t.attr.value, node.value
    for base in cls.bases:
        base_cls = classes.get(dotted(base.value) or "")
        if base_cls is not None and depth < 8:
            yield from _instance_bindings(classes, base_cls, depth + 1)


def kept_attributes(classes: Dict[str, cst.ClassDef], cls: cst.ClassDef) -> Set[str]:
    """The attributes the methods of `cls` (and its bases of this file) bind on their instance
    (``self.encoder = nn.Sequential(...)``), whatever the value and the instance's name."""
    return {attr for attr, _value in _instance_bindings(classes, cls)}


def own_parameters(classes: Dict[str, cst.ClassDef], qualname, cls: cst.ClassDef) -> Set[str]:
    """The attributes the methods of `cls` (and its bases of this file) bind to ``nn.Parameter(...)``."""
    return {attr for attr, value in _instance_bindings(classes, cls)
            if isinstance(value, cst.Call) and qualname(value.func) in PARAMETER}


def _is(expr: cst.BaseExpression, name: str) -> bool:
    return isinstance(expr, cst.Name) and expr.value == name


def _is_super(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "super"


def _decorator(d: cst.Decorator) -> Optional[str]:
    return d.decorator.value if isinstance(d.decorator, cst.Name) else None



def takes_gradients(a, site) -> bool:
    """The call computes what a step differentiates: it runs on the training path (in a loop that
    trains, or in a function called from one), under no ``torch.no_grad()`` / ``inference_mode()``
    block or decorator, and its value reaches a ``.backward()`` of its scope or is returned to the
    caller (``loss = model.compute_loss(x); loss.backward()``). One called under no_grad, or whose
    value only feeds a metric (``model.generate(...)`` for a sample between epochs), only evaluates."""
    if not a.facts.on_training_path(site.stmt):
        return False
    for p in (*a.stmt_parent.get(site.stmt, ()), site.stmt):
        if isinstance(p, cst.With) and any(
            isinstance(i.item, cst.Call) and a.qualname(i.item.func) in NO_GRAD for i in p.items
        ):
            return False
    scope = site.scope
    if isinstance(scope, cst.FunctionDef):
        for d in scope.decorators:
            f = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
            if a.qualname(f) in NO_GRAD:
                return False
    return a.facts.reaches_backward(scope, site.stmt) or _returned(a, site)


def trains_inside(a, cls: Optional[cst.ClassDef], name: str) -> bool:
    """Method `name` of the model's class `cls` trains in its own body (a Keras-style
    ``model.fit(loader, optimizer, epochs)`` whose loop calls ``self(x)`` and steps): the model's
    computation and its backward both run inside the method, whatever the call's value is."""
    fn = class_method(a.classes, cls, name) if cls is not None else None
    return fn is not None and fn in a.facts.trainers


def _returned(a, site, depth: int = 0) -> bool:
    """The call's value leaves its function for a caller that differentiates it: a `return` holds the
    call or reads a name its statement binds (`loss = model.compute_loss(x)` ... `return loss`), and
    the statement of some call of that function reaches a `.backward()` (or returns it in turn)."""
    fn = site.scope
    if not isinstance(fn, cst.FunctionDef) or depth > 3:
        return False
    bound = {
        n.value for small in (site.stmt.body if isinstance(site.stmt, cst.SimpleStatementLine) else ())
        if isinstance(small, cst.Assign)
        for t in small.targets for n in all_nodes(t.target) if isinstance(n, cst.Name)
    }
    leaves = any(
        any(x is site.call or (isinstance(x, cst.Name) and x.value in bound) for x in all_nodes(n.value))
        for n in all_nodes(fn.body, skip_nested=True) if isinstance(n, cst.Return) and n.value is not None
    )
    return leaves and any(
        a.facts.reaches_backward(c.scope, c.stmt) or _returned(a, c, depth + 1) for c in a.facts.callers(fn)
    )
