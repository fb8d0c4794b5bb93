"""Program facts the anatomy answers questions about: bindings, uses, callers, guards, loops.

The anatomy (``distify.anatomy``) owns this module: it builds one ``Facts`` from its visitor pass
and exposes the queries as its own methods. Rules, the output audit and ``distify lint`` ask these
questions instead of carrying their own def-use machinery, so a new check is a question, not a new
analyser. Everything here is read-only and works on the records the anatomy's single pass made
(statements in source order with their enclosing statements and scope, every call site).
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Iterator, List, Optional, Tuple

import libcst as cst

from distify.rank import branch_of, rank_dependent
from distify.grad_values import gradient_names
from distify.instance import INSTANCE, instance_of, method_kind, on
from distify.rank_flow import made_from_rank, process_calls, rank_flow
from distify.syntax import NESTED, Scope, _number, all_nodes, by_node, arg, contains_node, dotted, header_names, names
from distify.walk import children
from distify.values import Record


class Binding(Record):
    """One statement binding a name in a scope."""

    __slots__ = ("stmt", "kind", "literal", "__dict__")
    stmt: cst.CSTNode
    kind: str  # assign (`x = ...`) | aug (`x += ...`) | other (for target, with-as, def, import...)
    literal: bool  # bound to a number literal (`x = 0`, `a, b = 0, 0.0`)

    def __init__(self, stmt: cst.CSTNode, kind: str, literal: bool) -> None:
        self._set(stmt, kind, literal)


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
        self._by_scope: Optional[Dict[int, List[cst.CSTNode]]] = None
        self._by_callee: Optional[Dict[str, list]] = None
        self._callers: Dict[Tuple[int, bool], list] = {}
        self._bindings: Dict[int, Dict[str, List[Binding]]] = {}
        self._rank_names: Optional[FrozenSet[str]] = None
        self._rank_calls: FrozenSet[int] = frozenset()
        self._rank_tests: Dict[int, Tuple[cst.BaseExpression, bool]] = {}  # id(test) -> (test, rank_condition)
        self._made_from_rank: Optional[FrozenSet[str]] = None
        self._gradient_names: Optional[FrozenSet[str]] = None
        self._trains: Dict[int, bool] = {}
        # facts the other fact modules derive from this module, asked by several rules and checks
        # (``memo(key, compute)``): kept with the analysis, so never shared by two files or trees
        self._memo: Dict[tuple, object] = {}
        self.trainers: FrozenSet[cst.FunctionDef] = frozenset()  # functions that train (set by the anatomy)
        self.classes = None  # the module's classes (names.Defined), set by the anatomy
        self.qualname = None  # the module's resolver of qualified names, set by the anatomy
        # which function of another module of the project a qualified name is, when the analysis
        # knows the project (``distify.project_reach.ProjectReach``); None for a file on its own
        self.project = None

    def memo(self, key: tuple, compute):
        """`compute()`, once per `key` for this analysis (a key names the fact and its arguments)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # order and nesting -------------------------------------------------------------------
    def order(self, stmt: cst.CSTNode) -> int:
        """Source order of a statement (its index in the analysis pass), -1 when unknown."""
        if self._order is None:
            self._order = {s: i for i, s in enumerate(self.stmt_parent)}
        return self._order.get(stmt, -1)

    def statements(self, scope: Optional[Scope] = None) -> Iterator[cst.CSTNode]:
        """Every statement in source order (of one scope when given; nested statements included)."""
        if scope is None:
            return iter(self.stmt_parent)
        if self._by_scope is None:  # one index for every scope's query (a scope is asked often)
            self._by_scope = {}
            for s in self.stmt_parent:
                self._by_scope.setdefault(id(self.stmt_scope.get(s)), []).append(s)
        return iter(self._by_scope.get(id(scope), ()))

    def all_functions(self) -> List[cst.FunctionDef]:
        """Every function definition, nested ones and methods included, in source order."""
        return [s for s in self.stmt_parent if isinstance(s, cst.FunctionDef)]

    def loops_around(self, stmt: cst.CSTNode) -> List[cst.CSTNode]:
        """The for/while statements enclosing `stmt` in its scope, outermost first."""
        return [p for p in self.stmt_parent.get(stmt, ()) if isinstance(p, (cst.For, cst.While))]

    @property
    def rank_names(self) -> FrozenSet[str]:
        """Dotted names the script binds to a rank: ``self.gpu_id = int(os.environ["LOCAL_RANK"])``,
        ``gpu = dist.get_rank() % torch.cuda.device_count()`` (followed through chains of them; see
        ``distify.rank_flow``)."""
        if self._rank_names is None:
            self._rank_names, self._rank_calls = rank_flow(self)
        return self._rank_names

    @property
    def rank_calls(self) -> FrozenSet[int]:
        """Ids of the calls whose value is a rank: ``dist.get_rank()``, ``hvd.local_rank()``, a
        function of the script that returns one (see ``distify.rank_flow``)."""
        if self._rank_names is None:
            self._rank_names, self._rank_calls = rank_flow(self)
        return self._rank_calls

    @property
    def gradient_names(self) -> FrozenSet[str]:
        """Dotted names bound to gradients (``distify.grad_values``)."""
        if self._gradient_names is None:
            self._gradient_names = gradient_names(self)
        return self._gradient_names

    @property
    def made_from_rank(self) -> FrozenSet[str]:
        """Dotted names bound to a value built from a rank, objects included (``distify.rank_flow``)."""
        if self._made_from_rank is None:
            self._made_from_rank = made_from_rank(self)
        return self._made_from_rank

    @property
    def process_calls(self) -> FrozenSet[int]:
        """Ids of the calls whose value is this process's (ranks, ``os.getpid()``, its device)."""
        return process_calls(self)

    def rank_condition(self, test: cst.BaseExpression) -> bool:
        """A condition that is not the same on every rank (see ``rank_dependent``); once per test
        node for this analysis (the guards of every statement ask it of the same few tests)."""
        key = id(test)
        found = self._rank_tests.get(key)
        if found is None:
            found = self._rank_tests[key] = (test, rank_dependent(test, self.rank_names, self.rank_calls))
        return found[1]

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

    def call_rank_guards(self, site) -> List[Tuple[cst.If, str]]:
        """``rank_guards`` of a call (a ``calls`` record), outermost first: those of its statement,
        and the statement itself when it is an ``if`` on the rank that holds the call in a branch
        (``if rank == 0: dist.barrier()`` on one line; a call in the test is under no guard)."""
        out = self.rank_guards(site.stmt)
        stmt = site.stmt
        if isinstance(stmt, cst.If) and self.rank_condition(stmt.test) and not contains_node(stmt.test, site.call):
            side = branch_of(stmt, site.call)
            if side is not None:
                out = [*out, (stmt, side)]
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
        return self.runs_on_some_ranks(site.stmt) or self._in_rank_expression(site)

    def call_under_rank_test(self, site) -> bool:
        """A call sits, within its own function, in a branch of an ``if`` on the rank (not in its
        test), in a branch of a conditional expression on it, or after a rank test in an ``and``:
        unlike ``call_on_some_ranks``, a call in a function that only some ranks call is not."""
        return bool(self.call_rank_guards(site)) or self._in_rank_expression(site)

    def _in_rank_expression(self, site) -> bool:
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
            scope = node if type(node) is cst.FunctionDef else self.stmt_scope.get(node)
            found = False
            for n in all_nodes(node.body if type(node) is cst.FunctionDef else node):
                if training_call(n):
                    found = True
                    break
                if type(n) is cst.Call and scope is not None:
                    fn = self.callee(n, scope)
                    if fn is not None and (fn in self.trainers or (fn not in self.methods and self.trains(fn))):
                        found = True
                        break
                    if fn is None and type(n.func) is cst.Name and self.value_call_trains(n, scope):
                        found = True
                        break
            self._trains[key] = found
        return self._trains[key]

    def value_call_trains(self, call: cst.Call, scope: Scope) -> bool:
        """`call` calls a value that trains: a parameter or name bound to an instance of a class of
        the script whose ``__call__`` trains, or to a function of the script that trains (at some
        call of its function: see ``distify.callable_training``)."""
        from distify.callable_training import call_of_value, value_trains

        if self.classes is None or not call_of_value(self, call, scope):
            return False
        stmt = self.memo(("call statements",), lambda: {id(c.call): c.stmt for c in self.calls}).get(id(call))
        return stmt is not None and value_trains(self, call.func, scope, stmt)

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
    def never_runs(self, fn: cst.FunctionDef) -> bool:
        """`fn`, a method of a class of this module, cannot run in this script: it has no decorator,
        is no dunder nor ``forward`` (which a library calls by name), and its name stands nowhere in
        the module but in its own ``def``: no call, no reference (``callback=fn``, ``obj.fn``), no
        string (``getattr(obj, "fn")``). Another ``def`` of the same name counts as a reference (the
        cautious side)."""
        name = fn.name.value
        if fn not in self.methods or fn.decorators or name.startswith("__") or name == "forward":
            return False  # a module-level function may be an entry point (console_scripts, fire.Fire())

        def index():
            from collections import Counter

            from distify.walk import preorder

            seen: Counter = Counter()
            for n in preorder(self.module):
                t = type(n)
                if t is cst.Name:
                    seen[n.value] += 1
                elif t is cst.SimpleString:
                    seen[n.value[1:-1] if n.value[:1] in "'\"" else n.value] += 1
            return seen

        return self.memo(("names in the module",), index)[name] <= 1

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
                if d is not None:  # by what the callee names, not how it is spelled (see Defined.local)
                    self._by_callee.setdefault(self.functions.local(d), []).append(c)
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
            out = list(self._method_calls().get((id(cls), name), ()))
            if name == "__init__" and isinstance(self.stmt_scope.get(cls), cst.Module):
                out += self._by_callee.get(cls.name.value, [])  # `Trainer(model, loader)` runs __init__
            elif isinstance(self.stmt_scope.get(cls), cst.Module):
                # `simclr = SimCLR(...)` ... `simclr.train(loader)`: a method of an instance of the class
                out += [
                    c for c in self.calls
                    if isinstance(c.call.func, cst.Attribute) and c.call.func.attr.value == name
                    and isinstance(c.call.func.value, cst.Name) and c.scope is not None
                    and self.functions.local(dotted(getattr(self.instance_call(c.scope, c.call.func.value.value, c.stmt), "func", None)) or "") == cls.name.value
                ]
                if name == "__call__":  # `stopper = EarlyStopping(...)` ... `stopper(val_loss, model)`
                    out += [
                        c for c in self.calls
                        if isinstance(c.call.func, cst.Name) and c.scope is not None
                        and self.functions.local(dotted(getattr(self.instance_call(c.scope, c.call.func.value, c.stmt), "func", None)) or "") == cls.name.value
                    ]
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
        while type(here) is cst.FunctionDef and "." not in d:  # a function nested in this one
            for s in here.body.body:
                if type(s) is cst.FunctionDef and s.name.value == d:
                    return s
            here = self.stmt_scope.get(here)
        if self.functions.named(d) is not None:
            return self.functions.named(d)
        attr, inst = self.instance_attr(scope, d), self.instance(scope)
        if attr is not None and "." not in attr:
            for m, k in self.methods.items():
                if k is inst[1] and m.name.value == attr:
                    return m
        return None

    def _method_calls(self) -> Dict[Tuple[int, str], list]:
        """(class, method name) -> the calls ``<instance>.name(...)`` made on the instance of a
        method of that class (or of a function nested in one), whatever the instance is called."""
        def index() -> Dict[Tuple[int, str], list]:
            out: Dict[Tuple[int, str], list] = {}
            for c in self.calls:
                func = c.call.func
                if type(func) is cst.Attribute and type(func.value) is cst.Name:
                    inst = self.instance(c.scope)
                    if inst is not None and func.value.value == inst[0]:
                        out.setdefault((id(inst[1]), func.attr.value), []).append(c)
            return out
        return self.memo(("method_calls",), index)

    # the instance of a method (distify.instance) -------------------------------------------
    def instance(self, scope) -> Optional[Tuple[str, cst.ClassDef]]:
        """(name, class) when code in `scope` holds the instance of a method of `class` under
        `name`: `scope` is a method that is no static- or classmethod (its first positional
        parameter, whatever it is spelled, unless the method rebinds it), or a function nested in
        one that does not bind the name itself. None for a plain function or the module, whose
        `self`, if one is spelled so, is no instance."""
        if type(scope) is not cst.FunctionDef:
            return None
        return self.memo(("instance", id(scope)), lambda: instance_of(scope, self.methods, self.stmt_scope))

    def instance_attr(self, scope, name: Optional[str]) -> Optional[str]:
        """The attribute path `name` (dotted) reads on the instance `scope` holds: ``train_loader``
        for ``this.train_loader`` in a method whose instance is `this`; None when it reads none."""
        inst = self.instance(scope)
        return on(name, inst[0]) if inst is not None else None

    def canonical(self, scope, name: Optional[str]) -> Optional[str]:
        """The key of the dotted `name` in `scope` that every method of the class shares: the
        instance's spelling replaced by ``distify.instance.INSTANCE``; `name` itself otherwise."""
        attr = self.instance_attr(scope, name)
        return f"{INSTANCE}.{attr}" if attr is not None else name

    def key(self, scope, name: Optional[str]) -> Tuple[int, Optional[str]]:
        """`canonical` with the class it is an attribute of (its id; 0 for a name on no instance):
        `this.sampler` in one method of a class and `self.sampler` in another have one key."""
        inst = self.instance(scope) if self.instance_attr(scope, name) is not None else None
        return (id(inst[1]), self.canonical(scope, name)) if inst is not None else (0, name)

    def spellings(self, scope, name: str) -> List[str]:
        """`name` as written in `scope` and, for an attribute of the instance, as every method of the
        class spells it (for the facts that are sets of dotted names, read in any scope)."""
        if self.instance_attr(scope, name) is None:
            return [name]
        there = (self.respell(name, scope, m) for m in self.methods)
        return [name, *(t for t in there if t is not None and t != name)]

    def respell(self, name: str, from_scope, to_scope) -> Optional[str]:
        """`name` as written in `from_scope`, spelled for `to_scope`: an attribute of the instance
        takes `to_scope`'s own spelling of it (None where `to_scope` holds no instance of that
        class); any other name is itself."""
        attr = self.instance_attr(from_scope, name)
        if attr is None:
            return name
        inst, there = self.instance(from_scope), self.instance(to_scope)
        return f"{there[0]}.{attr}" if there is not None and there[1] is inst[1] else None

    def instance_call(self, scope: Scope, name: str, stmt: cst.CSTNode) -> Optional[cst.Call]:
        """The call whose result `name` holds at `stmt` in `scope`: its last binding before `stmt`
        is the single assignment ``name = <call>`` (``simclr = SimCLR(...)``); None otherwise."""
        b = self.reaching_binding(scope, name, stmt)
        small = b.stmt.body[0] if b is not None and isinstance(b.stmt, cst.SimpleStatementLine) and len(b.stmt.body) == 1 else None
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Call)):
            return None
        return small.value if dotted(small.targets[0].target) == name else None

    def bound_keywords(self, call: cst.Call, fn: cst.FunctionDef) -> Dict[str, cst.BaseExpression]:
        """What `call` hands `fn` through its ``**kwargs``: ``kwargs["model"]`` -> the expression of
        ``model=...`` (see ``keyword_bindings``)."""
        return keyword_bindings(fn, call, self.params(fn))

    def params(self, fn: cst.FunctionDef) -> List[str]:
        """The positional parameters a call binds, in order (a method's first one, the instance it is
        called on, left out: it is `self` by convention only)."""
        params = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
        if fn in self.methods and params and method_kind(fn) != "static":
            params = params[1:]  # the instance (or the class), whatever it is called
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

    def local_to(self, fn: cst.FunctionDef, name: str) -> bool:
        """`name` is a local of `fn`: one of its parameters, or bound in its body with no ``global``
        or ``nonlocal`` statement for it, so a module-level name spelled alike is not what `fn`
        reads (Python's rule: a name bound anywhere in a function is local throughout it)."""
        p = fn.params
        every = list(p.posonly_params) + list(p.params) + list(p.kwonly_params)
        every += [x for x in (p.star_arg, p.star_kwarg) if isinstance(x, cst.Param)]
        if any(x.name.value == name for x in every):
            return True
        if name not in self.bindings(fn):
            return False
        declared = (n for n in all_nodes(fn.body, skip_nested=True) if type(n) is cst.Global or type(n) is cst.Nonlocal)
        return not any(item.name.value == name for d in declared for item in d.names)

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
        fn = self.functions.named(dotted(call.func)) if isinstance(call, cst.Call) else None
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


