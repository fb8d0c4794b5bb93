"""The conversion stage (DST003): a script written for one backend, converted to another.

The engine runs this stage before the rules (``engine._migrate``), on a script whose own code
distributes it with another backend than the one requested. The script is first *stripped* of what
only its backend needs – its init call, the DDP wrapper and ``.module`` accesses, Horovod's
DistributedOptimizer and broadcasts, or FSDP's ``fully_shard`` calls and full-state-dict
collectives – and its rank queries are rewritten to the backend-neutral ``runtime`` helpers. What is
left is a single-process script that still has its DistributedSamplers, set_epoch calls and rank-0
guards; the engine analyses it again and the rules add the requested backend's pieces and adapt
the samplers. The two steps are two passes over the code (each one transformer), so each rule
stays simple.

The stage is no rule: it does not run on the rules' anatomy, it returns a new module to analyse
again. It keeps a code, DST003, so that its findings, ``--select``/``--ignore`` and ``--explain``
work as for a rule (``distify.rules.STAGES`` lists it beside the rules).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Set, Tuple

import libcst as cst

from distify.anatomy import Anatomy
from distify.records import DDP, DIST_SAMPLER, FSDP1, FULLY_SHARD, INIT_PG, CallSite, assigned_name
from distify.syntax import arg, dotted, call_statement
from distify.edits import ApplyEdits
from distify.findings import Finding
from distify.options import BACKENDS, Options
from distify.runtime_class import find_block
from distify.grad_values import gradient_value

if TYPE_CHECKING:  # pragma: no cover
    from distify.rules.base import Context

CONVERT_CODE = "DST003"


class ConvertBackend:
    """Convert a script written for one backend to another (DDP <-> Horovod, DDP <-> FSDP, Horovod -> FSDP).

    What it does:
        On a script that already uses DDP, ``--backend horovod`` removes ``init_process_group``,
        the ``DDP(...)`` wrapper, ``.module`` accesses and ``destroy_process_group``, turns
        ``dist.get_rank()``/``os.environ["LOCAL_RANK"]`` into ``runtime`` helpers, and then the
        Horovod rules add ``hvd.init()``, ``hvd.DistributedOptimizer`` and the broadcasts and give
        the existing DistributedSampler Horovod's size and rank. ``--backend ddp`` on a Horovod
        script removes ``hvd.init``, ``DistributedOptimizer``, the broadcasts and
        ``synchronize``/``skip_synchronize``, maps ``hvd.rank()``/``hvd.allreduce`` to ``runtime``,
        and the DDP rules add the process group and the wrapper. ``--backend fsdp`` on a DDP or
        Horovod script strips it the same way, and the FSDP rules shard the model with
        ``fully_shard`` and save through ``get_model_state_dict``. ``--backend ddp`` (or horovod)
        on an FSDP2 script removes the ``fully_shard`` calls (a loop that only shards blocks goes
        with them), their ``MixedPrecisionPolicy``/device mesh, and
        ``set_requires_gradient_sync``; ``get_model_state_dict(model, ...)`` becomes
        ``model.state_dict()``, ``get_optimizer_state_dict(model, opt, ...)``
        ``opt.state_dict()``, and the ``set_`` forms ``load_state_dict``. Samplers, ``set_epoch``
        and rank-0 guards are kept.

    Why:
        Moving a job between clusters (MPI/Horovod on one, torchrun on the other) should not mean
        rewriting the training script by hand, and the details that differ – who averages the
        gradients, who synchronises the initial state – are exactly the ones that fail silently.

    Example:
        model = DDP(model, device_ids=[local_rank])
        optimizer = optim.SGD(model.parameters(), lr=0.1)

        with --backend horovod becomes

        optimizer = optim.SGD(model.parameters(), lr=0.1)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    """

    code = CONVERT_CODE
    name = "convert-backend"
    summary = "convert a script between DDP, Horovod and FSDP"
    backends = frozenset(BACKENDS)

    def run(self, anatomy: Anatomy, options: Options) -> Tuple[Optional[cst.Module], List[Finding]]:
        """The stripped module, re-parsed (None when the script cannot be converted), and the
        findings: what was removed or rewritten, or why nothing was."""
        return strip(anatomy, options)


STAGE = ConvertBackend()

TORCH_DIST_RANK = {
    "torch.distributed.get_rank": "rank",
    "torch.distributed.get_world_size": "world_size",
    "torch.distributed.barrier": "barrier",
}
HVD_RANK = {
    "horovod.torch.rank": "rank",
    "horovod.torch.size": "world_size",
    "horovod.torch.local_rank": "local_rank",
    "horovod.torch.join": "barrier",
    "horovod.torch.barrier": "barrier",
}
HVD_DROP = {
    "horovod.torch.init",
    "horovod.torch.shutdown",
    "horovod.torch.broadcast_parameters",
    "horovod.torch.broadcast_optimizer_state",
    "horovod.torch.broadcast_object",
}
DDP_DROP = INIT_PG | {"torch.distributed.destroy_process_group"}
# what only FSDP needs, dropped with the statement that calls it (a value bound to a name only the
# dropped calls use: the mesh, the mixed precision policy, the state dict options)
FSDP_SETUP = {
    "torch.distributed.fsdp.MixedPrecisionPolicy",
    "torch.distributed.fsdp.CPUOffloadPolicy",
    "torch.distributed.fsdp.OffloadPolicy",
    "torch.distributed.device_mesh.init_device_mesh",
    "torch.distributed.init_device_mesh",
    "torch.distributed.checkpoint.state_dict.StateDictOptions",
}
DCP = "torch.distributed.checkpoint.state_dict."
# the full-state collectives and what they are on an unsharded model: (method, receiver argument
# index/keyword, state argument index/keyword or None)
FSDP_STATE = {
    DCP + "get_model_state_dict": ("state_dict", (0, "model"), None),
    DCP + "get_optimizer_state_dict": ("state_dict", (1, "optimizers"), None),
    DCP + "set_model_state_dict": ("load_state_dict", (0, "model"), (1, "model_state_dict")),
    DCP + "set_optimizer_state_dict": ("load_state_dict", (1, "optimizers"), (2, "optim_state_dict")),
}
TARGET_NAMES = {"ddp": "DDP", "horovod": "Horovod", "fsdp": "FSDP"}
AVERAGES = {
    "ddp": "DDP averages in backward",
    "horovod": "Horovod averages in the optimizer",
    "fsdp": "FSDP shards the model with fully_shard and averages in backward",
}
ENV_RANKS = {"LOCAL_RANK": "local_rank", "RANK": "rank", "WORLD_SIZE": "world_size"}
HVD_OPS = {"Sum": "sum", "Average": "mean", "Max": "max", "Min": "min"}


def strip(anatomy: Anatomy, options: Options) -> Tuple[cst.Module, List[Finding]]:
    """Remove the other backend's constructs; return the re-parsed module and what was done."""
    from distify.rules.base import Context  # the rules' edit and report helpers (the registry imports this module)

    ctx = Context(anatomy, options)
    a = anatomy
    flavour = a.flavour
    if flavour == "fsdp" and a.calls_to(FSDP1):
        site = a.calls_to(FSDP1)[0]
        ctx.warn(CONVERT_CODE, site.call, "FSDP1 (FullyShardedDataParallel) is not converted: migrate the script to "
                 "fully_shard (FSDP2) by hand, or keep it")
        return None, ctx.findings
    if flavour == "ddp" and not a.calls_to(DDP | DIST_SAMPLER):
        # init_process_group without a DDP wrapper or DistributedSampler: the script shards and
        # reduces by hand; stripping its init would leave that machinery without a process group
        init = a.calls_to(INIT_PG)[0]
        ctx.warn(CONVERT_CODE, init.call, "hand-written data parallelism (no DDP wrapper, no DistributedSampler): not converted")
        return None, ctx.findings
    rt = ctx.runtime
    block = find_block(a.module)
    if block is not None:
        # the inline runtime of a --standalone run speaks the old backend: drop it (with its marker,
        # so that the old backend's imports it used become unused); the engine writes a new one
        ctx.edits.replace(block.node, lambda n: n.with_changes(leading_lines=()))
        ctx.edits.remove(block.node)

    def neutral(node: cst.CSTNode, fn_name: str) -> None:
        ctx.edits.replace(node, lambda n: cst.parse_expression(f"{rt}.{fn_name}()"))

    wrapped: Set[str] = set()
    left: List[CallSite] = []  # calls into the old backend that no branch below rewrites
    why: dict = {}  # id(site) -> a specific reason it is left
    averages = AVERAGES.get(ctx.backend, "")
    setup_names = _fsdp_setup_names(a) if flavour == "fsdp" else {}
    sharding_loops: Set[cst.CSTNode] = set()
    rekeyed = _rekeyed_states(a) if flavour == "fsdp" else {}
    for site in a.calls:
        q = site.qualname or ""
        call = site.call
        if flavour == "fsdp":
            if id(call) in rekeyed.values():
                continue  # goes with the set_optimizer_state_dict around it
            if q in DDP_DROP and call_statement(site.stmt, call):
                _remove(ctx, site.stmt)
                ctx.report(CONVERT_CODE, call, f"{dotted(call.func)}() removed (the {TARGET_NAMES[ctx.backend]} rules add their own)")
            elif q in FULLY_SHARD and call.args:
                target = assigned_name(site.stmt, call)
                inner = dotted(call.args[0].value)
                loop = _sharding_loop(a, site)
                if loop is not None:
                    if loop not in sharding_loops:
                        sharding_loops.add(loop)
                        ctx.edits.remove(loop)
                elif call_statement(site.stmt, call) or (target is not None and inner == target):
                    _remove(ctx, site.stmt)  # fully_shard(model) / model = fully_shard(model)
                else:
                    ctx.edits.replace(call, lambda n: n.args[0].value)
                ctx.report(CONVERT_CODE, call, f"fully_shard({ctx.code(call.args[0].value)}) removed ({averages})")
            elif q in FSDP_SETUP:
                target = assigned_name(site.stmt, call)
                if target is not None and setup_names.get(target):
                    _remove(ctx, site.stmt)
                elif not _inside_dropped(a, site):
                    left.append(site)
            elif q in FSDP_STATE and call.args:
                method, receiver, state = FSDP_STATE[q]
                rec = arg(call, *receiver)
                st = arg(call, *state) if state is not None else None
                if (
                    rec is None
                    or (state is not None and st is None)
                    or isinstance(rec.value, (cst.List, cst.Tuple))
                    or _broadcasts(a, site, st)
                ):
                    # broadcast_from_rank0: only rank 0 holds the state (others pass {}): a plain
                    # load_state_dict would fail on the other ranks
                    left.append(site)
                    if _broadcasts(a, site, st):
                        why[id(site)] = (
                            f"{dotted(call.func)}() loads a state only rank 0 holds (broadcast_from_rank0): a plain "
                            "load_state_dict would fail on the other ranks; file not converted: load the file on every "
                            f"rank first, or keep --backend {flavour}"
                        )
                    continue
                value = st.value if st is not None else None
                if id(call) in rekeyed:
                    # FSDP's re-keying by name only serves set_optimizer_state_dict: a plain
                    # load_state_dict matches by position, whichever way the state is keyed
                    value = value.args[0].value
                text = f"{ctx.code(rec.value)}.{method}({ctx.code(value) if value is not None else ''})"
                ctx.edits.replace(call, lambda n, t=text: cst.parse_expression(t))
                ctx.report(CONVERT_CODE, call, f"{dotted(call.func)}() -> {text} (the model is no longer sharded)")
            elif q in TORCH_DIST_RANK and not call.args:
                neutral(call, TORCH_DIST_RANK[q])
            elif q == "torch.distributed.all_reduce" and call_statement(site.stmt, call) and call.args:
                _in_place_all_reduce(ctx, site, rt)
            elif (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "set_requires_gradient_sync"
                and call_statement(site.stmt, call)
            ):
                _remove(ctx, site.stmt)
                ctx.report(CONVERT_CODE, call, "set_requires_gradient_sync() removed (FSDP only: gradients are averaged on every micro-step, the same result)")
            elif q.startswith("torch.distributed.") and q not in DIST_SAMPLER:
                left.append(site)
        elif flavour == "ddp":
            if q in DDP_DROP and call_statement(site.stmt, call):
                _remove(ctx, site.stmt)
                ctx.report(
                    CONVERT_CODE, call,
                    f"{dotted(call.func)}() removed (" + ("DDP only)" if ctx.backend == "horovod" else "the FSDP rules add their own)"),
                )
            elif q in DDP and call.args:
                target = assigned_name(site.stmt, call)
                inner = dotted(call.args[0].value)
                if target is not None and inner == target:
                    _remove(ctx, site.stmt)  # model = DDP(model, ...)
                else:
                    ctx.edits.replace(call, lambda n: n.args[0].value)
                if target is not None:  # an attribute of the instance: as every method spells it
                    wrapped.update(a.facts.spellings(site.scope, target))
                ctx.report(CONVERT_CODE, call, f"DistributedDataParallel wrapper removed ({averages})")
            elif q in TORCH_DIST_RANK and not call.args:
                neutral(call, TORCH_DIST_RANK[q])
            elif q == "torch.distributed.all_reduce" and call_statement(site.stmt, call) and call.args:
                _in_place_all_reduce(ctx, site, rt)
            elif q.startswith("torch.distributed.") and q not in DIST_SAMPLER:
                left.append(site)
        else:  # horovod
            if q in HVD_DROP and call_statement(site.stmt, call):
                _remove(ctx, site.stmt)
                ctx.report(CONVERT_CODE, call, f"{dotted(call.func)}() removed (Horovod only)")
            elif q == "horovod.torch.DistributedOptimizer" and call.args:
                target = assigned_name(site.stmt, call)
                inner = dotted(call.args[0].value)
                if target is not None and inner == target:
                    _remove(ctx, site.stmt)
                else:
                    ctx.edits.replace(call, lambda n: n.args[0].value)
                ctx.report(CONVERT_CODE, call, f"hvd.DistributedOptimizer removed ({averages})")
            elif (
                q == "horovod.torch.grouped_allreduce_"
                and call_statement(site.stmt, call)
                and call.args
                and gradient_value(ctx.anatomy.facts, call.args[0].value)
                and _hvd_op(ctx, call) == "mean"
            ):
                # averaging gradients before a step (distify's GAN form, DST111): DDP does it in backward;
                # distify's comment above it goes too (remove() keeps comments: they may be the user's)
                ctx.edits.replace(
                    site.stmt,
                    lambda n: n.with_changes(
                        leading_lines=[
                            ln for ln in n.leading_lines
                            if ln.comment is None or "across ranks once, before its step" not in ln.comment.value
                        ]
                    ),
                )
                _remove(ctx, site.stmt)
                ctx.report(CONVERT_CODE, call, f"gradient all-reduce removed ({averages})")
            elif q in HVD_RANK and not call.args:
                neutral(call, HVD_RANK[q])
            elif q in ("horovod.torch.allreduce", "horovod.torch.allreduce_") and call.args:
                value = ctx.code(call.args[0].value)
                op = _hvd_op(ctx, call)
                ctx.edits.replace(call, lambda n, v=value, op=op: cst.parse_expression(f'{rt}.all_reduce({v}, "{op}")'))
            elif q.startswith("horovod.torch."):
                left.append(site)
            elif isinstance(call.func, cst.Attribute) and call.func.attr.value == "synchronize" and call_statement(site.stmt, call) and not call.args:
                _remove(ctx, site.stmt)
        # both: a DistributedSampler takes its replicas and rank from the backend in place
        if q in DIST_SAMPLER:
            drop = {"num_replicas", "rank"}
            if any(x.keyword is not None and x.keyword.value in drop for x in call.args):
                ctx.edits.replace(
                    call,
                    lambda n, drop=drop: n.with_changes(
                        args=_fix_trailing_comma(
                            [x for x in n.args if not (x.keyword is not None and x.keyword.value in drop)]
                        )
                    ),
                )
        # os.environ["LOCAL_RANK"] and friends only exist under torchrun
        env = a.environ_rank(call)
        if env is not None:
            neutral(call, ENV_RANKS[env[0]])

    if left:
        # left in place they would fail at run time, the old backend being gone: convert nothing
        target = TARGET_NAMES[ctx.backend]
        for site in left:
            ctx.warn(
                CONVERT_CODE,
                site.call,
                why.get(id(site))
                or f"{dotted(site.call.func) or site.qualname}() has no {target} counterpart distify writes: "
                f"file not converted; rewrite it by hand or keep --backend {flavour}",
            )
        return None, [f for f in ctx.findings if f.kind == "warning"]
    if ctx.backend == "fsdp":
        _unshard_eval(ctx, a)
    if flavour == "horovod":
        _unwrap_skip_synchronize(ctx)
    if flavour == "ddp":
        for attr, scope, cls, stmt in a.attr_uses:
            if attr.attr.value != "module":
                continue
            base = dotted(attr.value)
            if base in wrapped:
                ctx.edits.replace(attr, lambda n: n.value)

    module = a.module.visit(ApplyEdits(ctx.edits))
    module = cst.parse_module(module.bytes)
    module = _drop_unused_imports(module, flavour)
    return module, ctx.findings


