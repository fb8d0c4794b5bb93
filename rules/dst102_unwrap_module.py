"""DST102 reach the wrapped module for state and custom attributes."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from distify.facts import SELF_RETURNING
from distify.records import MODULE_API, NAMED_API, STATE_API
from distify.syntax import dotted, held_name
from distify.meaning import copies_argument
from distify.pickled import handed, pickled, pickled_elsewhere
from distify.rules.base import DDP_BACKEND, Context, Rule, reaching_scopes
from distify.walk import walk
from distify.forward_methods import runs_forward, runs_submodule, takes_gradients, trains_inside


class UnwrapModule(Rule):
    """Go through ``.module`` of a DDP-wrapped model for its state and its own attributes.

    What it does:
        After the wrap, ``model.state_dict()`` / ``model.load_state_dict(...)`` and attributes of
        the user's own module (``model.fc``, ``model.encode(...)``) become
        ``model.module.state_dict()``, ``model.module.fc``. Inside functions that receive the
        model as a parameter it uses ``runtime.unwrap(model)``, which works for wrapped and plain
        models alike.

    Why:
        ``DistributedDataParallel`` stores the model as ``.module``: its own state_dict has every
        key prefixed with ``module.``, so checkpoints would no longer load into the single-GPU
        model, and it does not forward custom attributes (``AttributeError``).

    Example:
        torch.save(model.state_dict(), "model.pt")

        becomes

        torch.save(model.module.state_dict(), "model.pt")
    """

    code = "DST102"
    name = "unwrap-module"
    backends = frozenset({DDP_BACKEND})
    summary = "use model.module for state_dict and custom attributes"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        edited: set = set()  # the values a save pickles, each replaced once (several saves of one dict)
        for model, anchor in ctx.plan.wrapped:
            targets = reaching_scopes(ctx, model, anchor)
            model_cls = a.model_class(model)
            foreign = a.class_methods(model_cls)[1] if model_cls is not None else True
            called = {id(c.call.func): c for c in a.calls if isinstance(c.call.func, cst.Attribute)}
            for attr, scope, cls, stmt in a.attr_uses:
                name = held_name(attr.value)
                if name is None or attr.attr.value in MODULE_API:
                    continue
                how = targets.get((id(scope), name))
                if how is None:
                    continue
                after, mode = how
                if after is not None and not a.is_before(after, stmt):
                    continue
                if attr.attr.value.startswith("__"):
                    continue
                mode = _still_wrapped(a, model, anchor, scope, name, stmt, mode)
                if mode is None:
                    continue
                site = called.get(id(attr))
                method = attr.attr.value
                if site is not None and (
                    runs_forward(a.classes, a.qualname, model_cls, method, foreign) or runs_submodule(a.classes, model_cls, method)
                ) and (takes_gradients(a, site) or trains_inside(a, model_cls, method)) and not _wrapper_ran_first(a, site, name):
                    part = runs_submodule(a.classes, model_cls, method)
                    ctx.block(
                        self.code, attr,
                        f"{name}.{method}() runs " + ("a submodule of the model on its own" if part else
                        "the model's computation outside forward") + " where the loss is differentiated: DDP "
                        "averages the gradients only of a forward called through the wrapper, so through "
                        f"{name}.module each rank would keep its own and the replicas drift apart: file not "
                        f"migrated; compute the loss in forward (call {name}(...)), or migrate with --backend "
                        "horovod (its optimizer averages)" + ("" if part else " or fsdp (it registers the method)"),
                    )
                    return
                if mode == "module":
                    new_value = lambda n: cst.Attribute(value=n.value, attr=cst.Name("module"))
                else:
                    rt = ctx.runtime
                    new_value = lambda n, rt=rt: cst.parse_expression(f"{rt}.unwrap()").with_changes(
                        args=[cst.Arg(n.value)]
                    )
                ctx.edits.replace(attr, lambda n, f=new_value: n.with_changes(value=f(n)))
                what = ("state" if attr.attr.value in STATE_API else "parameter names" if attr.attr.value in NAMED_API
                        else f"attribute .{attr.attr.value}")
                via = f"{name}.module" if mode == "module" else f"{ctx.runtime}.unwrap({name})"
                ctx.report(self.code, attr, f"{what} of the wrapped model reached through {via}")
            self._arguments(ctx, model, anchor, targets, edited)

    def _arguments(self, ctx: Context, model, anchor, targets, edited: set) -> None:
        """`ModelEMA(model)`, `ema.update(model)`: a callee of this script that only reads the
        model's state or copies it gets the unwrapped module (its copy must not be a DDP)."""
        a = ctx.anatomy
        for site in a.calls:
            how = None
            for i, x in enumerate(site.call.args):
                if x.keyword is None and not x.star and held_name(x.value) is not None:
                    how = targets.get((id(site.scope), held_name(x.value)))
                    if how is None:
                        continue
                    after, mode = how
                    if after is not None and not a.is_before(after, site.stmt):
                        continue
                    mode = _still_wrapped(a, model, anchor, site.scope, held_name(x.value), site.stmt, mode)
                    if mode is None:
                        continue
                    said = f"{dotted(site.call.func)}() gets the unwrapped model: it only reads or copies it"
                    if not copies_argument(a, site, i):
                        fn = _callee(a, site)
                        if fn is None:
                            said = self._elsewhere(ctx, site, x)
                            if said is None:
                                continue
                        else:
                            params = a.facts.params(fn)
                            if i >= len(params) or not _only_reads(a, fn, params[i]):
                                continue
                    name = held_name(x.value)
                    if mode == "module":
                        new_value = lambda n: cst.Attribute(value=n, attr=cst.Name("module"))
                    else:
                        rt = ctx.runtime
                        new_value = lambda n, rt=rt: cst.parse_expression(f"{rt}.unwrap()").with_changes(args=[cst.Arg(n)])
                    edited.add(id(x.value))
                    ctx.edits.replace(x.value, new_value)
                    ctx.report(self.code, x.value, said)
            self._pickled(ctx, model, anchor, targets, site, edited)

    def _pickled(self, ctx: Context, model, anchor, targets, site, edited: set) -> None:
        """`torch.save({'decoder': decoder, ...}, path)`, also through a dict built first and saved by
        name and through a helper that saves what it is given (``distify.pickled``): a wrapped model
        among the values torch.save pickles whole is saved as its module (a pickled wrapper loads
        only under a process group)."""
        a = ctx.anatomy
        found = pickled(a, site)
        if not found and _hands(a, site, targets):
            found = pickled_elsewhere(a, site, ctx.plan.script_path, ctx.options)
        for p in found:
            member = p.expr
            name = dotted(member)
            how = targets.get((id(site.scope), name)) if name is not None else None
            if how is None or (how[0] is not None and not a.is_before(how[0], p.stmt)):
                continue
            if p.into is not None and (id(p.into[0]), p.into[1]) in targets:
                continue  # the script's function gets the model itself: unwrapped where it saves it
            mode = _still_wrapped(a, model, anchor, site.scope, name, p.stmt, how[1])
            if mode is None:
                continue
            if p.read_back is not None:
                ctx.block(
                    self.code, member,
                    f"torch.save() pickles {name} whole from a container that is also read back "
                    f"(line {a.position(p.read_back)[0]}): saving the module DDP wraps would hand that read the "
                    "unwrapped model too, and a wrapper pickled whole loads only under a process group; file not "
                    f"migrated. Save {name}.state_dict() instead",
                )
                return
            if id(member) in edited:
                continue
            edited.add(id(member))
            if mode == "module":
                ctx.edits.replace(member, lambda n: cst.Attribute(value=n, attr=cst.Name("module")))
            else:
                rt = ctx.runtime
                ctx.edits.replace(member, lambda n, rt=rt: cst.parse_expression(f"{rt}.unwrap()").with_changes(args=[cst.Arg(n)]))
            ctx.report(self.code, member, f"torch.save() pickles the module {name} wraps, not the wrapper")

    def _elsewhere(self, ctx: Context, site, x: cst.Arg) -> Optional[str]:
        """`site` hands the wrapped model to a function of another module of the project that
        reads, on the parameter it binds, attributes the wrapper does not forward (``model.pos_emb``
        in rasbt's ``generate_and_print_sample``): the function gets the unwrapped model when it
        trains nothing and its result reaches no backward() (its forward passes then need no
        gradient averaging); otherwise the file is refused, since either way would train wrong or
        die with an AttributeError. None: nothing to do."""
        from distify.program import program_of, reached  # here: most files never ask

        a = ctx.anatomy
        t = reached(a, ctx.plan.script_path, ctx.options, site).target
        if t is None:
            return None
        prog = program_of(a)
        param = next((p for p, v in prog.bind(t, site.call).items() if v is x.value), None)
        reads = prog.attribute_reads(t, param) if param is not None else []
        if not reads:
            return None
        attr = reads[0][0]
        if prog.trains(t) or a.facts.reaches_backward(site.scope, site.stmt):
            ctx.block(
                self.code,
                x.value,
                f"{t.qualname}() at {t.where} reads .{attr} on the model DDP wraps (an AttributeError on the wrapper) "
                "and takes part in training: not migrated; read it through runtime.unwrap() in that module",
            )
            return None
        return f"{dotted(site.call.func)}() ({t.where}) reads .{attr} of the model: it gets the unwrapped model"


