"""DDP's contract, read from the model's own code.

DDP expects every parameter that requires a gradient to get one in every backward pass, once. A
model's class (its ``__init__`` and ``forward``, and the classes of this file it is built from)
says whether that holds:

- a submodule or parameter defined in ``__init__`` and never reached from ``forward``
  (``self.head`` kept for another task): no gradient, ever;
- one reached only under a condition (``if y is not None: ...``, ``if random.random() < p:``, an
  ``x if c else y``, the right side of ``and``/``or``): no gradient in the steps that skip it;
- activation checkpointing with reentrant autograd (``torch.utils.checkpoint.checkpoint(f, x)``
  without ``use_reentrant=False``): its parameters' gradients are produced in a nested backward
  that DDP's hooks see out of order.

And the training loop says whether the set of parameters that require a gradient changes while it
runs (``model.encoder.requires_grad_(False)`` at some epoch, or ``True`` to unfreeze).

Read-only; the rules ask it (DST101 decides ``find_unused_parameters``, DST104 the rest).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from distify.facts import Facts, training_call
from distify.instance import instance_name, is_attribute_of
from distify.library import known
from distify.syntax import all_nodes, dotted
from distify.walk import children
from distify.values import Value

CHECKPOINTS = frozenset({
    "torch.utils.checkpoint.checkpoint",
    "torch.utils.checkpoint.checkpoint_sequential",
})
# torch.nn names that build no module or parameter
_NOT_MODULES = ("torch.nn.functional.", "torch.nn.init.", "torch.nn.utils.")
# torch.nn modules without parameters: defined and never called, they leave no parameter without a gradient
PARAMETER_FREE = frozenset(
    f"torch.nn.{n}"
    for n in (
        "ReLU", "ReLU6", "GELU", "SiLU", "Mish", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Softplus", "ELU",
        "SELU", "CELU", "LeakyReLU", "Hardswish", "Hardsigmoid", "Hardtanh", "Tanhshrink", "Softsign", "GLU",
        "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "Identity", "Flatten", "Unflatten",
        "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
        "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
        "Upsample", "PixelShuffle", "PixelUnshuffle", "ZeroPad2d", "ConstantPad1d", "ConstantPad2d",
        "ReflectionPad2d", "ReplicationPad2d", "CosineSimilarity", "PairwiseDistance",
    )
)


class Gap(Value):
    """A place where the model breaks DDP's contract (``forward_gaps``, ``training_freezes``, ``dtype_flips``)."""

    __slots__ = ("kind", "node", "what", "why")
    kind: str  # unused | conditional | reentrant | freeze | unfreeze
    node: cst.CSTNode  # where: the member's assignment, the reference, the checkpoint call, the change
    what: str  # `Net.head`, `checkpoint(...)`
    why: str  # for `conditional`: the condition's source

    def __init__(self, kind: str, node: cst.CSTNode, what: str, why: str = "") -> None:
        self._set(kind, node, what, why)


def _methods(cls: cst.ClassDef) -> Dict[str, cst.FunctionDef]:
    return {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef)}


def _members(init: cst.FunctionDef, classes, qualname) -> Dict[str, cst.Assign]:
    """`self.X = <a torch.nn module or parameter, a class of this file, or another library's model
    (``timm.create_model``, ``torchvision.models.resnet18``, ``AutoModel.from_pretrained``: the
    library table's model rows)>(...)` in ``__init__``."""
    out: Dict[str, cst.Assign] = {}
    me = instance_name(init)  # the instance, whatever __init__ calls it
    for n in all_nodes(init.body, skip_nested=True):
        if not (isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.value, cst.Call)):
            continue
        target = n.targets[0].target
        if not is_attribute_of(target, me):
            continue
        q = qualname(n.value.func) or ""
        if q in PARAMETER_FREE or q.endswith("Loss"):
            continue
        row = known(q)
        if (
            (q.startswith("torch.nn.") and not q.startswith(_NOT_MODULES))
            or dotted(n.value.func) in classes
            or (row is not None and row.kind == "model")
        ):
            out[target.attr.value] = n
    return out