def _unshard_eval(ctx: Context, a: Anatomy) -> None:
    """Converting to FSDP: evaluation sharded with ``runtime.ShardSampler`` (distify's DDP and
    Horovod output) goes back to the whole set on every rank, with its metric sums. ShardSampler's
    shards differ in length by one, and a sharded model's forward all-gathers with every rank: the
    rank with one batch more would wait forever. A fresh FSDP migration evaluates whole too."""
    runtimes = {n for n in (a.local_name_for("distify.runtime"), a.standalone_runtime) if n}

    def is_shard_sampler(expr) -> bool:
        d = dotted(expr.func) if isinstance(expr, cst.Call) else None
        return bool(d) and "." in d and d.rsplit(".", 1)[0] in runtimes and d.endswith(".ShardSampler")

    samplers: Set[str] = set()
    samplers_ds: dict = {}  # sampler name -> (dataset name, its binding statement, its value)
    removed = False
    for site in a.calls:
        if not is_shard_sampler(site.call):
            continue
        target = assigned_name(site.stmt, site.call)
        if target is not None:
            samplers.add(target)
            ctx.edits.remove(site.stmt)
            removed = True
            hoisted = _hoisted_dataset(a, site)
            if hoisted is not None:
                samplers_ds[target] = hoisted
    for site in a.calls:
        sampler = arg(site.call, 99, "sampler")
        if sampler is None or not (is_shard_sampler(sampler.value) or dotted(sampler.value) in samplers):
            continue
        hoisted = samplers_ds.get(dotted(sampler.value) or "")
        dataset = arg(site.call, 0, "dataset")
        if hoisted is not None and dataset is not None and dotted(dataset.value) == hoisted[0]:
            # DST203 bound the loader's dataset to a name for the sampler: put it back inline
            ctx.edits.remove(hoisted[1])
            value = hoisted[2]
            ctx.edits.replace(dataset.value, lambda n, v=value: v)
        ctx.edits.replace(
            site.call,
            lambda n: n.with_changes(
                args=_fix_trailing_comma([x for x in n.args if not (x.keyword is not None and x.keyword.value == "sampler")])
            ),
        )
        ctx.report(CONVERT_CODE, site.call, "evaluation sampler removed: under FSDP every rank evaluates the whole set "
                   "(uneven shards would hang the sharded forward)")
        removed = True
    if not removed:
        return
    for site in a.calls:
        d = dotted(site.call.func) or ""
        if d.rsplit(".", 1)[0] in runtimes and d.endswith(".all_reduce_sum"):
            stmt = site.stmt
            if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
                targets = ctx.code(stmt.body[0].targets[0].target).replace("(", "").replace(")", "").replace(" ", "")
                args = ",".join(ctx.code(x.value).replace(" ", "") for x in site.call.args)
                if targets == args:  # `correct, total = runtime.all_reduce_sum(correct, total)`
                    ctx.edits.remove(stmt)


