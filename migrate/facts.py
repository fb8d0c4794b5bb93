"""Program facts the anatomy answers questions about: bindings, uses, callers, guards, loops.

The anatomy (``distify.anatomy``) owns this module: it builds one ``Facts`` from its visitor pass
and exposes the queries as its own methods. Rules, the output audit and ``distify lint`` ask these
questions instead of carrying their own def-use machinery, so a new check is a question, not a new
analyser. Everything here is read-only and works on the records the anatomy's single pass made
(statements in source order with their enclosing statements and scope, every call site).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterator, List, Optional, Set, Tuple, Union

import libcst as cst

from distify.walk import walk

Scope = Union[cst.Module, cst.FunctionDef]


def dotted(expr: Optional[cst.CSTNode]) -> Optional[str]:
    """'a.b.c' for Name/Attribute chains, else None."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        base = dotted(expr.value)
        return f"{base}.{expr.attr.value}" if base else None
    return None


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


@dataclass(eq=False)
class Binding:
    """One statement binding a name in a scope."""

    stmt: cst.CSTNode
    kind: str  # assign (`x = ...`) | aug (`x += ...`) | other (for target, with-as, def, import...)
    literal: bool  # bound to a number literal (`x = 0`, `a, b = 0, 0.0`)


# ------------------------------------------------------------------------------ rank conditions

# identifiers that make a condition depend on which process evaluates it
_RANK = re.compile(
    r"(^|_)rank(_?0|_?zero)?$|^is_main(_process)?$|^main_process$|^is_master(_process)?$"
    r"|^is_(global|local)_zero$|^is_rank_?(0|zero)$"
)


def rank_dependent(test: cst.BaseExpression, rank_names: FrozenSet[str] = frozenset()) -> bool:
    """True when a condition reads the rank (or asks "am I the main process?"): the one notion of a
    rank condition every rule and check uses (through ``Facts.rank_condition``, which also knows
    the names the script binds to a rank: ``self.gpu_id = int(os.environ["LOCAL_RANK"])``).

    Comparisons of a rank with -1 alone (``local_rank != -1``) are skipped: they tell a
    distributed launch from a plain one and are equal on every rank."""
    hits: List[str] = []

    class V(cst.CSTVisitor):
        def visit_Comparison(self, node: cst.Comparison) -> Optional[bool]:
            if (_rank_ref(node.left) or dotted(node.left) in rank_names) and all(
                isinstance(t.operator, (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)) and _is_minus_one(t.comparator)
                for t in node.comparisons
            ):
                return False  # `rank != -1`: do not look inside
            return True

        def visit_Name(self, node: cst.Name) -> None:
            if _RANK.search(node.value.lower()) or node.value in rank_names:
                hits.append(node.value)

        def visit_Attribute(self, node: cst.Attribute) -> Optional[bool]:
            if rank_names and dotted(node) in rank_names:
                hits.append(dotted(node))
                return False
            return True

    walk(test, V())
    return bool(hits)


# environment variables that hold a rank (torchrun, horovodrun, Open MPI, SLURM)
RANK_ENV = frozenset({
    "RANK", "LOCAL_RANK", "HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID", "PMI_RANK",
})


def reads_rank(expr: cst.CSTNode, rank_names: FrozenSet[str] = frozenset()) -> bool:
    """The expression's value differs between ranks: it reads a rank (a rank call or name, a name
    bound to one, or a rank environment variable such as ``os.environ["LOCAL_RANK"]``). A
    comparison with -1 (``int(os.environ.get("RANK", -1)) != -1``: launched distributed or not) is
    the same on every rank."""
    if rank_dependent(expr, rank_names):
        return True
    hits: List[str] = []

    class V(cst.CSTVisitor):
        def visit_Comparison(self, node: cst.Comparison) -> bool:
            return not all(
                isinstance(t.operator, (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)) and _is_minus_one(t.comparator)
                for t in node.comparisons
            )

        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            try:
                value = node.evaluated_value
            except Exception:  # noqa: BLE001 - an odd literal is no rank variable
                return
            if isinstance(value, str) and value in RANK_ENV:
                hits.append(value)

    walk(expr, V())
    return bool(hits)


# calls whose value is a number or flag made from their arguments: `int(os.environ["RANK"])`
VALUE_CALLS = frozenset({"int", "str", "float", "bool", "min", "max", "abs", "round", "os.environ.get", "os.getenv"})


