"""DST954 an optimizer whose updates are not averaged across ranks."""

from __future__ import annotations

from typing import Set

import libcst as cst

from distify.anatomy import Anatomy
from distify.records import COLLECTIVES, DDP, FULLY_SHARD
from distify.syntax import arg, dotted, all_nodes
from distify.audit import HVD_OPTIMIZER
from distify.parallel import FSDP, same_modules, sharded_root, wrapped_models, wrapped_where_built
from distify.rules.base import AuditCheck, Context
from distify.grad_values import gradient_value


class UnaveragedOptimizer(AuditCheck):
    """Every optimizer that steps must update parameters averaged across ranks.

    What it does:
        Part of the output audit (and of ``distify lint``). In a DDP script, reports an optimizer
        built from ``X.parameters()`` when ``X`` is neither wrapped in DDP/FSDP nor the module a
        wrapper wraps, and is not handed on to code of the script that wraps a model (returned,
        or passed to a function or class that calls DDP). ``fully_shard(X)`` (FSDP2) averages
        too; in an FSDP script an optimizer built over ``X.parameters()`` *before* ``fully_shard(X)``
        in the same scope is reported (and one rebuilt after it is not). In a Horovod script, reports an optimizer that is never passed to
        ``hvd.DistributedOptimizer`` (also one with no name, built inside an expression, that is
        not built straight into it). In distify's own output that wraps and shards no model at
        all, an optimizer whose model distify cannot name is reported too; and in distify's
        output that wraps some model, an optimizer a function of the script builds and hands
        back over parameters distify cannot trace to one model (``model.configure_optimizers(
        list(probe.parameters()), lr)``: the probe alone would be wrapped). One built by
        ``model.configure_optimizers(...)`` over its instance's parameters, or by a builder
        handed the model, is judged where the script obtains it (``distify.obtained``): the
        model it is called on or handed must be wrapped, or sharded before. An optimizer that is never
        stepped, and a script that averages gradients itself (a collective over ``.grad``), are
        not reported.

    Why:
        DDP averages gradients only for the parameters of the module it wraps, and Horovod only
        for the optimizer it wraps. Any other optimizer steps on this rank's gradients alone:
        the replicas drift apart from the first step, with no error. ``fully_shard`` replaces each
        parameter with a DTensor shard in place: an optimizer built before it holds the old
        tensors, which the model no longer uses, and updates nothing (no error either).

    Example:
        model = DDP(net, device_ids=[local_rank])
        head = nn.Linear(128, 10).to(device)
        optimizer = optim.SGD(head.parameters(), lr=0.1)     # DST954: head is not wrapped

        fix: put head inside the wrapped module (or wrap it in DDP too)

        When distify's own rewrite of a script would end so (the optimizer steps a module no
        wrapper owns), the file is refused (exit 3) rather than written with this warning, unless
        the user asked for a partial migration (``--select`` / ``--ignore``).
    """

    # on distify's own output this finding means the migrated script's replicas would drift apart
    # from the first step, with no error: the migration is refused instead (exit 3)
    refuses_own_output = True

    code = "DST954"
    name = "unaveraged-optimizer"
    summary = "audit: an optimizer that steps on this rank's gradients alone"

    def check(self, ctx: Context, a: Anatomy) -> None:
        for c in a.calls_to(COLLECTIVES):
            if gradient_value(a.facts, c.call):
                return  # averaged explicitly
        stepped = _stepped(a)
        if a.flavour == "horovod":
            wrapped = set()
            for c in a.calls_to(HVD_OPTIMIZER):
                o = arg(c.call, 0, "optimizer")
                if o is not None and dotted(o.value):
                    wrapped.add(dotted(o.value))
            for opt in a.optimizers:
                opt = opt.site  # one a function of the script builds is wrapped where the script obtains it
                if opt.target and (opt.target in stepped or _handed_back(opt)) and opt.target not in wrapped:
                    ctx.warn(
                        self.code,
                        opt.call.call,
                        f"{opt.target} steps on this rank's gradients alone: wrap it, "
                        f"{opt.target} = hvd.DistributedOptimizer({opt.target}, named_parameters=model.named_parameters())",
                    )
                elif opt.target is None and not wrapped_where_built(a, opt.call):
                    # built inside an expression (handed straight to the script's own scheduling
                    # class, a function, a return): whoever steps it, nothing averages it
                    ctx.warn(
                        self.code,
                        opt.call.call,
                        "this optimizer steps on this rank's gradients alone: build it inside "
                        "hvd.DistributedOptimizer(..., named_parameters=model.named_parameters())",
                    )
            return
        wrappers, inner = (set(x) for x in wrapped_models(a))
        self._built_before_sharding(ctx, a, stepped)
        if (a.migrated_by_distify or ctx.plan.distify_output) and not (wrappers or inner) and not a.calls_to(FSDP):
            self._nothing_wrapped(ctx, a, stepped)
        elif a.migrated_by_distify or ctx.plan.distify_output:
            self._untraced_builder(ctx, a)
        for opt in a.optimizers:
            opt = opt.site  # one a function of the script builds is judged where the script obtains it
            if not opt.models or (opt.target and opt.target not in stepped and not _handed_back(opt)):
                continue
            loose = [m for m in opt.models if not _averaged(a, opt.call.scope, m, wrappers | inner)]
            if loose:
                ctx.warn(
                    self.code,
                    opt.call.call,
                    f"{', '.join(loose)} is not wrapped in DistributedDataParallel: this optimizer's updates are not "
                    f"averaged across ranks and the replicas drift apart; wrap it (model = DDP(model, ...)) before "
                    "building the optimizer"
                    if not (a.flavour == "fsdp" or (ctx.plan.distify_output and ctx.backend == "fsdp"))
                    else f"{', '.join(loose)} is not sharded with fully_shard: this optimizer's updates are not "
                    "averaged across ranks and the replicas drift apart; fully_shard it before building the optimizer",
                )

    def _nothing_wrapped(self, ctx: Context, a: Anatomy, stepped: Set[str]) -> None:
        """distify's own output in which no model is wrapped or sharded at all, while an optimizer
        whose model distify cannot name steps (`model.configure_optimizers(...)` building it over
        parameter groups of the instance): nothing in the script averages anything. Those with a
        known model are reported by name below."""
        for opt in a.optimizers:
            opt = opt.site
            if opt.models or (opt.target and opt.target not in stepped and not _handed_back(opt)):
                continue
            what = "sharded with fully_shard" if ctx.backend == "fsdp" else "wrapped in DistributedDataParallel"
            ctx.warn(
                self.code,
                opt.call.call,
                f"no model of this script is {what}, and distify cannot tell which model this optimizer steps: "
                "its updates are not averaged across ranks and the replicas drift apart; build it from the "
                "model's parameters where the model is built (optimizer = optim.AdamW(model.parameters(), ...)), "
                "or wrap the model yourself",
            )

    def _untraced_builder(self, ctx: Context, a: Anatomy) -> None:
        """distify's own output that wraps some model, while an optimizer built and handed back by a
        function of the script (`return torch.optim.AdamW(groups, ...)` in
        `model.configure_optimizers(extra, lr)`) steps parameters distify cannot trace to one model
        (distify.obtained names none): what was wrapped may not be what it steps (a probe handed
        in is wrapped, the model the method is called on is not)."""
        for opt in a.optimizers:
            if opt.site.models or opt.obtained is not None or not isinstance(opt.call.scope, cst.FunctionDef):
                continue
            if not (opt.call.call is _returned(opt.call.scope, opt.call.call) or _handed_back(opt)):
                continue
            ctx.warn(
                self.code,
                opt.call.call,
                f"this optimizer is handed back by {opt.call.scope.name.value}() over parameters distify cannot "
                "trace to one model of this script: the wrapped model may not be the one it steps, and its updates "
                "would not be averaged across ranks; build it from one model's parameters "
                "(self.parameters() / model.parameters(), or groups made only from them)",
            )

    def _built_before_sharding(self, ctx: Context, a: Anatomy, stepped: Set[str]) -> None:
        """An optimizer over X.parameters() built before fully_shard(X) in the same scope, and not
        built again after it."""
        shards = []
        for c in a.calls_to(FULLY_SHARD):
            root = sharded_root(a, c)
            if root:
                shards.append((c, same_modules(a, {root})))
        for opt in a.optimizers:
            opt = opt.site  # built in a function of the script: before the shard where the script obtains it
            if not opt.models or (opt.target and opt.target not in stepped and not _handed_back(opt)):
                continue
            for c, names in shards:
                if c.scope is not opt.call.scope or not set(opt.models) & names:
                    continue
                if not a.is_before(opt.call.stmt, c.stmt):
                    continue
                rebuilt = any(
                    o.site is not opt and o.site.target == opt.target and o.site.call.scope is opt.call.scope
                    and a.is_before(c.stmt, o.site.call.stmt)
                    for o in a.optimizers
                )
                if rebuilt:
                    continue
                line = a.position(c.call)[0]
                ctx.warn(
                    self.code,
                    opt.call.call,
                    f"{opt.target or 'this optimizer'} is built before {ctx.code(c.call.func)}({ctx.code(c.call.args[0].value)}) "
                    f"(line {line}), which replaces the parameters with DTensor shards: it updates tensors the model "
                    "no longer uses (no error, no training); build it after fully_shard",
                )
                break