def _reached(cls: cst.ClassDef) -> List[cst.FunctionDef]:
    """``forward`` and the methods it calls on its instance (``self.m(...)``), transitively."""
    methods = _methods(cls)
    todo = [methods["forward"]] if "forward" in methods else []
    seen: List[cst.FunctionDef] = []
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.append(fn)
        me = instance_name(fn)
        for n in all_nodes(fn.body, skip_nested=True):
            if isinstance(n, cst.Call) and is_attribute_of(n.func, me):
                called = methods.get(n.func.attr.value)
                if called is not None:
                    todo.append(called)
    return seen


def _dynamic(fns: List[cst.FunctionDef]) -> bool:
    """Members reached by name at run time (``getattr(self, name)``, ``self._modules``,
    ``self.children()``): which are used cannot be read."""
    for fn in fns:
        me = instance_name(fn)
        for n in all_nodes(fn.body, skip_nested=True):
            if isinstance(n, cst.Call) and dotted(n.func) in ("getattr", "vars"):
                return True
            if is_attribute_of(n, me) and n.attr.value in (
                "_modules", "_parameters", "__dict__", "children", "modules", "named_children",
                "named_modules", "parameters", "named_parameters",
            ):
                return True
    return False


def _structural(test: cst.BaseExpression, member: str, me: str) -> bool:
    """``self.X``, ``not self.X``, ``self.X is not None`` about the member itself: a submodule that
    may be None has no parameters when it is."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test = test.expression
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        c = test.comparisons[0]
        if isinstance(c.operator, (cst.IsNot, cst.Is)) and dotted(c.comparator) == "None":
            test = test.left
    return dotted(test) == f"{me}.{member}"


def _always(node: cst.CSTNode, members: Set[str], me: Optional[str]) -> Set[str]:
    """The members `node` reaches on every path through it: outside any condition, or in both
    branches of an ``if``/``else`` (DCGAN's ``if ngpu > 1: data_parallel(self.main, x) else:
    self.main(x)`` reaches ``self.main`` either way)."""
    out: Set[str] = set()

    def go(n: cst.CSTNode) -> None:
        if isinstance(n, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return
        if isinstance(n, cst.IndentedBlock):
            stmts = list(n.body)
            for i, s in enumerate(stmts):
                if _returns_early(s):  # `if c: ... return`: what follows is its else
                    go(s.test)
                    rest = cst.IndentedBlock(body=stmts[i + 1:])
                    out.update(_always(s.body, members, me) & _always(rest, members, me))
                    return
                go(s)
            return
        if isinstance(n, (cst.If, cst.IfExp)):
            go(n.test)
            if n.orelse is not None:
                out.update(_always(n.body, members, me) & _always(n.orelse, members, me))
            return
        if isinstance(n, cst.BooleanOperation):
            go(n.left)
            return
        if isinstance(n, cst.While):
            go(n.test)
            return
        if is_attribute_of(n, me) and n.attr.value in members:
            out.add(n.attr.value)
            return
        for child in children(n):
            go(child)

    go(node)
    return out


def _returns_early(stmt: cst.CSTNode) -> bool:
    """An ``if`` with no ``else`` whose body ends by returning or raising: the statements after it
    run exactly when its test is false."""
    if not isinstance(stmt, cst.If) or stmt.orelse is not None:
        return False
    body = stmt.body.body
    last = body[-1] if body else None
    if isinstance(last, cst.SimpleStatementLine):
        last = last.body[-1] if last.body else None
    return isinstance(last, (cst.Return, cst.Raise))


def _conditional_uses(fn: cst.FunctionDef, members: Set[str]):
    """(member, reference, condition) for each ``self.X`` reached only under a condition. A
    condition whose every branch reaches the member (an ``if``/``else`` using it on both sides)
    does not count for it."""
    found = []
    me = instance_name(fn)
    if me is None:
        return found

    def visit(node: cst.CSTNode, conds: tuple) -> None:
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)) and node is not fn:
            return
        if isinstance(node, cst.IndentedBlock):
            stmts = list(node.body)
            for i, s in enumerate(stmts):
                if _returns_early(s):
                    # `if targets is None: return ...` and the statements after it: the two paths
                    # of one condition (a member reached on both is reached on every path)
                    rest = cst.IndentedBlock(body=stmts[i + 1:])
                    both = _always(s.body, members, me) & _always(rest, members, me)
                    visit(s.test, conds)
                    visit(s.body, conds + ((s.test, both),))
                    visit(rest, conds + ((s.test, both),))
                    return
                visit(s, conds)
            return
        if isinstance(node, (cst.If, cst.IfExp)):
            both = _always(node.body, members, me) & _always(node.orelse, members, me) if node.orelse is not None else set()
            visit(node.test, conds)
            visit(node.body, conds + ((node.test, both),))
            if node.orelse is not None:
                visit(node.orelse, conds + ((node.test, both),))
            return
        if isinstance(node, cst.BooleanOperation):
            visit(node.left, conds)
            visit(node.right, conds + ((node.left, set()),))
            return
        if isinstance(node, cst.While):
            visit(node.test, conds)
            visit(node.body, conds + ((node.test, set()),))
            return
        if is_attribute_of(node, me) and node.attr.value in members:
            member = node.attr.value
            real = [c for c, either in conds if member not in either and not _structural(c, member, me)]
            if real:
                found.append((member, node, real[-1]))
            return
        for child in children(node):
            visit(child, conds)

    visit(fn.body, ())
    return found


def forward_gaps(cls: cst.ClassDef, classes: Dict[str, cst.ClassDef], qualname, code, depth: int = 0,
                 seen: Optional[Set[int]] = None) -> List[Gap]:
    """What in the model class `cls` (and the classes of this file its members are built from)
    breaks DDP's contract; `code` renders a node's source (for the condition in a message)."""
    seen = set() if seen is None else seen
    if id(cls) in seen or depth > 4:
        return []
    seen.add(id(cls))
    methods = _methods(cls)
    out: List[Gap] = []
    name = cls.name.value
    init, forward = methods.get("__init__"), methods.get("forward")
    members = _members(init, classes, qualname) if init is not None else {}
    reached = _reached(cls)
    if forward is not None and members and not _dynamic(reached):
        used = {
            n.attr.value
            for fn in reached
            for n in all_nodes(fn.body, skip_nested=True)
            if is_attribute_of(n, instance_name(fn))
        }
        for member, assign in members.items():
            if member not in used:
                out.append(Gap("unused", assign, f"{name}.{member}"))
        for fn in reached:
            for member, ref, cond in _conditional_uses(fn, set(members)):
                out.append(Gap("conditional", ref, f"{name}.{member}", code(cond)))
    for fn in methods.values():
        for n in all_nodes(fn.body, skip_nested=True):
            if isinstance(n, cst.Call) and qualname(n.func) in CHECKPOINTS and reentrant(n):
                out.append(Gap("reentrant", n, f"{name}.{fn.name.value}"))
    for assign in members.values():
        for n in all_nodes(assign.value):
            if isinstance(n, cst.Call) and dotted(n.func) in classes:
                out += forward_gaps(classes[dotted(n.func)], classes, qualname, code, depth + 1, seen)
    return out


def reentrant(call: cst.Call) -> bool:
    """A checkpoint call that runs with reentrant autograd: no ``use_reentrant=False``."""
    for a in call.args:
        if a.keyword is not None and a.keyword.value == "use_reentrant":
            return not (isinstance(a.value, cst.Name) and a.value.value == "False")
    return True


def training_freezes(facts: Facts, qualname, scope, root: str) -> List[Gap]:
    """``requires_grad`` of the model's parameters changed inside a loop that trains (in `scope`,
    or in a function of the script that loop calls with the model): "freeze" when set to a literal
    False, "unfreeze" otherwise. Asked by DST101 and DST104: found once per analysis."""
    from distify.model_state import FREEZE, changes_in  # noqa: E402 - keeps this module light

    def find() -> Tuple[Gap, ...]:
        return tuple(Gap("freeze" if _sets_false(c.node) else "unfreeze", c.node, root)
                     for stmt in training_loops(facts, scope) for c in changes_in(facts, qualname, stmt, [root])
                     if c.kind == FREEZE)

    resolver = getattr(qualname, "__self__", qualname)  # the anatomy whose names `qualname` resolves
    return list(facts.memo(("training_freezes", id(scope), root, id(resolver)), find))


def training_loops(facts: Facts, scope) -> List[cst.CSTNode]:
    """The outermost loops of `scope` that train (call backward()/step(), or a function that does)."""
    return list(facts.memo(("training_loops", id(scope)), lambda: tuple(
        stmt
        for stmt in facts.statements(scope)
        if isinstance(stmt, (cst.For, cst.While))
        and not facts.loops_around(stmt)
        and any(training_call(n) or (isinstance(n, cst.Call) and facts.callee(n, scope) in facts.trainers)
                for n in all_nodes(stmt, skip_nested=True))
    )))


DTYPE_METHODS = frozenset({"half", "float", "double", "bfloat16"})
DTYPES = frozenset({f"torch.{t}" for t in ("float16", "half", "bfloat16", "float32", "float", "float64", "double")})


def dtype_flips(facts: Facts, qualname, scope, root: str) -> List[Gap]:
    """Parameter dtypes changed inside a loop that trains: ``model.half()`` / ``model.float()`` /
    ``model.to(torch.float16)`` on the model or a part of it, or a function of the script handed
    the model that rebinds its parameters' ``.data`` (``p.data = p.data.float()``, the CLIP
    fine-tune's fp16/fp32 flip around each step)."""
    out: List[Gap] = []
    for loop in training_loops(facts, scope):
        for n in all_nodes(loop, skip_nested=True):
            if isinstance(n, cst.Call) and _flips(qualname, n, root):
                out.append(Gap("dtype", n, root))
            elif isinstance(n, cst.Call):
                fn = facts.callee(n, scope)
                if fn is None:
                    continue
                for a in n.args:
                    if dotted(a.value) == root:
                        param = facts.param_for(fn, n, a)
                        if param is not None and _rebinds_data(qualname, fn, param):
                            out.append(Gap("dtype", n, root))
    return out


