"""Where a value comes from and where it goes: names a reference stands for, what a function returns
and into which slot, and what a loop iterates (part of the anatomy, see anatomy.py).
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from distify.facts import training_call
from distify.syntax import arg, dotted, by_node
from distify.walk import children, preorder
from distify.names import row_of


def _contains(node: cst.CSTNode, pred) -> bool:
    return any(pred(n) for n in preorder(node))


@by_node  # a body the rewrite left as it was is judged once for input and output
def _is_training_body(node: cst.CSTNode) -> bool:
    return _contains(node, training_call)


def ref_text(expr: Optional[cst.CSTNode]) -> Optional[str]:
    """A canonical spelling of a reference: dotted ('a.b'), or one constant subscript of a dotted
    name ('loaders["train"]', 'loaders[0]'), which is how a helper's returned dict or tuple is
    reached. None for anything else."""
    d = dotted(expr)
    if d is not None:
        return d
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        base = dotted(expr.value)
        key = expr.slice[0].slice.value
        if base is None:
            return None
        if isinstance(key, cst.SimpleString):
            k = key.evaluated_value
            if isinstance(k, str) and k.isprintable() and '"' not in k and "\\" not in k:
                return f'{base}["{k}"]'
        elif isinstance(key, cst.Integer) and key.value.isdigit():
            return f"{base}[{int(key.value)}]"
    return None


def unwrap_alias(expr: Optional[cst.CSTNode]) -> Optional[str]:
    """The model `X` of a wrapper-agnostic unwrap, which holds `X` itself or the module a wrapper
    keeps in it (``X.module if hasattr(X, "module") else X``, the branches either way round and under
    any test; ``getattr(X, "module", X)``): under FSDP, which shards in place, the model itself."""
    if isinstance(expr, cst.IfExp):
        a, b = dotted(expr.body), dotted(expr.orelse)
        if a is not None and b is not None:
            if a == f"{b}.module":
                return b
            if b == f"{a}.module":
                return a
        return None
    if (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "getattr"
            and len(expr.args) == 3 and not any(x.keyword or x.star for x in expr.args)):
        obj, attr, default = (x.value for x in expr.args)
        if (isinstance(attr, cst.SimpleString) and attr.evaluated_value == "module"
                and dotted(obj) is not None and dotted(obj) == dotted(default)):
            return dotted(obj)
    return None


def _returns(fn: cst.FunctionDef) -> List[cst.Return]:
    """The return statements of `fn` itself (not of functions or classes nested in it), in source
    order."""
    return list(_own_returns(fn))


# the nodes a return statement of the function itself can lie under: its blocks and compound
# statements, never an expression (a lambda holds none) nor a nested def or class
_STATEMENT_LEVEL = frozenset(t for t in (getattr(cst, n, None) for n in (
    "IndentedBlock", "SimpleStatementSuite", "SimpleStatementLine", "If", "Else", "For", "While", "Try", "TryStar",
    "ExceptHandler", "ExceptStarHandler", "Finally", "With", "Match", "MatchCase")) if t is not None)


@by_node  # read once per function object: the audit's output keeps the functions no edit touched
def _own_returns(fn: cst.FunctionDef) -> tuple:
    found: List[cst.Return] = []
    stack: List[cst.CSTNode] = [fn.body]
    while stack:  # statements only: a walk of every expression cost ~5% of the engine
        n = stack.pop()
        t = type(n)
        if t is cst.Return:
            found.append(n)
        elif t in _STATEMENT_LEVEL:
            below = children(n)
            below.reverse()
            stack += below
    return tuple(found)


def return_slot(fn: cst.FunctionDef, matches, returns: Optional[List[cst.Return]] = None) -> Optional[tuple]:
    """Where `fn` returns the value `matches` picks out: ("whole",), ("item", i, n) of an n-tuple,
    or ("key", k) of a dict literal; None when it is not returned or returned in different places.
    `returns`: fn's return statements, when the caller has them already."""
    slots = set()
    for ret in _returns(fn) if returns is None else returns:
        v = ret.value
        if v is None:
            continue
        if matches(v):
            slots.add(("whole",))
        elif isinstance(v, cst.Tuple) and not any(isinstance(e, cst.StarredElement) for e in v.elements):
            for i, e in enumerate(v.elements):
                if matches(e.value):
                    slots.add(("item", i, len(v.elements)))
        elif isinstance(v, cst.Dict):
            for e in v.elements:
                if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString) and matches(e.value):
                    k = e.key.evaluated_value
                    if isinstance(k, str):
                        slots.add(("key", k))
    return slots.pop() if len(slots) == 1 else None