def _averaged(a: Anatomy, scope, name: str, wrapped: Set[str], depth: int = 0) -> bool:
    """`name` (a model an optimizer steps, in `scope`) is wrapped, may be wrapped where the audit
    does not follow it, or is a parameter of the optimizer's function that every call of it fills
    with such a model (`def build_optimizer(model): return optim.SGD(model.parameters())` called as
    `build_optimizer(ddp_model)`)."""
    if name in wrapped or _escapes(a, scope, name):
        return True
    if name.endswith(".module") and name[: -len(".module")] in wrapped:
        return True  # the module a DDP wrapper holds (`build_optimizer(model.module)`): its parameters are averaged
    root = name.split(".")[0]
    if not isinstance(scope, cst.FunctionDef) or root not in a.facts.params(scope) or depth > 3:
        return False
    sites = a.callers(scope)
    if not sites:
        return True  # never called in this file: whoever calls it is not in sight
    for site in sites:
        value = a.bound_value(site.call, scope, root)
        passed = dotted(value) if value is not None else None
        if passed is None:
            return True  # an expression distify does not name: not judged
        if not _averaged(a, site.scope, passed + name[len(root):], wrapped, depth + 1):
            return False
    return True


def _escapes(a: Anatomy, scope, name: str) -> bool:
    """The model leaves the scope that built the optimizer for code of this script that wraps a
    model – returned, or handed to such a function or class (``Trainer(model, ...)`` whose
    ``__init__`` calls DDP) – so it may be wrapped where the audit does not follow it."""
    wrapping = {id(c.scope) for c in a.calls if c.qualname in DDP or c.qualname in FSDP}
    wrapping |= {id(c.cls) for c in a.calls if (c.qualname in DDP or c.qualname in FSDP) and c.cls is not None}
    for c in a.calls:
        if c.scope is not scope or not any(dotted(x.value) == name for x in c.call.args):
            continue
        fn = a.callee(c.call, scope)
        cls = a.classes.named(dotted(c.call.func))
        if (fn is not None and id(fn) in wrapping) or (cls is not None and id(cls) in wrapping):
            return True
    return _returns(scope, name)