REKEY = "torch.distributed.fsdp.FullyShardedDataParallel.rekey_optim_state_dict"


def _rekeyed_states(a: Anatomy) -> dict:
    """id(set_optimizer_state_dict call) -> id(the rekey_optim_state_dict call that is its state)."""
    out = {}
    for site in a.calls_to({DCP + "set_optimizer_state_dict"}):
        st = arg(site.call, 2, "optim_state_dict")
        if st is not None and isinstance(st.value, cst.Call) and st.value.args and a.qualname(st.value.func) in {
            REKEY, "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel.rekey_optim_state_dict"
        }:
            out[id(site.call)] = id(st.value)
    return out


def _hoisted_dataset(a: Anatomy, site: CallSite):
    """``ds = Dataset(...)`` right before ``sampler = runtime.ShardSampler(ds)``, with ``ds`` used
    nowhere else than there and in one loader: (name, binding statement, value), else None."""
    ds = arg(site.call, 0, "data_source")
    if ds is None or not isinstance(ds.value, cst.Name):
        return None
    name = ds.value.value
    parents = site.parents
    holder = parents[-1] if parents else site.scope
    body = getattr(holder, "body", None)
    stmts = list(body.body) if isinstance(body, cst.IndentedBlock) else list(getattr(holder, "body", []) or [])
    if site.stmt not in stmts:
        return None
    i = stmts.index(site.stmt)
    if i == 0:
        return None
    prev = stmts[i - 1]
    if not (isinstance(prev, cst.SimpleStatementLine) and len(prev.body) == 1 and isinstance(prev.body[0], cst.Assign)):
        return None
    small = prev.body[0]
    if len(small.targets) != 1 or dotted(small.targets[0].target) != name:
        return None
    scope_node = site.scope
    uses = len(_names(scope_node, name)) if isinstance(scope_node, cst.CSTNode) else 0
    if uses != 3:  # the binding, the sampler, the loader
        return None
    return name, prev, small.value