def _rank_value_part(expr: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """`expr` when its value can be a rank or a flag derived from one (names, arithmetic,
    comparisons, rank calls, `int(...)` of those), None when it is an object built by a call
    that merely takes a rank argument (`DistributedSampler(ds, rank=r)`, `DDP(m, [local_rank])`)."""
    for n in all_nodes(expr):
        if isinstance(n, cst.Call):
            d = dotted(n.func) or ""
            last = d.rsplit(".", 1)[-1]
            if d in VALUE_CALLS or _RANK.search(last.lower()) or d.endswith(("environ.get", "getenv")):
                continue
            if n.args:
                return None
    return expr


def _rank_ref(expr: cst.BaseExpression) -> bool:
    """The left side of a comparison is a rank reference (name, attribute or call)."""
    if isinstance(expr, cst.Call):
        expr = expr.func
    last = expr.attr if isinstance(expr, cst.Attribute) else expr
    return isinstance(last, cst.Name) and bool(_RANK.search(last.value.lower()))


def _is_minus_one(expr: cst.BaseExpression) -> bool:
    return (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
        and expr.expression.value == "1"
    )


def branch_of(node: cst.If, target: cst.CSTNode) -> Optional[str]:
    """Which branch of `node` holds `target`: "body", "orelse" (else or elif) or None (the test)."""
    if contains_node(node.body, target):
        return "body"
    if node.orelse is not None and contains_node(node.orelse, target):
        return "orelse"
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


# ------------------------------------------------------------------------------ the queries


class Facts:
    """Queries over one analysed module (built by ``distify.anatomy.analyse``)."""

    def __init__(self, module, calls, functions, methods, stmt_parent, stmt_scope, assigns=()) -> None:
        self.module = module
        self.assigns = assigns  # (Assign, statement, scope, class) in source order
        self.calls = calls
        self.functions = functions  # module-level functions by name
        self.methods = methods  # method -> its class
        self.stmt_parent = stmt_parent  # statement -> enclosing statements in its scope, outermost first
        self.stmt_scope = stmt_scope
        self._order: Optional[Dict[cst.CSTNode, int]] = None
        self._by_callee: Optional[Dict[str, list]] = None
        self._callers: Dict[Tuple[int, bool], list] = {}
        self._bindings: Dict[int, Dict[str, List[Binding]]] = {}
        self._rank_names: Optional[FrozenSet[str]] = None
        self._trains: Dict[int, bool] = {}
        self.trainers: FrozenSet[cst.FunctionDef] = frozenset()  # functions that train (set by the anatomy)

    # order and nesting -------------------------------------------------------------------
    def order(self, stmt: cst.CSTNode) -> int:
        """Source order of a statement (its index in the analysis pass), -1 when unknown."""
        if self._order is None:
            self._order = {s: i for i, s in enumerate(self.stmt_parent)}
        return self._order.get(stmt, -1)

    def statements(self, scope: Optional[Scope] = None) -> Iterator[cst.CSTNode]:
        """Every statement in source order (of one scope when given; nested statements included)."""
        for s in self.stmt_parent:
            if scope is None or self.stmt_scope.get(s) is scope:
                yield s

    def all_functions(self) -> List[cst.FunctionDef]:
        """Every function definition, nested ones and methods included, in source order."""
        return [s for s in self.stmt_parent if isinstance(s, cst.FunctionDef)]

    def loops_around(self, stmt: cst.CSTNode) -> List[cst.CSTNode]:
        """The for/while statements enclosing `stmt` in its scope, outermost first."""
        return [p for p in self.stmt_parent.get(stmt, ()) if isinstance(p, (cst.For, cst.While))]

    @property
    def rank_names(self) -> FrozenSet[str]:
        """Dotted names the script binds to a rank: ``self.gpu_id = int(os.environ["LOCAL_RANK"])``,
        ``gpu = dist.get_rank() % torch.cuda.device_count()`` (followed through chains of them)."""
        if self._rank_names is None:
            # one walk per assignment, then a fixpoint over the names each value reads
            pending = []
            found: Set[str] = set()
            for a, _stmt, _scope, _cls in self.assigns:
                name = dotted(a.targets[0].target) if len(a.targets) == 1 else None
                if not name:
                    continue
                value = _rank_value_part(a.value)
                if value is None:
                    continue  # an object built from a rank (a sampler, a wrapped model) is no rank
                if reads_rank(value):
                    found.add(name)
                else:
                    read = {dotted(n) for n in all_nodes(value) if isinstance(n, (cst.Name, cst.Attribute))}
                    pending.append((name, read))
            functions = [fn for fn in self.all_functions() if self.callers(fn)]
            changed = True
            while changed:
                changed = False
                for name, read in pending:
                    if name not in found and read & found:
                        found.add(name)
                        changed = True
                # a parameter every caller passes a rank to: `Trainer(model, data, rank)` / `gpu_id`
                for fn in functions:
                    for p in self.params(fn):
                        if p in found:
                            continue
                        values = [self.bound_value(c.call, fn, p) for c in self.callers(fn)]
                        if all(v is not None and reads_rank(v, frozenset(found)) for v in values):
                            found.add(p)
                            changed = True
            self._rank_names = frozenset(found)
        return self._rank_names

    def rank_condition(self, test: cst.BaseExpression) -> bool:
        """A condition that is not the same on every rank (see ``rank_dependent``)."""
        return rank_dependent(test, self.rank_names)

    def rank_guards(self, stmt: cst.CSTNode) -> List[Tuple[cst.If, str]]:
        """The rank conditions enclosing `stmt` in its scope, outermost first, with the branch the
        statement is in ("body" or "orelse"). A statement that is itself an `if` on the rank is
        not under its own condition."""
        out = []
        parents = self.stmt_parent.get(stmt, ())
        for i, parent in enumerate(parents):
            if isinstance(parent, cst.If) and self.rank_condition(parent.test):
                inner = parents[i + 1] if i + 1 < len(parents) else stmt
                side = branch_of(parent, inner)
                if side is not None:
                    out.append((parent, side))
        return out

    def in_rank_guard(self, stmt: cst.CSTNode) -> bool:
        """The statement sits under an `if` on the rank (see ``rank_condition``)."""
        return any(isinstance(p, cst.If) and self.rank_condition(p.test) for p in self.stmt_parent.get(stmt, ()))

    def runs_on_some_ranks(self, stmt: cst.CSTNode, depth: int = 0) -> bool:
        """`stmt` runs on some ranks only: under a rank condition, after an early
        ``if <rank condition>: return`` of its function, or in a function every caller of which
        (at least one) runs on some ranks only."""
        if self.in_rank_guard(stmt):
            return True
        scope = self.stmt_scope.get(stmt)
        if not isinstance(scope, cst.FunctionDef):
            return False
        at = self.order(stmt)
        for s in scope.body.body:
            if self.order(s) >= at:
                break
            if (
                isinstance(s, cst.If)
                and self.rank_condition(s.test)
                and any(isinstance(n, (cst.Return, cst.Raise)) for n in all_nodes(s.body, skip_nested=True))
            ):
                return True
        sites = self.callers(scope)
        return depth < 4 and bool(sites) and all(self.runs_on_some_ranks(c.stmt, depth + 1) for c in sites)

    def call_on_some_ranks(self, site) -> bool:
        """A call runs on some ranks only: its statement does (``runs_on_some_ranks``), or the call
        sits in a branch of a conditional expression on the rank (``W() if rank == 0 else None``)
        or after a rank test in an ``and`` (``is_main and wandb.init()``)."""
        if self.runs_on_some_ranks(site.stmt):
            return True
        for n in all_nodes(site.stmt, skip_nested=True):
            if isinstance(n, cst.IfExp) and self.rank_condition(n.test):
                if contains_node(n.body, site.call) or contains_node(n.orelse, site.call):
                    return True
            elif isinstance(n, cst.BooleanOperation) and isinstance(n.operator, cst.And):
                if self.rank_condition(n.left) and contains_node(n.right, site.call):
                    return True
        return False

    # training ----------------------------------------------------------------------------
    def trains(self, node: cst.CSTNode) -> bool:
        """`node` (a loop, a body) runs ``backward()`` or an optimizer ``step()``, itself or by
        calling a function or method of this module that trains (``self.trainers``, the anatomy's
        ``training_functions``, or a nested function whose body trains)."""
        key = id(node)
        if key not in self._trains:
            self._trains[key] = False  # a nested function calling itself
            scope = node if isinstance(node, cst.FunctionDef) else self.stmt_scope.get(node)
            found = False
            for n in all_nodes(node.body if isinstance(node, cst.FunctionDef) else node):
                if training_call(n):
                    found = True
                    break
                if isinstance(n, cst.Call) and scope is not None:
                    fn = self.callee(n, scope)
                    if fn is not None and (fn in self.trainers or (fn not in self.methods and self.trains(fn))):
                        found = True
                        break
            self._trains[key] = found
        return self._trains[key]

    def training_loops(self) -> List[cst.CSTNode]:
        """Every for/while loop whose body trains (itself or through a called function)."""
        out = getattr(self, "_training_loops", None)
        if out is None:
            out = [
                s for s in self.stmt_parent if isinstance(s, (cst.For, cst.While)) and self.trains(s)
            ]
            self._training_loops = out
        return out

    def on_training_path(self, stmt: cst.CSTNode, depth: int = 0) -> bool:
        """`stmt` runs once per step or epoch: inside a loop that trains, or in a function called
        (at some depth) from such a place."""
        loops = set(map(id, self.training_loops()))
        if any(id(p) in loops for p in self.stmt_parent.get(stmt, ())):
            return True
        scope = self.stmt_scope.get(stmt)
        if not isinstance(scope, cst.FunctionDef) or depth >= 4:
            return False
        return any(self.on_training_path(c.stmt, depth + 1) for c in self.callers(scope))

    # calls -------------------------------------------------------------------------------
    def callers(self, fn: cst.FunctionDef, any_receiver: bool = False) -> list:
        """Call sites of `fn`: a module-level function by its name, a nested function from the
        scope that defines it, a method through ``self`` in its own class, ``__init__`` where its
        (module-level) class is called. ``any_receiver``: for a
        method, every ``x.name(...)`` call (the sites that may call it, for checks that must see
        every use)."""
        key = (id(fn), any_receiver)
        if key in self._callers:
            return self._callers[key]
        if self._by_callee is None:
            self._by_callee = {}
            for c in self.calls:
                d = dotted(c.call.func)
                if d is not None:
                    self._by_callee.setdefault(d, []).append(c)
        name = fn.name.value
        cls = self.methods.get(fn)
        if cls is None:
            home = self.stmt_scope.get(fn)
            out = [
                c for c in self._by_callee.get(name, ()) if self.functions.get(name) is fn or c.scope is home
            ]
        elif any_receiver:
            out = [c for c in self.calls if isinstance(c.call.func, cst.Attribute) and c.call.func.attr.value == name]
        else:
            out = [c for c in self._by_callee.get(f"self.{name}", ()) if c.cls is cls]
            if name == "__init__" and isinstance(self.stmt_scope.get(cls), cst.Module):
                out += self._by_callee.get(cls.name.value, [])  # `Trainer(model, loader)` runs __init__
        self._callers[key] = out
        return out

    def callee(self, call: cst.Call, scope: Scope) -> Optional[cst.FunctionDef]:
        """The function of this module a call runs: `f(...)` of a function nested in the calling
        scope (or one around it) or of a module-level `f`, or `self.m(...)` of a method of the
        enclosing class."""
        d = dotted(call.func)
        if d is None:
            return None
        here = scope
        while isinstance(here, cst.FunctionDef) and "." not in d:  # a function nested in this one
            for s in here.body.body:
                if isinstance(s, cst.FunctionDef) and s.name.value == d:
                    return s
            here = self.stmt_scope.get(here)
        if d in self.functions:
            return self.functions[d]
        if d.startswith("self.") and d.count(".") == 1 and isinstance(scope, cst.FunctionDef):
            cls = self.methods.get(scope)
            for m, k in self.methods.items():
                if k is cls and m.name.value == d[5:]:
                    return m
        return None

    def params(self, fn: cst.FunctionDef) -> List[str]:
        """The positional parameters a call binds, in order (`self` of a method left out)."""
        params = [p.name.value for p in fn.params.params]
        if fn in self.methods and params and params[0] == "self":
            params = params[1:]
        return params

    def param_for(self, fn: cst.FunctionDef, call: cst.Call, a: cst.Arg) -> Optional[str]:
        """The parameter of `fn` that argument `a` of `call` binds (None when unsure: * or **)."""
        params = self.params(fn)
        if any(x.star for x in call.args):
            return None
        if a.keyword is not None:
            kw = a.keyword.value
            ok = kw in params or kw in [p.name.value for p in fn.params.kwonly_params]
            return kw if ok else None
        positional = [x for x in call.args if x.keyword is None]
        i = next(i for i, x in enumerate(positional) if x is a)
        return params[i] if i < len(params) else None

    def bound_value(self, call: cst.Call, fn: cst.FunctionDef, param: str) -> Optional[cst.BaseExpression]:
        """The expression `call` passes for `fn`'s parameter `param` (None when it passes none)."""
        params = self.params(fn)
        a = arg(call, params.index(param) if param in params else None, param)
        return a.value if a is not None else None

    # bindings and uses -------------------------------------------------------------------
    def bindings(self, scope: Scope) -> Dict[str, List[Binding]]:
        """Every name the statements of `scope` bind, each with its bindings in source order."""
        cached = self._bindings.get(id(scope))
        if cached is not None:
            return cached
        out: Dict[str, List[Binding]] = {}
        for stmt in self.statements(scope):
            for name, literal, kind in stmt_bindings(stmt):
                out.setdefault(name, []).append(Binding(stmt, kind, literal))
        self._bindings[id(scope)] = out
        return out

    def reaching_binding(self, scope: Scope, name: str, stmt: cst.CSTNode) -> Optional[Binding]:
        """The last binding of `name` in `scope` written before `stmt` (source order)."""
        at = self.order(stmt)
        before = [b for b in self.bindings(scope).get(name, []) if self.order(b.stmt) < at]
        return before[-1] if before else None

    def uses(self, scope: Scope, name: str):
        """Every expression spelling `name` in `scope` (see ``uses``)."""
        return uses(scope, name)

    # gradient accumulation ------------------------------------------------------------------
    def step_condition(self, test: cst.BaseExpression, at: cst.CSTNode) -> Optional[Tuple[cst.BaseExpression, cst.BaseExpression]]:
        """For the test of an ``if`` that steps an optimizer, ``(condition, n)`` when it is the
        accumulation idiom: a ``<x> % n == 0`` comparison itself, or one operand of an ``or``
        (``... or step + 1 == len(loader)``: the pass's last micro-batch steps too), or a name
        bound to such a value before ``at`` in its scope (``last = (i + 1) % accum == 0`` ...
        ``if last:``). ``condition`` is the expression to evaluate where the micro-batch starts:
        the test, or the bound value in place of the name. None for any other test."""
        if isinstance(test, cst.Name):
            scope = self.stmt_scope.get(at)
            b = self.reaching_binding(scope, test.value, at) if scope is not None else None
            small = b.stmt.body[0] if b is not None and isinstance(b.stmt, cst.SimpleStatementLine) and len(b.stmt.body) == 1 else None
            if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and dotted(small.targets[0].target) == test.value):
                return None
            found = self.step_condition(small.value, at)
            return (small.value, found[1]) if found is not None and not isinstance(small.value, cst.Name) else None
        n = _modulus(test)
        if n is None and isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
            n = _modulus(test.left) or _modulus(test.right)
        return (test, n) if n is not None else None


    # rebinding (#14): what a name holds lasts from one binding to the next ------------------
    def rebindings(self, scope: Scope, name: str) -> List[cst.CSTNode]:
        """Statements of `scope` (source order) that bind `name`; a dotted name (``self.model``)
        by assignment."""
        if "." not in name:
            return [b.stmt for b in self.bindings(scope).get(name, [])]
        return [
            s for s in self.statements(scope)
            if isinstance(s, cst.SimpleStatementLine)
            and any(
                isinstance(small, cst.Assign) and any(dotted(t.target) == name for t in small.targets)
                or isinstance(small, (cst.AnnAssign, cst.AugAssign)) and dotted(small.target) == name
                for small in s.body
            )
        ]

    def keeps(self, stmt: cst.CSTNode, name: str) -> bool:
        """`stmt` rebinds `name` to the object it held: `name = name.to(device)` (see keeps_object),
        or `name = f(..., name, ...)` where the module function f returns that parameter on every
        return (`model_ft = train_model(model_ft, ...)` ending in `return model`)."""
        if keeps_object(stmt, name):
            return True
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
            return False
        small = stmt.body[0]
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and dotted(small.targets[0].target) == name):
            return False
        call = small.value
        fn = self.functions.get(dotted(call.func) or "") if isinstance(call, cst.Call) else None
        if fn is None:
            return False
        params = [p for p in self.params(fn) if (a := self.bound_value(call, fn, p)) is not None and dotted(a) == name]
        returns = [n for n in all_nodes(fn.body, skip_nested=True) if isinstance(n, cst.Return)]
        return bool(params) and bool(returns) and all(r.value is not None and dotted(r.value) in params for r in returns)

    def reaches_backward(self, scope: Scope, stmt: cst.CSTNode) -> bool:
        """Whether a value computed by the simple statement ``stmt`` reaches a ``.backward()`` in
        ``scope``: the statement calls it itself, or it binds a name that a later statement reads
        and that one does (``penalty = w.pow(2).sum()``; ``loss = ce + penalty``; ``loss.backward()``),
        through any chain of such bindings. Autograd then runs through the value."""

        def calls_backward(s: cst.CSTNode) -> bool:
            return any(
                isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "backward"
                for n in all_nodes(s, skip_nested=True)
            )

        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        if calls_backward(stmt):
            return True
        tainted = {name for name, _, _ in stmt_bindings(stmt)}
        for s in self.statements(scope):
            if not tainted:
                return False
            if not isinstance(s, cst.SimpleStatementLine) or s is stmt or not self.order(stmt) < self.order(s):
                continue
            if {n.value for n, how in names(s) if how == "load"} & tainted:
                if calls_backward(s):
                    return True
                tainted |= {name for name, _, _ in stmt_bindings(s)}
        return False

    def holds(self, scope: Scope, name: str, since: cst.CSTNode, use: cst.CSTNode) -> str:
        """Whether `name` at statement `use` still holds the object statement `since` gave it:
        "yes" (no binding in between), "no" (a binding in between runs on every path to `use`),
        or "maybe" (one runs on some paths only: under an ``if``, in a ``try``, or later in a loop
        around both). ``model = model.to(device)`` keeps the object (see ``keeps_object``); an
        assignment's own right-hand side still reads the old value."""
        answer = "yes"
        use_parents = self.stmt_parent.get(use, ())
        since_parents = self.stmt_parent.get(since, ())
        for stmt in self.rebindings(scope, name):
            if stmt is since or self.order(stmt) < self.order(since) or self.keeps(stmt, name):
                continue
            if since in self.stmt_parent.get(stmt, ()):
                continue  # inside `since` itself (`if args.compile: model = torch.compile(model)`)
            if stmt in use_parents:
                return "no"  # `for model in ...:` / `with ... as model:` around the use
            parents = self.stmt_parent.get(stmt, ())
            if stmt is not use and self.order(stmt) < self.order(use):
                if parents == use_parents[: len(parents)]:
                    return "no"  # its block encloses the use: it runs on every path to the use
                answer = "maybe"
            elif any(isinstance(p, (cst.For, cst.While)) and p in parents and p not in since_parents for p in use_parents):
                answer = "maybe"  # later in a loop around both: the next pass sees it
        return answer