def _returned(fn: cst.FunctionDef, call: cst.Call):
    """`call` when `fn` returns it as it stands (`return optim.AdamW(...)`), else None."""
    for n in all_nodes(fn.body, skip_nested=True):
        if isinstance(n, cst.Return) and n.value is call:
            return call
    return None


def _handed_back(opt) -> bool:
    """The optimizer's function returns it (`opt = optim.SGD(...); return opt`): the caller steps it."""
    return _returns(opt.call.scope, opt.target)


def _returns(scope, name: str) -> bool:
    """`scope` is a function that hands `name` back in a return (see `_held`)."""
    return isinstance(scope, cst.FunctionDef) and any(
        isinstance(n, cst.Return) and n.value is not None and any(dotted(m) == name for m in _held(n.value))
        for n in all_nodes(scope.body, skip_nested=True)
    )


def _held(value: cst.BaseExpression):
    """The values a returned expression hands back: itself, or the items of a tuple or list it
    builds (`return model, optimizer`). A model only read inside it (`return optim.SGD(model.parameters())`)
    is not handed back."""
    if isinstance(value, (cst.Tuple, cst.List)):
        for element in value.elements:
            yield from _held(element.value)
    else:
        yield value


def _stepped(a: Anatomy) -> Set[str]:
    """Names stepped (``opt.step()``, ``scaler.step(opt)``) or handed to a function that may step."""
    out: Set[str] = set()
    for c in a.calls:
        f = c.call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "step":
            d = dotted(f.value)
            if d:
                out.add(d)
        for x in c.call.args:
            d = dotted(x.value)
            if d:
                out.add(d)
    return out


RULE = UnaveragedOptimizer()