def _flips(qualname, call: cst.Call, root: str) -> bool:
    func = call.func
    if not isinstance(func, cst.Attribute) or not (dotted(func.value) or "").split(".")[0] == root.split(".")[0]:
        return False
    d = dotted(func.value) or ""
    if not (d == root or d.startswith(root + ".")):
        return False
    if func.attr.value in DTYPE_METHODS:
        return True
    return func.attr.value == "to" and any(qualname(a.value) in DTYPES for a in call.args)


def _rebinds_data(qualname, fn: cst.FunctionDef, param: str) -> bool:
    """`fn` changes the dtype of `param`'s parameters: ``p.data = ...`` or ``p.half()``-style calls
    in a loop over ``param.parameters()``, or a dtype method called on `param` itself."""
    for n in all_nodes(fn.body, skip_nested=True):
        if isinstance(n, cst.Call) and _flips(qualname, n, param):
            return True
        if isinstance(n, cst.For) and param in {dotted(x.value) for x in all_nodes(n.iter) if isinstance(x, cst.Attribute)}:
            var = dotted(n.target)
            for inner in all_nodes(n.body, skip_nested=True):
                if isinstance(inner, cst.Assign) and any(
                    isinstance(t.target, cst.Attribute) and t.target.attr.value == "data" and var
                    and (dotted(t.target.value) or "").split(".")[0] == var
                    for t in inner.targets
                ):
                    return True
    return False


def _sets_false(node: cst.CSTNode) -> bool:
    """`x.requires_grad_(False)` / `p.requires_grad = False` (also in the loop a `for` holds)."""
    for n in all_nodes(node):
        value = None
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "requires_grad_":
            value = n.args[0].value if n.args else cst.Name("True")
        elif isinstance(n, cst.Assign) and any(
            isinstance(t.target, cst.Attribute) and t.target.attr.value == "requires_grad" for t in n.targets
        ):
            value = n.value
        if value is not None:
            return isinstance(value, cst.Name) and value.value == "False"
    return False