def same_object(expr):
    """`expr` with the calls of SELF_RETURNING methods around it looked through: ``model`` of
    ``model.to(device).train()`` (the object those calls return is the one they are called on)."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in SELF_RETURNING:
        expr = expr.func.value
    return expr


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
    v = same_object(small.value)
    return v is not small.value and dotted(v) == name


def training_call(n: cst.CSTNode) -> bool:
    """``x.backward()`` or ``x.step()``, whatever `x` is called: the receiver's spelling ("sched",
    "scaler") once decided whether a step trained, so renaming an optimizer could change what
    distify did. A function that steps only a scheduler now counts as training too, the cautious
    side (every fixture migrates the same either way)."""
    return type(n) is cst.Call and type(n.func) is cst.Attribute and n.func.attr.value in ("backward", "step")


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
    return iter(_stmt_bindings(stmt))


@by_node
def _stmt_bindings(stmt: cst.CSTNode) -> Tuple[Tuple[str, bool, str], ...]:
    return tuple(_bindings_of(stmt))


def _bindings_of(stmt: cst.CSTNode) -> Iterator[Tuple[str, bool, str]]:
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
    return iter(_uses_by_name(scope).get(name, ()))


@by_node
def _uses_by_name(scope: Scope) -> Dict[str, List[Tuple[cst.CSTNode, Tuple[cst.CSTNode, ...], bool]]]:
    """``uses`` of every name at once, in source order: one walk per scope object, however many
    names are asked about (a name is a ``Name``'s value; a dotted name the text of an attribute chain,
    which no shorter chain inside it can spell)."""
    found: Dict[str, List[Tuple[cst.CSTNode, Tuple[cst.CSTNode, ...], bool]]] = {}

    def visit(node: cst.CSTNode, parents: Tuple[cst.CSTNode, ...], nested: bool) -> None:
        t = type(node)  # by identity, as in distify.syntax: an isinstance of an ABC costs more
        if t is cst.Attribute:
            spelled = dotted(node)
            if spelled is not None:
                found.setdefault(spelled, []).append((node, parents, nested))
            visit(node.value, parents + (node,), nested)
            return
        if t is cst.Name:
            found.setdefault(node.value, []).append((node, parents, nested))
            return
        if t is cst.Arg:
            visit(node.value, parents + (node,), nested)
            return
        if t is cst.Param:
            if node.default is not None:
                visit(node.default, parents + (node,), nested)
            return
        if t is cst.Import or t is cst.ImportFrom or t is cst.Global or t is cst.Nonlocal:
            return
        if t in NESTED and node is not scope:
            if type(scope) is cst.Module and t is not cst.Lambda:
                return
            for c in children(node):
                if type(c) is cst.Name and t is not cst.Lambda:
                    continue
                visit(c, parents + (node,), True)
            return
        if t is cst.FunctionDef:  # the scope itself: its body, not its signature
            visit(node.body, parents + (node,), nested)
            return
        for c in children(node):
            visit(c, parents + (node,), nested)

    visit(scope, (), False)
    return found


__all__ = ["Binding", "Facts", "keeps_object", "stmt_bindings", "uses"]


def keyword_bindings(fn: cst.FunctionDef, call: cst.Call, params: List[str]) -> Dict[str, cst.BaseExpression]:
    """The keyword arguments of `call` that `fn` receives in its ``**`` parameter, by the reference
    its body reads them with (``kwargs["model"]`` for ``model=net``, `params` being the names the
    keywords could bind otherwise); empty when `fn` has no ``**`` parameter or `call` spreads one."""
    star = fn.params.star_kwarg
    if not isinstance(star, cst.Param) or any(a.star == "**" for a in call.args):
        return {}
    named = set(params) | {p.name.value for p in fn.params.kwonly_params}
    return {
        f'{star.name.value}["{a.keyword.value}"]': a.value
        for a in call.args
        if a.keyword is not None and a.keyword.value not in named
    }