def _hands(a, site, targets) -> bool:
    """`site` is handed a name of `targets` (an argument, or in a container passed as one)."""
    return any((id(site.scope), dotted(v)) in targets for v in handed(a, site))


def _still_wrapped(a, model, anchor, scope, name, stmt, mode):
    """How a use of the wrapped name reaches the module, now that the name may have been rebound
    since the wrap (`model = NeuralNetwork()` to reload a checkpoint): None when it holds another
    object there, "unwrap" (works for both) when it may, else `mode`."""
    if scope is model.scope and name != model.name and a.facts.instance_attr(scope, name) is None:
        # an alias of the model in its own scope (`raw_model = model`): bound before the wrap, it
        # holds the plain module
        bound = a.reaching_binding(scope, name, stmt)
        if bound is not None and (
            a.is_before(bound.stmt, anchor) or anchor in a.stmt_parent.get(bound.stmt, ())
        ):
            return None
    if scope is model.scope and name == model.name:
        held = a.holds(model.scope, model.name, anchor, stmt)
        if held == "no":
            return None
        return "unwrap" if held == "maybe" else mode
    if mode == "module" and a.facts.instance_attr(scope, name) is None:
        # a function reading the global may run before or after a later rebinding
        if any(
            a.is_before(anchor, s) and not a.facts.keeps(s, model.name)
            for s in a.rebindings(model.scope, model.name)
            if s is not anchor and anchor not in a.stmt_parent.get(s, ())
        ):
            return "unwrap"
    return mode