# nn.Module methods that return the module itself: `model = model.to(device)` keeps the object
SELF_RETURNING = frozenset({
    "to", "cuda", "cpu", "train", "eval", "float", "double", "half", "bfloat16", "type", "apply",
    "requires_grad_", "to_empty", "share_memory",
})


def _modulus(test: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """n of a ``<x> % n == 0`` (or ``!= 0``... any comparison whose left side is a modulo)."""
    if isinstance(test, cst.Comparison) and isinstance(test.left, cst.BinaryOperation):
        if isinstance(test.left.operator, cst.Modulo):
            return test.left.right
    return None


def keeps_object(stmt: cst.CSTNode, name: str) -> bool:
    """`name = name.to(device)` (or .cuda(), .train(), ... chained): the name holds the same object."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return False
    small = stmt.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1 or dotted(small.targets[0].target) != name:
        return False
    v = small.value
    while isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and v.func.attr.value in SELF_RETURNING:
        v = v.func.value
    return v is not small.value and dotted(v) == name


def training_call(n: cst.CSTNode) -> bool:
    """``x.backward()``, or ``x.step()`` of something that is not a scheduler or a grad scaler."""
    if not isinstance(n, cst.Call) or not isinstance(n.func, cst.Attribute):
        return False
    attr = n.func.attr.value
    if attr == "backward":
        return True
    if attr == "step":
        owner = dotted(n.func.value) or ""
        return "sched" not in owner and "scaler" not in owner
    return False


# ------------------------------------------------------------------------------ name walking


def all_nodes(node: cst.CSTNode, skip_nested: bool = False) -> Iterator[cst.CSTNode]:
    """`node` and everything below it but syntactic trivia, in source order (not below nested
    defs/lambdas/classes with skip_nested). Uses the fast read-only walk."""
    out: List[cst.CSTNode] = []
    nested = (cst.FunctionDef, cst.Lambda, cst.ClassDef)

    class V(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            out.append(n)
            return not (skip_nested and n is not node and isinstance(n, nested))

    walk(node, V())
    return iter(out)


def names(node: cst.CSTNode, how: str = "load") -> Iterator[Tuple[cst.Name, str]]:
    """Every variable name in `node` with how it is used: load, store, or aug (`x += ...`)."""
    if isinstance(node, cst.Name):
        yield node, how
    elif isinstance(node, cst.Attribute):
        yield from names(node.value)
    elif isinstance(node, cst.Subscript):
        yield from names(node.value)
        for el in node.slice:
            yield from names(el)
    elif isinstance(node, (cst.Tuple, cst.List)) and how == "store":
        for el in node.elements:
            yield from names(el.value, how)
    elif isinstance(node, cst.StarredElement) and how == "store":
        yield from names(node.value, how)
    elif isinstance(node, cst.Assign):
        yield from names(node.value)
        for t in node.targets:
            yield from names(t.target, "store")
    elif isinstance(node, cst.AugAssign):
        yield from names(node.value)
        yield from names(node.target, "aug" if isinstance(node.target, cst.Name) else "load")
    elif isinstance(node, cst.AnnAssign):
        if node.value is not None:
            yield from names(node.value)
        yield from names(node.target, "store")
    elif isinstance(node, (cst.For, cst.CompFor)):
        yield from names(node.iter)
        yield from names(node.target, "store")
        for c in node.children:
            if c is not node.iter and c is not node.target:
                yield from names(c)
    elif isinstance(node, cst.WithItem):
        yield from names(node.item)
        if node.asname is not None:
            yield from names(node.asname.name, "store")
    elif isinstance(node, cst.NamedExpr):
        yield from names(node.value)
        yield from names(node.target, "store")
    elif isinstance(node, cst.Del):
        yield from names(node.target, "store")
    elif isinstance(node, cst.Arg):
        yield from names(node.value)
    elif isinstance(node, cst.Param):
        if node.default is not None:
            yield from names(node.default)
    elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        for d in node.decorators:
            yield from names(d)
        yield from names(node.body)
    elif isinstance(node, (cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal)):
        return
    else:
        for c in node.children:
            yield from names(c)


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


def optimizer_keeps_tensors(qualname: Optional[str], call: cst.Call) -> Optional[bool]:
    """Whether an optimizer built by `call` keeps a tensor per parameter in its state (Adam's
    moments, SGD's momentum buffer): False for ``torch.optim.SGD`` without momentum (its state
    holds ``momentum_buffer: None`` only), True for the other ``torch.optim`` classes (every one
    keeps a tensor per parameter) and for SGD with a non-zero literal momentum, None when unknown
    (momentum from a variable, an optimizer from another library)."""
    if not qualname or not qualname.startswith("torch.optim."):
        return None
    if qualname.rsplit(".", 1)[-1] != "SGD":
        return True
    momentum = arg(call, 2, "momentum")
    if momentum is None:
        return False
    value = momentum.value
    if _number(value):
        return float(value.value.replace("_", "")) != 0
    return None


def stmt_bindings(stmt: cst.CSTNode) -> Iterator[Tuple[str, bool, str]]:
    """(name, bound to a number literal, kind) for each name the statement itself binds."""
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                for t in small.targets:
                    tgt, val = t.target, small.value
                    if isinstance(tgt, cst.Name):
                        yield tgt.value, _number(val), "assign"
                    elif isinstance(tgt, (cst.Tuple, cst.List)):
                        values = (
                            [el.value for el in val.elements] if isinstance(val, (cst.Tuple, cst.List)) else None
                        )
                        targets = [el.value for el in tgt.elements]
                        paired = values is not None and len(values) == len(targets)
                        for i, el in enumerate(targets):
                            for n, how in names(el, "store"):
                                literal = paired and el is n and _number(values[i])
                                yield n.value, literal, "assign"
            elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                literal = small.value is not None and _number(small.value)
                yield small.target.value, literal, "assign" if small.value is not None else "other"
            elif isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
                yield small.target.value, False, "aug"
            else:
                for n, how in names(small):
                    if how == "store":
                        yield n.value, False, "other"
    else:
        for n, how in header_names(stmt):
            if how == "store":
                yield n.value, False, "other"
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            yield stmt.name.value, False, "other"


def uses(scope: Scope, name: str) -> Iterator[Tuple[cst.CSTNode, Tuple[cst.CSTNode, ...], bool]]:
    """Every expression spelling `name` in the scope: (node, its ancestors, inside a nested def).

    A module scope skips function and class bodies (each function is a scope of its own); a
    function scope reports what it finds in nested functions and lambdas as nested.
    """
    dotted_name = "." in name

    def visit(node: cst.CSTNode, parents: Tuple[cst.CSTNode, ...], nested: bool):
        if isinstance(node, cst.Attribute):
            if dotted(node) == name:
                yield node, parents, nested
                return
            yield from visit(node.value, parents + (node,), nested)
            return
        if isinstance(node, cst.Name):
            if not dotted_name and node.value == name:
                yield node, parents, nested
            return
        if isinstance(node, cst.Arg):
            yield from visit(node.value, parents + (node,), nested)
            return
        if isinstance(node, cst.Param):
            if node.default is not None:
                yield from visit(node.default, parents + (node,), nested)
            return
        if isinstance(node, (cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal)):
            return
        if node is not scope and isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            if isinstance(scope, cst.Module) and not isinstance(node, cst.Lambda):
                return
            for c in node.children:
                if isinstance(c, cst.Name) and not isinstance(node, cst.Lambda):
                    continue
                yield from visit(c, parents + (node,), True)
            return
        if isinstance(node, cst.FunctionDef):  # the scope itself: its body, not its signature
            yield from visit(node.body, parents + (node,), nested)
            return
        for c in node.children:
            yield from visit(c, parents + (node,), nested)

    yield from visit(scope, (), False)


__all__ = [
    "Binding", "Facts", "all_nodes", "arg", "branch_of", "contains_node", "dotted", "header_names",
    "keeps_object", "names", "rank_dependent", "stmt_bindings", "uses",
]


# ------------------------------------------------------------------------------ submodule containers

CONTAINERS = frozenset({
    "torch.nn.ModuleList", "torch.nn.Sequential", "torch.nn.modules.container.ModuleList",
    "torch.nn.modules.container.Sequential",
})
MODULE_DICTS = frozenset({"torch.nn.ModuleDict", "torch.nn.modules.container.ModuleDict"})


@dataclass(frozen=True)
class RepeatedBlocks:
    """A ModuleList / Sequential attribute of a model class holding repeated blocks.

    ``path`` is the attribute path from the model (``blocks``, ``transformer.h``), ``owner`` the
    class whose ``__init__`` builds it, ``container`` its class as written (``nn.ModuleList``),
    ``member`` the block constructor as written (``Block``) and ``how`` either ``repetition``
    (``[Block(...) for _ in range(n)]``, ``*[...]``, ``.append`` in a ``for`` loop) or
    ``instances`` (two or more ``Block(...)`` of the same class of this file written out)."""

    path: str
    owner: str
    container: str
    member: str
    how: str


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

    for node in all_nodes(init.body):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            target = dotted(node.targets[0].target)
            if target and target.startswith("self.") and target.count(".") == 1:
                container_of(target[5:], node.value)
        elif (
            isinstance(node, cst.For)
            and isinstance(node.iter, cst.Call)
            and dotted(node.iter.func) == "range"
        ):
            for call in all_nodes(node.body):
                if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
                    continue
                owner = dotted(call.func.value) or ""
                if call.func.attr.value == "append" and owner[5:] in empty and owner.startswith("self.") and len(call.args) == 1:
                    member = call.args[0].value
                    path = owner[5:]
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
