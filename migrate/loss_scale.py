"""How a training loss grows with the batch: a mean over its samples, a sum over them, or neither.

DDP, FSDP and Horovod average the gradients of the ranks. For a loss that averages its batch
(``F.cross_entropy(out, y)``), the average of N ranks' gradients at B samples each is the single
process's gradient at N·B samples. For a loss that *sums* over its batch (``reduction="sum"``, the
VAE's ``torch.sum(...)`` KL term), each rank's gradient is a sum over its B samples, and the average
is 1/N of the single process's sum over N·B: the step the script was tuned for shrinks N times.

The kind of an expression is read from what its parts are, never from how they are spelled:

- ``elem``: a tensor that still has one entry per sample of the batch: a batch the loop draws, what a
  model or a layer returns for it, anything elementwise of those (``library.ELEMENTWISE_*``);
- ``sample``: a sum over the batch's samples: a loss of ``library.MEAN_LOSSES`` with
  ``reduction="sum"``, ``.sum()`` / ``torch.sum`` of an ``elem`` without a dim, a batch mean
  times the batch's size;
- ``mean``: an average over the samples: such a loss without another reduction, ``.mean()``, a sum
  divided by a count of the batch or by the loader's batch size;
- ``count``: the number of samples (``x.size(0)``, ``len(x)``);
- ``const``: what does not depend on the batch (literals, hyperparameters, a world size);
- ``mixed``: a sum and a mean added together; ``unknown``: anything else (a reduction along a
  dim, whose layout distify does not know, a library model's ``outputs.loss``, a sum divided by a
  hyperparameter that may or may not be the batch size).

Names are followed to their binding (through tuple unpacking of a model's or function's returns),
parameters to the arguments of every call, a call of the script's own function into its returns
and an attribute of the instance (``self.criterion``) to what the class assigns it. Only ``sample``
is acted on; a known sum inside ``mixed`` or ``unknown`` is reported (``has_sum``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Union

import libcst as cst

from distify.library import (
    ELEMENTWISE_FUNCTIONS, ELEMENTWISE_METHODS, GRAD_SCALERS, MEAN_LOSSES, MODULE_METHODS, PAIRWISE_FUNCTIONS, PAIRWISE_METHODS, TORCH_LAYER_PREFIX, WORLD_SIZE,
)
from distify.constructed import made_by
from distify.syntax import all_nodes, dotted, sole_statement

if TYPE_CHECKING:  # pragma: no cover
    from distify.anatomy import Anatomy

Scope = Union[cst.Module, cst.FunctionDef]

ELEM, SAMPLE, MEAN, COUNT, CONST, MIXED, UNKNOWN = "elem", "sample", "mean", "count", "const", "mixed", "unknown"
_DEPTH = 4  # functions followed into (callees, callers)
_SUMS = {"sum", "nansum"}
_MEANS = {"mean", "nanmean"}


class Kind(tuple):
    """(kind, has_sum, pairs): what an expression is, whether a known per-sample sum is part of it,
    and the first product that pairs the batch's samples with each other in it (``z @ z.T``)."""

    @property
    def kind(self) -> str:
        return self[0]

    @property
    def has_sum(self) -> bool:
        return self[1]

    @property
    def pairs(self) -> Optional[cst.CSTNode]:
        return self[2]


def _k(kind: str, *parts: Kind, sums: Optional[bool] = None, pairs: Optional[cst.CSTNode] = None) -> Kind:
    """A kind made of `parts`: it holds a known sum when one of them does (or `sums` says), and the
    first pairing product of theirs (or `pairs`)."""
    has = (kind == SAMPLE or any(p.has_sum for p in parts)) if sums is None else sums
    if pairs is None:
        pairs = next((p.pairs for p in parts if p.pairs is not None), None)
    return Kind((kind, has, pairs))


_UNKNOWN = _k(UNKNOWN)
_CONST = _k(CONST)
_ELEM = _k(ELEM)