def _sharding_loop(a: Anatomy, site: CallSite) -> Optional[cst.For]:
    """The for-loop around ``fully_shard(block)`` when sharding is all its body does
    (``for block in model.blocks: fully_shard(block)``): it goes with the calls."""
    if not site.loops or not call_statement(site.stmt, site.call):
        return None
    loop = site.loops[-1]
    parents = a.stmt_parent.get(site.stmt, ())
    if not parents or parents[-1] is not loop or not isinstance(loop.body, cst.IndentedBlock):
        return None
    for stmt in loop.body.body:
        if not (
            isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, cst.Call)
            and a.qualname(stmt.body[0].value.func) in FULLY_SHARD
        ):
            return None
    return loop


def _fsdp_setup_names(a: Anatomy) -> dict:
    """Names bound to FSDP-only values (``mesh = init_device_mesh(...)``, ``mp =
    MixedPrecisionPolicy(...)``, ``opts = StateDictOptions(...)``) -> True when every use of the
    name is an argument of a call the conversion drops (fully_shard, the state collectives)."""
    dropped = FULLY_SHARD | set(FSDP_STATE)
    out = {}
    for site in a.calls_to(FSDP_SETUP):
        name = assigned_name(site.stmt, site.call)
        if name is None or "." in name:
            continue
        ok = True
        for stmt in a.stmt_parent:
            if not isinstance(stmt, cst.SimpleStatementLine) or stmt is site.stmt:
                continue
            for small in stmt.body:
                for node in _names(small, name):
                    ok = ok and _argument_of_dropped(a, small, node, dropped)
        out[name] = ok
    return out