def _callee(a, site):
    """The FunctionDef a call reaches: a module function, a class's __init__, or a method of an
    instance built from a class of this module in the same scope."""
    func = site.call.func
    if a.functions.named(dotted(func)) is not None:
        return a.functions.named(dotted(func))
    if a.classes.named(dotted(func)) is not None:
        return _method(a, a.classes.named(dotted(func)), "__init__")
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        owner = func.value.value
        for stmt, scope in a.stmt_scope.items():
            if scope is not site.scope or not isinstance(stmt, cst.SimpleStatementLine):
                continue
            small = stmt.body[0]
            if (
                isinstance(small, cst.Assign)
                and any(dotted(t.target) == owner for t in small.targets)
                and isinstance(small.value, cst.Call)
                and a.classes.named(dotted(small.value.func)) is not None
            ):
                return _method(a, a.classes.named(dotted(small.value.func)), func.attr.value)
    return None


def _method(a, cls, name):
    for fn, owner in a.methods.items():
        if owner is cls and fn.name.value == name:
            return fn
    return None


def _only_reads(a, fn, param: str) -> bool:
    """True when `param` is only used for attributes (not forward) or copied in `fn`'s body."""
    ok = True
    seen = False

    class V(cst.CSTVisitor):
        def __init__(self):
            super().__init__()
            self.stack = []

        def on_visit(self, node):
            nonlocal ok, seen
            if isinstance(node, cst.Name) and node.value == param and self.stack:
                parent = self.stack[-1]
                seen = True
                if isinstance(parent, cst.Attribute) and parent.value is node:
                    if parent.attr.value in ("forward", "__call__", "module"):
                        ok = False
                    elif parent.attr.value in SELF_RETURNING and len(self.stack) > 2 and isinstance(self.stack[-2], cst.Call) \
                            and self.stack[-2].func is parent and not isinstance(self.stack[-3], cst.Expr):
                        ok = False  # `self.model = model.to(device)`: the model itself, kept or handed on
                elif isinstance(parent, cst.Arg) and len(self.stack) > 1 and isinstance(self.stack[-2], cst.Call):
                    if a.qualname(self.stack[-2].func) not in ("copy.deepcopy", "copy.copy"):
                        ok = False
                elif not isinstance(parent, cst.Param):
                    ok = False
            self.stack.append(node)
            return True

        def on_leave(self, original_node):
            self.stack.pop()

    walk(fn.body, V())
    return ok and seen


def _wrapper_ran_first(a, site, name: str) -> bool:
    """The wrapper itself is called (`name(...)`) earlier in the same pass of the loop around `site`
    (`out = model(x); loss = model.compute_loss(out, y)`): that forward arms DDP's gradient hooks
    for the step, so a method reading parameters after it is averaged with the rest."""
    if not site.loops:
        return False
    inner = site.loops[-1]
    return any(
        c.scope is site.scope and c.loops and c.loops[-1] is inner and dotted(c.call.func) == name
        and a.is_before(c.stmt, site.stmt)
        for c in a.calls
    )


RULE = UnwrapModule()