def backward_loss(a: "Anatomy", call: cst.Call, scope: Scope) -> Optional[cst.BaseExpression]:
    """The tensor a backward call in `scope` runs from: `loss` in ``loss.backward()``,
    ``scaler.scale(loss).backward()`` (a GradScaler's scale only multiplies) and
    ``torch.autograd.backward(loss)``."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "backward" and a.qualname(func) is None:
        e = func.value
    elif a.qualname(func) == "torch.autograd.backward" and call.args:
        e = call.args[0].value
    else:
        return None
    if isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value == "scale" and len(e.args) == 1:
        if made_by(a.facts, scope, e.func.value, GRAD_SCALERS) is not None:
            return e.args[0].value
    return e


class LossScale:
    """Reads the kind of expressions of one analysed module (see the module's docstring)."""

    def __init__(self, a: "Anatomy") -> None:
        self.a = a
        self.facts = a.facts
        self._loops = {id(bl.loop) for bl in a.batch_loops}

    # -------------------------------------------------------------------------------- entry
    def kind(self, e: cst.BaseExpression, scope: Scope, at: cst.CSTNode) -> Kind:
        """The kind of `e`, read in `scope` at the statement `at`."""
        k = self._kind(e, scope, at, {}, 0)
        return _k(UNKNOWN, k) if k.kind == ELEM else k  # a backward needs one number: not per sample

    # -------------------------------------------------------------------------------- reading
    def _kind(self, e: cst.BaseExpression, scope: Scope, at: cst.CSTNode, env: Dict[str, Kind], depth: int) -> Kind:
        if isinstance(e, (cst.Integer, cst.Float)):
            return _CONST
        if isinstance(e, cst.UnaryOperation):
            return self._kind(e.expression, scope, at, env, depth)
        if isinstance(e, cst.BinaryOperation):
            return self._binary(e, scope, at, env, depth)
        if isinstance(e, cst.Name):
            return self._name(e.value, scope, at, env, depth)
        if isinstance(e, cst.Attribute):
            return self._attribute(e, scope, at, env, depth)
        if isinstance(e, cst.Subscript):
            return self._subscript(e, scope, at, env, depth)
        if isinstance(e, cst.Call):
            return self._call(e, scope, at, env, depth)
        if isinstance(e, (cst.List, cst.Tuple)):  # the batches `torch.cat([z1, z2])` joins
            return _elementwise([self._kind(el.value, scope, at, env, depth) for el in e.elements])
        if isinstance(e, cst.Comparison):  # `y != pad`: a mask, one entry per sample
            parts = [e.left, *(c.comparator for c in e.comparisons)]
            return _elementwise([self._kind(p, scope, at, env, depth) for p in parts])
        return _UNKNOWN

    def _generator(self, e: cst.BaseExpression, scope, at, env, depth) -> Kind:
        """``(p.pow(2).sum() for p in model.parameters())``: the kind of its items, when it iterates
        values that do not depend on the batch (a penalty over the parameters); unknown otherwise."""
        if not isinstance(e, (cst.GeneratorExp, cst.ListComp)):
            return _UNKNOWN
        inner = dict(env)
        f: Optional[cst.CompFor] = e.for_in
        while f is not None:
            if self._kind(f.iter, scope, at, inner, depth).kind != CONST or f.ifs:
                return _UNKNOWN
            for n in all_nodes(f.target):
                if isinstance(n, cst.Name):
                    inner[n.value] = _CONST
            f = f.inner_for_in
        return self._kind(e.elt, scope, at, inner, depth)

    def _binary(self, e: cst.BinaryOperation, scope, at, env, depth) -> Kind:
        left = self._kind(e.left, scope, at, env, depth)
        right = self._kind(e.right, scope, at, env, depth)
        parts = (left, right)
        l, r = left.kind, right.kind
        op = e.operator
        if isinstance(op, (cst.Add, cst.Subtract)):
            if l == CONST or r == CONST:
                return _k(r if l == CONST else l, *parts)
            if l == r and l != COUNT:
                return _k(l, *parts)
            if {l, r} <= {SAMPLE, MEAN, MIXED}:
                return _k(MIXED, *parts)
            return _k(UNKNOWN, *parts)
        if isinstance(op, cst.Multiply):
            if l == CONST or r == CONST:
                return _k(r if l == CONST else l, *parts)
            if {l, r} == {MEAN, COUNT}:
                return _k(SAMPLE, *parts)  # a batch mean times the batch size
            if l == r == ELEM:
                return _k(ELEM, *parts)
            return _k(UNKNOWN, *parts)
        if isinstance(op, (cst.Divide, cst.FloorDivide)):
            if r == CONST:
                if l == SAMPLE and not isinstance(e.right, (cst.Integer, cst.Float)):
                    return _k(MEAN, *parts, sums=False) if self._batch_size(e.right, scope) else _k(UNKNOWN, *parts)
                return _k(l, *parts)
            if l in (SAMPLE, COUNT) and r in (SAMPLE, COUNT):
                # a sum over a count of the same samples
                return _k(MEAN if l == SAMPLE else CONST, *parts, sums=False)
            if l == r == ELEM:
                return _k(ELEM, *parts)
            return _k(UNKNOWN, *parts)
        if isinstance(op, cst.Power) and r == CONST:
            return _k(l if l in (ELEM, CONST) else UNKNOWN, *parts)
        if isinstance(op, cst.MatrixMultiply) and l == r == ELEM:
            return _k(ELEM, *parts, pairs=e)  # row i of one batch against every row of the other
        return _k(UNKNOWN, *parts)

    def _batch_size(self, e: cst.BaseExpression, scope: Scope) -> bool:
        """`e` spells the batch size a loader of the script is built with (``args.batch_size``)."""
        text = dotted(e)
        if text is None:
            return False
        for ld in self.a.loaders:
            for x in ld.call.call.args:
                if x.keyword is not None and x.keyword.value == "batch_size" and dotted(x.value) == text:
                    return True
        return False

    # names --------------------------------------------------------------------------------
    def _name(self, name: str, scope: Scope, at: cst.CSTNode, env, depth) -> Kind:
        if name in env:
            return env[name]
        b = self.facts.reaching_binding(scope, name, at)
        if b is not None:
            return self._binding(name, b.stmt, scope, env, depth)
        if isinstance(scope, cst.FunctionDef):
            if name in self.facts.params(scope):
                return self._param(name, scope, depth)
            if self.facts.bindings(scope).get(name):
                return _UNKNOWN  # bound later in the function (a loop's earlier pass)
        if self.facts.bindings(self.a.module).get(name) or name not in self.facts.bindings(scope):
            return _CONST if not self._is_batch_name(name) else _UNKNOWN
        return _UNKNOWN

    def _is_batch_name(self, name: str) -> bool:
        """A module-level name a batch loop at module level binds (read from a function)."""
        for bl in self.a.batch_loops:
            if bl.scope is self.a.module and any(n.value == name for n in all_nodes(bl.loop.target) if isinstance(n, cst.Name)):
                return True
        return False

    def _binding(self, name: str, stmt: cst.CSTNode, scope: Scope, env, depth) -> Kind:
        if isinstance(stmt, cst.For):
            if id(stmt) in self._loops:
                return _CONST if _enumerate_index(stmt, name) else _ELEM
            if isinstance(stmt.iter, cst.Call) and self.a.qualname(stmt.iter.func) in ("range", "builtins.range"):
                return _CONST
            return _UNKNOWN
        small = sole_statement(stmt)
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
            return _UNKNOWN
        target = small.targets[0].target
        if isinstance(target, cst.Name):
            return self._kind(small.value, scope, stmt, env, depth)
        if isinstance(target, (cst.Tuple, cst.List)):
            slot = next((i for i, el in enumerate(target.elements) if isinstance(el.value, cst.Name) and el.value.value == name), None)
            if slot is None or any(isinstance(el, cst.StarredElement) for el in target.elements):
                return _UNKNOWN
            return self._slot(small.value, slot, scope, stmt, env, depth)
        return _UNKNOWN

    def _slot(self, value: cst.BaseExpression, slot: int, scope, at, env, depth) -> Kind:
        """The kind of item `slot` of `value` (``recon, mu, logvar = model(x)``)."""
        if isinstance(value, (cst.Tuple, cst.List)) and slot < len(value.elements):
            return self._kind(value.elements[slot].value, scope, at, env, depth)
        if isinstance(value, cst.Call):
            fn = self._function_of(value, scope)
            if fn is not None and depth < _DEPTH:
                return self._returns(fn, self._env(fn, value, scope, at, env, depth), depth + 1, slot)
            if self._module_call(value, scope, at):
                return _ELEM if self._elem_args(value, scope, at, env, depth) else _UNKNOWN
        whole = self._kind(value, scope, at, env, depth)
        return _k(ELEM if whole.kind == ELEM else UNKNOWN, whole)

    def _param(self, name: str, fn: cst.FunctionDef, depth: int) -> Kind:
        if depth >= _DEPTH:
            return _UNKNOWN
        kinds = []
        for site in self.facts.callers(fn):
            value = self.facts.bound_value(site.call, fn, name)
            if value is None:
                return _UNKNOWN
            kinds.append(self._kind(value, site.scope, site.stmt, {}, depth + 1))
        if not kinds or any(k != kinds[0] for k in kinds):
            return _UNKNOWN
        return kinds[0]

    # attributes and subscripts ------------------------------------------------------------
    def _attribute(self, e: cst.Attribute, scope, at, env, depth) -> Kind:
        inner = self._kind(e.value, scope, at, env, depth)
        if inner.kind == ELEM:
            return _k(ELEM if e.attr.value in ("data", "T", "mT") else UNKNOWN, inner)
        if inner.kind != CONST:
            return _UNKNOWN
        value = self._attribute_value(e, scope)
        if value is not None:
            return self._kind(value[0], value[1], value[2], {}, depth + 1) if depth < _DEPTH else _UNKNOWN
        return _CONST  # a hyperparameter (`args.beta`), a setting of the instance

    def _attribute_value(self, e: cst.BaseExpression, scope) -> Optional[Tuple[cst.BaseExpression, Scope, cst.CSTNode]]:
        """What the class assigns to an attribute of the instance (`self.criterion` in any method:
        its one assignment), with the method and statement that assign it."""
        key = self.facts.key(scope, dotted(e))
        if key[0] == 0:
            return None

        def scan():  # once per attribute: every read of it asks the same
            found = []
            for fn, cls in self.facts.methods.items():
                if id(cls) != key[0]:
                    continue
                for stmt in self.facts.statements(fn):
                    small = sole_statement(stmt)
                    if isinstance(small, cst.Assign) and len(small.targets) == 1:
                        if self.facts.key(fn, dotted(small.targets[0].target)) == key:
                            found.append((small.value, fn, stmt))
            return found[0] if len(found) == 1 else None

        return self.facts.memo(("attribute_value", *key), scan)

    def _subscript(self, e: cst.Subscript, scope, at, env, depth) -> Kind:
        inner = self._kind(e.value, scope, at, env, depth)
        if inner.kind == ELEM:
            return _k(ELEM, inner)
        if (isinstance(e.value, cst.Attribute) and e.value.attr.value == "shape" and len(e.slice) == 1
                and isinstance(e.slice[0].slice, cst.Index)):
            return self._size(e.value.value, e.slice[0].slice.value, scope, at, env, depth)
        if len(e.slice) == 1 and isinstance(e.slice[0].slice, cst.Index) and isinstance(e.slice[0].slice.value, cst.Integer):
            if isinstance(e.value, cst.Call):
                return self._slot(e.value, int(e.slice[0].slice.value.value), scope, at, env, depth)
        return _CONST if inner.kind == CONST else _UNKNOWN

    def _size(self, tensor: cst.BaseExpression, dim: Optional[cst.BaseExpression], scope, at, env, depth) -> Kind:
        """``x.size(0)``, ``x.shape[0]``: the batch's count; another dim: a constant."""
        if self._kind(tensor, scope, at, env, depth).kind != ELEM:
            return _UNKNOWN
        if dim is None:
            return _UNKNOWN  # the whole size
        if isinstance(dim, cst.Integer):
            return _k(COUNT) if dim.value == "0" else _CONST
        return _UNKNOWN

    # calls ------------------------------------------------------------------------------
    def _call(self, e: cst.Call, scope, at, env, depth) -> Kind:
        a = self.a
        q = a.qualname(e.func)
        if q in WORLD_SIZE:
            return _CONST
        if q in MEAN_LOSSES and q.startswith("torch.nn.functional."):
            return self._loss(_reduction(e), e, scope, at, env, depth)
        if q in PAIRWISE_FUNCTIONS:
            kinds = [self._kind(x.value, scope, at, env, depth) for x in e.args if x.keyword is None]
            if sum(k.kind == ELEM for k in kinds) >= 2:
                return _k(ELEM, *kinds, pairs=e)
            return _elementwise(kinds)
        if self._builtin(e.func, "sum") and len(e.args) == 1:
            return self._generator(e.args[0].value, scope, at, env, depth)
        if self._builtin(e.func, "len") and len(e.args) == 1:
            inner = self._kind(e.args[0].value, scope, at, env, depth)
            return _k(COUNT) if inner.kind == ELEM else (_CONST if inner.kind == CONST else _UNKNOWN)
        if q in ("torch.sum", "torch.mean", "torch.nansum", "torch.nanmean") and e.args:
            inner = self._kind(e.args[0].value, scope, at, env, depth)
            return _reduce(inner, q.rsplit(".", 1)[1], e.args[1:])
        if q is not None and q in ELEMENTWISE_FUNCTIONS:
            kinds = [self._kind(x.value, scope, at, env, depth) for x in e.args if x.keyword is None]
            return _elementwise(kinds)
        func = e.func
        if isinstance(func, cst.Attribute) and q is None:
            method = func.attr.value
            if method in _SUMS | _MEANS:
                return _reduce(self._kind(func.value, scope, at, env, depth), method, e.args)
            if method in ("size",) and len(e.args) <= 1:
                return self._size(func.value, e.args[0].value if e.args else None, scope, at, env, depth)
            if method == "numel" and not e.args:
                inner = self._kind(func.value, scope, at, env, depth)
                return _k(COUNT) if inner.kind == ELEM else _UNKNOWN
            if method in MODULE_METHODS and method not in ELEMENTWISE_METHODS:
                return _CONST  # `model.parameters()`: the model's own, not the batch's
            if method in ELEMENTWISE_METHODS:
                inner = self._kind(func.value, scope, at, env, depth)
                if inner.kind in (ELEM, CONST, SAMPLE, MEAN):
                    keeps = method in _KEEPS_REDUCED or inner.kind in (ELEM, CONST)
                    return _k(inner.kind if keeps else UNKNOWN, inner)
                return _k(UNKNOWN, inner)
            if method in PAIRWISE_METHODS and len(e.args) == 1:
                inner = self._kind(func.value, scope, at, env, depth)
                other = self._kind(e.args[0].value, scope, at, env, depth)
                if inner.kind == other.kind == ELEM:
                    return _k(ELEM, inner, other, pairs=e)
        criterion = self._criterion(e.func, scope, at, depth)
        if criterion is not None:
            return self._loss(criterion, e, scope, at, env, depth)
        fn = self._function_of(e, scope)
        if fn is not None:
            if depth >= _DEPTH:
                return _UNKNOWN
            return self._returns(fn, self._env(fn, e, scope, at, env, depth), depth + 1, None)
        if self._module_call(e, scope, at):
            return _ELEM if self._elem_args(e, scope, at, env, depth) else _UNKNOWN
        receiver = func.value if isinstance(func, cst.Attribute) else None
        if self._builtin(func, "next") or (receiver is not None and self._kind(receiver, scope, at, env, depth).kind != CONST):
            return _UNKNOWN
        if all(self._kind(x.value, scope, at, env, depth).kind == CONST for x in e.args):
            return _CONST  # `torch.tensor(0.5)`, `parser.parse_args()`: made of constants
        return _UNKNOWN

    def _builtin(self, func: cst.BaseExpression, name: str) -> bool:
        """`func` is the builtin `name`, which the script does not bind itself."""
        return (isinstance(func, cst.Name) and func.value == name and self.a.qualname(func) in (None, f"builtins.{name}")
                and not self.facts.bindings(self.a.module).get(name))

    def _loss(self, reduced: Kind, call: cst.Call, scope, at, env, depth) -> Kind:
        """A library loss's kind (`reduced`, by its reduction) with the pairing products of its inputs
        (``F.cross_entropy(z @ z.T / t, labels)``, the contrastive recipe)."""
        kinds = [self._kind(x.value, scope, at, env, depth) for x in call.args]
        return _k(reduced.kind, *kinds, sums=reduced.has_sum)

    def _criterion(self, func: cst.BaseExpression, scope, at, depth: int) -> Optional[Kind]:
        """The reduction of the loss module `func` calls, by its construction (``criterion =
        nn.MSELoss(...)``; ``self.criterion`` assigned in ``__init__``; a parameter every call of
        the function passes one such criterion for, all of one kind)."""
        if (isinstance(func, cst.Name) and isinstance(scope, cst.FunctionDef) and func.value in self.facts.params(scope)
                and self.facts.reaching_binding(scope, func.value, at) is None):
            if depth >= _DEPTH:
                return None
            found = []
            for site in self.facts.callers(scope):
                value = self.facts.bound_value(site.call, scope, func.value)
                k = self._criterion(value, site.scope, site.stmt, depth + 1) if value is not None else None
                if k is None:
                    return None
                found.append(k)
            return found[0] if found and all(k == found[0] for k in found) else None
        value = self._constructed(func, scope, at)
        if isinstance(value, cst.Call) and self.a.qualname(value.func) in MEAN_LOSSES:
            return _reduction(value)
        return None

    def _constructed(self, func: cst.BaseExpression, scope, at, depth: int = 0) -> Optional[cst.BaseExpression]:
        """The value a callable was made from: its one assignment (``criterion = nn.MSELoss()``, at
        module level too), what the class assigns an attribute of the instance, and, for a
        parameter (``self.model = model`` in ``__init__``), what every call passes for it when
        they all build the same thing."""
        value: Optional[cst.BaseExpression] = None
        if isinstance(func, cst.Name):
            if (isinstance(scope, cst.FunctionDef) and func.value in self.facts.params(scope)
                    and self.facts.reaching_binding(scope, func.value, at) is None):
                return self._passed(func.value, scope, depth)
            b = self.facts.reaching_binding(scope, func.value, at)
            where = scope
            if b is None and scope is not self.a.module:
                module_binds = self.facts.bindings(self.a.module).get(func.value, [])
                b, where = (module_binds[0], self.a.module) if len(module_binds) == 1 else (None, scope)
            small = sole_statement(b.stmt) if b is not None else None
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
                value = small.value
                if isinstance(value, cst.Name) and depth < _DEPTH:
                    return self._constructed(value, where, b.stmt, depth + 1)
            return value
        if isinstance(func, cst.Attribute):
            found = self._attribute_value(func, scope)
            if found is None:
                return None
            value, fn, stmt = found
            if isinstance(value, cst.Name) and depth < _DEPTH:
                return self._constructed(value, fn, stmt, depth + 1)
            return value
        return None

    def _passed(self, name: str, fn: cst.FunctionDef, depth: int) -> Optional[cst.BaseExpression]:
        if depth >= _DEPTH:
            return None
        built = []
        for site in self.facts.callers(fn):
            value = self.facts.bound_value(site.call, fn, name)
            if isinstance(value, cst.Name):
                value = self._constructed(value, site.scope, site.stmt, depth + 1)
            if not isinstance(value, cst.Call):
                return None
            built.append(value)
        names = {self.a.qualname(v.func) or dotted(v.func) for v in built}
        return built[0] if len(names) == 1 and None not in names else None

    def _module_call(self, e: cst.Call, scope, at) -> bool:
        """A call of a model the script trains, of one of its module classes, or of a torch layer:
        what it returns keeps the batch's samples apart."""
        a = self.a
        text = dotted(e.func)
        if text is not None and any(m.name == text and m.scope is scope for m in a.models):
            return True
        if isinstance(e.func, cst.Call):
            return self._layer(e.func)
        value = self._constructed(e.func, scope, at)
        return isinstance(value, cst.Call) and (self._layer(value) or self._script_module(value))

    def _layer(self, construction: cst.Call) -> bool:
        q = self.a.qualname(construction.func) or ""
        return q.startswith(TORCH_LAYER_PREFIX) and q not in MEAN_LOSSES

    def _script_module(self, construction: cst.Call) -> bool:
        name = dotted(construction.func)
        return name is not None and any(m.cls is not None and m.cls.name.value == name for m in self.a.models)

    def _elem_args(self, e: cst.Call, scope, at, env, depth) -> bool:
        return any(self._kind(x.value, scope, at, env, depth).kind == ELEM for x in e.args)

    def _function_of(self, e: cst.Call, scope) -> Optional[cst.FunctionDef]:
        """The script's own function a call runs: a function, a method, or a model class's forward."""
        fn = self.facts.callee(e, scope)
        if fn is not None and fn is not scope:
            return fn
        text = dotted(e.func)
        for m in self.a.models:
            if m.name == text and m.scope is scope and m.cls is not None:
                return next((s for s in m.cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "forward"), None)
        return None

    def _env(self, fn: cst.FunctionDef, call: cst.Call, scope, at, env, depth) -> Dict[str, Kind]:
        """The kinds `call` hands `fn`'s parameters (``facts.params`` leaves a method's instance out:
        it is the script's object, no batch)."""
        params = self.facts.params(fn)
        out: Dict[str, Kind] = {}
        every = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
        if every[: len(every) - len(params)]:
            out[every[0]] = _CONST
        positional = 0
        for x in call.args:
            if x.star:
                return out
            if x.keyword is not None:
                name = x.keyword.value
            elif positional < len(params):
                name = params[positional]
                positional += 1
            else:
                continue
            out[name] = self._kind(x.value, scope, at, env, depth)
        for p in fn.params.params + fn.params.kwonly_params:
            name = p.name.value
            if name not in out:
                out[name] = _k(CONST) if isinstance(p.default, (cst.Integer, cst.Float, cst.Name)) else _UNKNOWN
        for p in params:
            out.setdefault(p, _UNKNOWN)
        return out

    def _statement(self, fn: cst.FunctionDef, r: cst.Return) -> cst.CSTNode:
        """The statement line of `fn` that holds the ``return`` `r`."""
        return next(
            s for s in self.facts.statements(fn)
            if isinstance(s, cst.SimpleStatementLine) and any(x is r for x in s.body)
        )

    def _returns(self, fn: cst.FunctionDef, env: Dict[str, Kind], depth: int, slot: Optional[int]) -> Kind:
        returns = [n for n in all_nodes(fn.body, skip_nested=True) if isinstance(n, cst.Return) and n.value is not None]
        kinds = []
        for r in returns:
            at = self._statement(fn, r)
            kinds.append(self._slot(r.value, slot, fn, at, env, depth) if slot is not None
                         else self._kind(r.value, fn, at, env, depth))
        if not kinds or any(k.kind != kinds[0].kind for k in kinds):
            return _k(UNKNOWN, *kinds)
        return _k(kinds[0].kind, *kinds)


# the methods that keep a reduced number what it is (a sum stays a sum as a float)
_KEEPS_REDUCED = {"float", "double", "half", "to", "type_as", "clone", "contiguous", "squeeze", "view", "reshape", "flatten"}


def _enumerate_index(loop: cst.For, name: str) -> bool:
    """`i` in ``for i, batch in enumerate(loader)``: a count of batches, not a batch."""
    it, target = loop.iter, loop.target
    if not (isinstance(it, cst.Call) and dotted(it.func) == "enumerate" and isinstance(target, cst.Tuple) and target.elements):
        return False
    first = target.elements[0].value
    return isinstance(first, cst.Name) and first.value == name


def _reduction(call: cst.Call) -> Kind:
    """A library loss by its reduction: the default and ``"mean"`` average, ``"sum"`` adds up, ``"none"``
    keeps one entry per sample (the deprecated ``size_average=False`` / ``reduce=False`` too)."""
    size_average = reduce = None
    for x in call.args:
        if x.star:
            return _UNKNOWN
        if x.keyword is None:
            continue
        word = x.keyword.value
        if word == "reduction":
            if not isinstance(x.value, cst.SimpleString):
                return _UNKNOWN
            how = x.value.evaluated_value
            return {"sum": _k(SAMPLE), "mean": _k(MEAN), "batchmean": _k(MEAN), "none": _ELEM}.get(how, _UNKNOWN)
        if word in ("size_average", "reduce"):
            if not isinstance(x.value, cst.Name) or x.value.value not in ("True", "False"):
                return _UNKNOWN
            if word == "size_average":
                size_average = x.value.value == "True"
            else:
                reduce = x.value.value == "True"
    if reduce is False:
        return _ELEM
    if size_average is False:
        return _k(SAMPLE)
    return _k(MEAN)


def _reduce(inner: Kind, how: str, args) -> Kind:
    """``x.sum()`` / ``x.mean()`` (or ``torch.sum(x)``) of a value of kind `inner`. Along a dim, the
    batch's place in the tensor decides, and distify does not know the layout: unknown."""
    if any(x.keyword is None or x.keyword.value in ("dim", "axis") for x in args):
        return _k(UNKNOWN, inner)
    if inner.kind == ELEM:
        return _k(SAMPLE, inner) if how in _SUMS else _k(MEAN, inner)
    if inner.kind in (SAMPLE, MEAN, MIXED, CONST, COUNT):
        return inner
    return _k(UNKNOWN, inner)


def _elementwise(kinds: List[Kind]) -> Kind:
    if not kinds:
        return _UNKNOWN
    if all(k.kind in (ELEM, CONST) for k in kinds):
        return _k(ELEM if any(k.kind == ELEM for k in kinds) else CONST, *kinds)
    return _k(UNKNOWN, *kinds)


def backward_kind(a: "Anatomy", site) -> Tuple[Optional[cst.BaseExpression], Kind]:
    """The loss a backward call site runs from, and its kind (see the module's docstring)."""
    loss = backward_loss(a, site.call, site.scope)
    if loss is None:
        return None, _UNKNOWN
    reader = a.facts.memo(("loss_scale",), lambda: LossScale(a))
    return loss, reader.kind(loss, site.scope, site.stmt)


def scaled_by_world(a: "Anatomy", loss: cst.BaseExpression) -> bool:
    """`loss` already multiplies by a world size (``loss * dist.get_world_size()``): a second run
    leaves it."""
    return any(
        isinstance(n, cst.Call) and a.qualname(n.func) in WORLD_SIZE for n in all_nodes(loss)
    )