def indexed_return(assign: cst.Assign, call: cst.Call, slot: tuple) -> Optional[str]:
    """`x = f(...)[i]` (or `f(...)["k"]`) binds `x` to slot `slot` of what `f` returns, when the index
    is that slot's: the loader a helper returns in a tuple is the one its caller trains on, whatever
    either is called. `slot` is ("item", i, n) or ("key", k) as ``anatomy.return_slot`` gives it."""
    value, target = assign.value, assign.targets[0].target
    if not (isinstance(value, cst.Subscript) and value.value is call and len(value.slice) == 1):
        return None
    index = value.slice[0].slice
    if not (isinstance(index, cst.Index) and isinstance(target, cst.Name)):
        return None
    if slot[0] == "item" and isinstance(index.value, cst.Integer) and int(index.value.value) == slot[1]:
        return target.value
    if slot[0] == "key" and isinstance(index.value, cst.SimpleString) and index.value.evaluated_value == slot[1]:
        return target.value
    return None


def bound_from_return(stmt: cst.CSTNode, call: cst.Call, slot: tuple) -> Optional[str]:
    """The caller's reference to the returned slot when `stmt` is `target = call` (target a name or,
    for a tuple, a tuple of names of the same length)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return None
    small = stmt.body[0]
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
        return None
    if small.value is not call:
        return indexed_return(small, call, slot)  # `x = f(...)[0]`: one slot of the returned value
    target = small.targets[0].target
    if slot[0] == "whole":
        return dotted(target)
    if slot[0] == "item":
        if isinstance(target, (cst.Tuple, cst.List)):
            els = target.elements
            if len(els) == slot[2] and not any(isinstance(e, cst.StarredElement) for e in els):
                return dotted(els[slot[1]].value)
            return None
        base = dotted(target)
        return f"{base}[{slot[1]}]" if base else None
    if slot[0] == "key":
        base = dotted(target)
        k = slot[1]
        if base and k.isprintable() and '"' not in k and "\\" not in k:
            return f'{base}["{k}"]'
    return None


def iterated_ref(expr: cst.BaseExpression, aliases_q) -> Optional[str]:
    """The reference a for-loop iterates over (see `ref_text`), looking through
    enumerate()/tqdm()/iter()/zip(); the first one when several are iterated together."""
    refs = iterated_refs(expr, aliases_q)
    return refs[0] if refs else None


# --- data flow: what a loop consumes, through wrappers and generators (issue 13) -------------------
# Calls whose iteration yields the items of their first argument (enumerate, a progress bar, ...) and
# calls that iterate all their positional arguments together (zip, chain): a loop over such a call
# consumes every loader it is given, and `pbar = tqdm(loader)` makes `pbar` another name for it.
def iterated_refs(expr: cst.BaseExpression, aliases_q) -> List[str]:
    """Every reference (see `ref_text`) whose items a loop over `expr` consumes: the iterable itself,
    or the iterables handed to a pass-through wrapper of the library table (enumerate(), iter(), a
    tqdm bar, itertools.cycle(): the first argument; zip(), itertools.chain(): every positional
    argument), nested in any order."""
    d = ref_text(expr)
    if d is not None:
        return [d]
    if not isinstance(expr, cst.Call):
        return []
    row = row_of(aliases_q, expr.func)
    if row is not None and row.kind == "wrapper" and row.items == "all":
        out: List[str] = []
        for a in expr.args:
            if a.keyword is None and not a.star:
                out += [r for r in iterated_refs(a.value, aliases_q) if r not in out]
        return out
    inner = _first_items(expr, aliases_q)
    return iterated_refs(inner, aliases_q) if inner is not None else []


def _first_items(expr: cst.Call, aliases_q) -> Optional[cst.BaseExpression]:
    """The iterable whose items a call of a first-argument wrapper (enumerate(), iter(), a tqdm bar,
    itertools.cycle()/islice()) yields (its first argument), else None."""
    row = row_of(aliases_q, expr.func)
    if row is not None and row.kind == "wrapper" and row.items == "first":
        a = arg(expr, 0, "iterable")
        if a is not None and not a.star:
            return a.value
    return None


def _data_of(expr: cst.BaseExpression, aliases_q) -> cst.BaseExpression:
    """What a loop over `expr` reads, seen through enumerate()/tqdm()/iter() (their first argument)."""
    while isinstance(expr, cst.Call):
        inner = _first_items(expr, aliases_q)
        if inner is None:
            break
        expr = inner
    return expr


def _loop_var(loop: cst.For) -> Optional[str]:
    return loop.target.value if isinstance(loop.target, cst.Name) else None


def parameters_receiver(call: cst.CSTNode) -> Optional[str]:
    """`X` (dotted) of ``X.parameters()`` / ``X.named_parameters()``, also where the module is reached
    through ``runtime.unwrap(X)`` (distify's DDP output: the same parameters, the original's names);
    None for any other call."""
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in ("parameters", "named_parameters")):
        return None
    e = call.func.value
    if (isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value == "unwrap"
            and len(e.args) == 1 and e.args[0].keyword is None and not e.args[0].star):
        return dotted(e.args[0].value)
    return dotted(e)


def _parameter_roots(expr: cst.BaseExpression, instance: Optional[str] = None) -> List[str]:
    """Dotted roots of `X.parameters()` / `X.sub.parameters()` calls in an optimizer's params; on the
    method's `instance` (whatever it is spelled), the attribute: `self.model` of `self.model.parameters()`."""
    roots: List[str] = []

    class V(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            d = parameters_receiver(node)
            if d:
                parts = d.split(".")
                root = ".".join(parts[:2]) if parts[0] == instance and len(parts) > 1 else parts[0]
                if root not in roots:
                    roots.append(root)

    expr.visit(V())
    return roots


def optimizer_parameter_roots(facts, scope, stmt: cst.CSTNode, expr: cst.BaseExpression) -> List[str]:
    """The models whose parameters an optimizer's `params` argument holds: `_parameter_roots` of the
    expression, or – when it is a plain name (`params = [p for p in model.parameters() if
    p.requires_grad]; SGD(params, ...)`, the torchvision detection recipe) – of the one value that
    name is bound to in `scope` before `stmt`. A name bound more than once, augmented, or reached
    through an attribute in the scope (`params.append(...)`, `params.extend(...)`: it may gain another
    model's parameters) gives no roots: the optimizer's model stays unknown."""
    inst = facts.instance(scope)
    instance = inst[0] if inst is not None else None
    roots = _parameter_roots(expr, instance)
    if roots or not isinstance(expr, cst.Name):
        return roots
    name = expr.value
    bound = facts.bindings(scope).get(name, [])
    if len(bound) != 1 or bound[0].kind != "assign" or facts.reaching_binding(scope, name, stmt) is not bound[0]:
        return []
    line = bound[0].stmt
    assign = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else line
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)):
        return []
    for node, parents, _nested in facts.uses(scope, name):
        if parents and isinstance(parents[-1], cst.Attribute) and parents[-1].value is node:
            return []
    return _parameter_roots(assign.value, instance)