def _names(node: cst.CSTNode, name: str) -> List[cst.Name]:
    found: List[cst.Name] = []

    class V(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            if n.value == name:
                found.append(n)

    node.visit(V())
    return found


def _argument_of_dropped(a: Anatomy, small: cst.CSTNode, name: cst.Name, dropped: Set[str]) -> bool:
    """``name`` is (inside) an argument of a call to one of ``dropped`` in ``small``."""
    result = False

    class V(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            nonlocal result
            if a.qualname(call.func) in dropped and any(name in _names(x, name.value) and _contains(x, name) for x in call.args):
                result = True

    small.visit(V())
    return result


def _contains(node: cst.CSTNode, target: cst.CSTNode) -> bool:
    found = False

    class V(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            nonlocal found
            if n is target:
                found = True
            return not found

    node.visit(V())
    return found


def _broadcasts(a: Anatomy, site: CallSite, state: Optional[cst.Arg]) -> bool:
    """A load whose state only rank 0 holds (``sd = torch.load(p) if rank == 0 else {}``) and
    which relies on ``broadcast_from_rank0`` to reach the others: a plain ``load_state_dict``
    would fail on them. (When every rank loads the file, the broadcast only saves reads.)"""
    if state is None:
        return False
    code = cst.Module(body=[]).code_for_node
    opt = arg(site.call, 99, "options")
    said = opt is not None and "broadcast_from_rank0" in code(opt.value)
    if opt is not None and isinstance(opt.value, cst.Name):
        b = a.reaching_binding(site.scope, opt.value.value, site.stmt)
        said = said or (b is not None and "broadcast_from_rank0" in code(b.stmt))
    if not said:
        return False
    if a.reads_rank(state.value):
        return True
    if isinstance(state.value, cst.Name):
        b = a.reaching_binding(site.scope, state.value.value, site.stmt)
        if b is None or b.kind != "assign" or a.reads_rank(b.stmt) or a.in_rank_guard(b.stmt):
            return True
    return False


def _inside_dropped(a: Anatomy, site: CallSite) -> bool:
    """A MixedPrecisionPolicy/StateDictOptions/mesh built inline in a call the conversion drops."""
    dropped = FULLY_SHARD | set(FSDP_STATE)
    for other in a.calls:
        if other.stmt is site.stmt and other is not site and other.qualname in dropped and _contains(other.call, site.call):
            return True
    return False


def _remove(ctx: Context, stmt: cst.CSTNode) -> None:
    """Drop a call statement (only the call when other statements share its line)."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) > 1:
        return  # call_statement() matched only single-statement lines; nothing to do here
    ctx.edits.remove(stmt)


def _fix_trailing_comma(args: List[cst.Arg]) -> List[cst.Arg]:
    if args and args[-1].comma is not cst.MaybeSentinel.DEFAULT:
        # keep a trailing comma only if the call is laid out over several lines
        last = args[-1]
        ws = last.comma.whitespace_after if isinstance(last.comma, cst.Comma) else None
        if not isinstance(ws, cst.ParenthesizedWhitespace):
            args[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return args


def _in_place_all_reduce(ctx: Context, site, rt: str) -> None:
    """`dist.all_reduce(t, op)` -> `t.copy_(runtime.all_reduce(t, "op"))`: the runtime's all_reduce
    works with every backend (and in a one-process run) and returns the result instead of writing
    it into its argument."""
    call = site.call
    tensor = ctx.code(call.args[0].value)
    op = _ddp_op(ctx, call)
    ctx.edits.replace(
        site.stmt.body[0],
        lambda n, t=tensor, op=op: cst.Expr(cst.parse_expression(f'{t}.copy_({rt}.all_reduce({t}, "{op}"))')),
    )


def _ddp_op(ctx: Context, call: cst.Call) -> str:
    op = arg(call, 1, "op")
    if op is None:
        return "sum"
    text = ctx.code(op.value).upper()
    for key, name in (("SUM", "sum"), ("AVG", "mean"), ("MAX", "max"), ("MIN", "min")):
        if text.endswith(key):
            return name
    return "sum"


def _hvd_op(ctx: Context, call: cst.Call) -> str:
    op = arg(call, None, "op")
    if op is not None:
        q = ctx.anatomy.qualname(op.value) or ""
        return HVD_OPS.get(q.rsplit(".", 1)[-1], "mean")
    avg = arg(call, 1, "average")
    if avg is not None and isinstance(avg.value, cst.Name) and avg.value.value == "False":
        return "sum"
    return "mean"  # hvd.allreduce averages by default


def _unwrap_skip_synchronize(ctx: Context) -> None:
    """`with optimizer.skip_synchronize(): body` -> body (Horovod's AMP idiom)."""
    for stmt in ctx.anatomy.stmt_parent:
        if not isinstance(stmt, cst.With) or len(stmt.items) != 1:
            continue
        item = stmt.items[0].item
        if isinstance(item, cst.Call) and isinstance(item.func, cst.Attribute) and item.func.attr.value == "skip_synchronize":
            if isinstance(stmt.body, cst.IndentedBlock):
                ctx.edits.insert_before(stmt, list(stmt.body.body))
                ctx.edits.remove(stmt)


def _drop_unused_imports(module: cst.Module, flavour: Optional[str]) -> cst.Module:
    """Remove imports of the old backend's names that nothing uses any more."""
    prefixes = ("horovod",) if flavour == "horovod" else ("torch.distributed", "torch.nn.parallel")
    # (an FSDP script's fully_shard, checkpoint.state_dict and device_mesh imports are torch.distributed.*)
    used: Set[str] = set()

    class Uses(cst.CSTVisitor):
        def visit_Import(self, node):
            return False

        def visit_ImportFrom(self, node):
            return False

        def visit_Name(self, node: cst.Name) -> None:
            used.add(node.value)

    module.visit(Uses())

    def keep_aliases(small: cst.BaseSmallStatement):
        """The import without its unused old-backend names (None: drop it)."""
        if isinstance(small, cst.Import):
            names = [
                alias
                for alias in small.names
                if not (
                    (dotted(alias.name) or "").startswith(prefixes)
                    and (dotted(alias.asname.name) if alias.asname else (dotted(alias.name) or "").split(".")[0])
                    not in used
                )
            ]
        elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            module_name = dotted(small.module) if small.module else ""
            if not module_name or not module_name.startswith(prefixes) or module_name.startswith("torch.utils.data"):
                return small
            names = [
                alias
                for alias in small.names
                if (dotted(alias.asname.name) if alias.asname else dotted(alias.name)) in used
            ]
        else:
            return small
        if not names:
            return None
        if len(names) == len(small.names):
            return small
        names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return small.with_changes(names=names)

    def keep_line(stmt: cst.SimpleStatementLine):
        """The line without its unused old-backend imports (`import a; import b` too; None: drop it)."""
        smalls = [keep_aliases(small) if isinstance(small, (cst.Import, cst.ImportFrom)) else small for small in stmt.body]
        kept = [small for small in smalls if small is not None]
        if not kept:
            return None
        if len(kept) < len(stmt.body):
            kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return stmt.with_changes(body=kept)

    class Drop(cst.CSTTransformer):
        def _body(self, body):
            out, carried = [], []
            for stmt in body:
                if isinstance(stmt, cst.SimpleStatementLine) and any(
                    isinstance(small, (cst.Import, cst.ImportFrom)) for small in stmt.body
                ):
                    new = keep_line(stmt)
                    if new is None:
                        carried += list(stmt.leading_lines)
                        continue
                    stmt = new
                if carried:
                    own = list(stmt.leading_lines)
                    stmt = stmt.with_changes(leading_lines=[*carried, *own] if not own else [*own])
                    carried = []
                out.append(stmt)
            return out

        def leave_Module(self, original, updated):
            return updated.with_changes(body=self._body(updated.body))

        def leave_IndentedBlock(self, original, updated):
            body = self._body(updated.body)
            return updated.with_changes(body=body or [cst.SimpleStatementLine(body=[cst.Pass()])])

    return module.visit(Drop())
