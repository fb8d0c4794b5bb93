"""What the anatomy records of a script: the qualified names it looks for, its call sites, loaders,
loops, optimizers and models, and the one visitor pass that collects them (part of the anatomy,
see anatomy.py).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple, Union

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from distify.syntax import dotted
from distify.library import PROGRESS_BARS, names_of
from distify.names import Defined, resolve
from distify.positions import ranges
from distify.runtime_class import is_standalone_block
from distify.values import Record


Scope = Union[cst.Module, cst.FunctionDef]
Stmt = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]

DATALOADER = names_of("loader", shard="sampler")  # loaders sharded by a sampler= argument
DEVICE = {"torch.device"}
SAVE = {"torch.save"}
LOAD = {"torch.load"}
TQDM = PROGRESS_BARS
INIT_PG = {"torch.distributed.init_process_group"}
DDP = {
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "distify.runtime.DDP",  # torch's wrapper, or a pass-through in a one-process run
}
# FSDP2's per-module sharding call (public in torch.distributed.fsdp since 2.6; the _composable
# path is where it lived before) and FSDP1's deprecated wrapper class: either makes a script "fsdp"
FULLY_SHARD = {
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed.fsdp._fully_shard.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard.fully_shard",
}
FSDP1 = {
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
}
# torch.distributed.checkpoint.state_dict's collectives over a sharded model's state (every rank calls them)
DCP_STATE = {
    f"torch.distributed.checkpoint.state_dict.{n}"
    for n in ("get_model_state_dict", "get_optimizer_state_dict", "get_state_dict",
              "set_model_state_dict", "set_optimizer_state_dict", "set_state_dict")
}
DATA_PARALLEL = {
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
}
DIST_SAMPLER = {"torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler"}
# calls that create, move or delete files and directories: one process does it (DST304); on every
# rank they race (`os.replace(tmp, path)` after a save rank 0 alone wrote: FileNotFoundError)
MAKEDIRS = {
    "os.makedirs", "os.mkdir", "shutil.rmtree", "shutil.copy", "shutil.copyfile", "shutil.move",
    "shutil.copy2", "shutil.copytree", "os.remove", "os.unlink", "os.replace", "os.rename", "os.rmdir",
    "os.removedirs", "os.symlink", "os.link",
}
SUMMARY_WRITER = {
    "torch.utils.tensorboard.SummaryWriter",
    "torch.utils.tensorboard.writer.SummaryWriter",
    "tensorboardX.SummaryWriter",
}
LOGGING_BASIC_CONFIG = {"logging.basicConfig"}
# Calls every rank must make together (a rank that skips one leaves the others waiting forever).
COLLECTIVES = {
    *(
        f"torch.distributed.{n}"
        for n in (
            "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "broadcast",
            "broadcast_object_list", "barrier", "monitored_barrier", "reduce", "reduce_scatter",
            "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list",
            "all_to_all", "all_to_all_single",
        )
    ),
    *(
        f"horovod.torch.{n}"
        for n in (
            "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
            "allgather", "allgather_object", "broadcast", "broadcast_", "broadcast_object",
            "broadcast_parameters", "broadcast_optimizer_state", "alltoall", "reducescatter", "join",
            "barrier",
        )
    ),
    "distify.runtime.barrier",
    "distify.runtime.all_reduce",
    "distify.runtime.reduce_mean",
    "distify.runtime.all_reduce_sum",
    "distify.runtime.shared_seed",
    *DCP_STATE,  # gathers or scatters a sharded model's state: every rank takes part
}
# torchrun's variables for where a process sits (horovodrun and srun set none of them)
ENV_RANK_VARS = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE"})
NOT_OPTIMIZERS = ("torch.optim.lr_scheduler", "torch.optim.swa_utils", "torch.optim.Optimizer")

# nn.Module API that works unchanged on a DistributedDataParallel wrapper.
MODULE_API = {
    "train", "eval", "parameters", "buffers", "children", "modules", "zero_grad", "to", "cuda", "cpu", "float",
    "double", "half", "bfloat16", "type", "apply", "requires_grad_", "training", "forward",
    "no_sync", "module", "register_forward_hook", "register_forward_pre_hook", "__call__",
    # DistributedDataParallel's own API
    "register_comm_hook", "join", "join_hook", "reducer", "process_group", "device_ids",
}
# API of the wrapper that must reach the wrapped module to keep checkpoints free of `module.`.
STATE_API = {"state_dict", "load_state_dict"}
# nn.Module's API that names what it yields by its path in the module: on the DDP wrapper every name
# gains `module.` (and named_children yields the wrapped module itself), so what the script saves,
# logs or matches by name (`{n: p for n, p in model.named_parameters() if p.requires_grad}`) reaches
# the wrapped module for the original's names
NAMED_API = {"named_parameters", "named_buffers", "named_children", "named_modules"}


class CallSite(Record):
    """A call of the module with where it sits: its scope, class, statement and enclosing loops."""

    __slots__ = ("call", "qualname", "scope", "cls", "stmt", "loops", "parents", "__dict__")
    call: cst.Call
    qualname: Optional[str]
    scope: Scope
    cls: Optional[cst.ClassDef]
    stmt: Stmt  # innermost statement containing the call
    loops: Tuple[cst.For, ...]  # enclosing for-loops, outermost first (within the scope)
    parents: Tuple[cst.CSTNode, ...]  # enclosing statements, outermost first (within the scope)

    def __init__(self, call: cst.Call, qualname: Optional[str], scope: Scope, cls: Optional[cst.ClassDef], stmt: Stmt,
                 loops: Tuple[cst.For, ...], parents: Tuple[cst.CSTNode, ...]) -> None:
        self._set(call, qualname, scope, cls, stmt, loops, parents)


class Loader(Record):
    """A data loader the script builds, with the loops it feeds and every reference that reaches it."""

    __slots__ = ("call", "target", "dataset", "role", "batch_loops", "bound", "refs", "family", "key_var", "keys",
                 "train_keys", "untrained", "param", "__dict__")
    call: CallSite
    # dotted, as the scope that binds it spells it: "train_loader", "self.train_loader" (an attribute
    # of the instance, "this.train_loader" where the method calls it `this`: Facts.key compares it
    # with another method's spelling, Facts.respell writes it there)
    target: Optional[str]
    dataset: Optional[cst.BaseExpression]
    role: str  # train | eval | unknown | shared (one helper builds both: not sharded)
    batch_loops: List["BatchLoop"]
    bound: List[str]  # names callers bind a helper's returned loader to
    refs: List[Tuple[Scope, str]]  # every (scope, reference) that reaches it
    # a family of loaders built by one dict comprehension over constant keys
    # (`loaders = {x: DataLoader(ds[x]) for x in ["train", "val"]}`): the dict's name, the
    # comprehension's variable, its keys, and the keys whose loader feeds training
    family: Optional[str]
    key_var: Optional[str]
    keys: List[str]
    train_keys: List[str]
    # loops that train at some calls of their function but not at those handing this loader in
    # (``run_epoch(val_loader, model, SimpleLossCompute(criterion, None))``: distify.callable_training)
    untrained: List[cst.CSTNode]
    # built in place as an argument (`train(DataLoader(ds), model)`): the parameter of the script's
    # function it binds, by which that function knows it
    param: Optional[str]

    def __init__(self, call: CallSite, target: Optional[str], dataset: Optional[cst.BaseExpression],
                 role: str = "unknown", batch_loops: Optional[List["BatchLoop"]] = None,
                 bound: Optional[List[str]] = None, refs: Optional[List[Tuple[Scope, str]]] = None,
                 family: Optional[str] = None, key_var: Optional[str] = None, keys: Optional[List[str]] = None,
                 train_keys: Optional[List[str]] = None, untrained: Optional[List[cst.CSTNode]] = None,
                 param: Optional[str] = None) -> None:
        self._set(call, target, dataset, role, [] if batch_loops is None else batch_loops,
                  [] if bound is None else bound, [] if refs is None else refs, family, key_var,
                  [] if keys is None else keys, [] if train_keys is None else train_keys,
                  [] if untrained is None else untrained, param)


class BatchLoop(Record):
    """A ``for`` loop over batches of a loader (or of what stands for one)."""

    __slots__ = ("loop", "scope", "cls", "ref", "trains", "keys", "train_keys", "via", "__dict__")
    loop: cst.For
    scope: Scope
    cls: Optional[cst.ClassDef]
    ref: str  # the dotted name iterated, as `scope` spells it ("train_loader", "self.train_loader", a parameter)
    trains: bool  # body contains backward() / optimizer step
    # `for b in loaders[phase]` inside `for phase in ["train", "val"]`: the keys `ref[...]` takes
    # and, of those, the ones for which the body reaches backward()/step() (see keyed_loop)
    keys: Optional[List[str]]
    train_keys: Optional[List[str]]
    # "for": `loop` iterates `ref` (maybe through zip/enumerate/tqdm); "next": `loop` draws from `ref`
    # with next(); "pass": `loop` is a generator's pass over its parameter `ref`, whose batches are
    # drawn by a training loop elsewhere
    via: str

    def __init__(self, loop: cst.For, scope: Scope, cls: Optional[cst.ClassDef], ref: str, trains: bool,
                 keys: Optional[List[str]] = None, train_keys: Optional[List[str]] = None, via: str = "for") -> None:
        self._set(loop, scope, cls, ref, trains, keys, train_keys, via)


class EpochLoop(Record):
    """A loop around the batch loops: one iteration per pass over the data."""

    __slots__ = ("loop", "scope", "cls", "var", "loader_ref", "counted", "__dict__")
    loop: cst.For
    scope: Scope
    cls: Optional[cst.ClassDef]
    var: Optional[str]
    # how the epoch loop's scope refers to the loader: dotted expression source
    loader_ref: Optional[str]
    # a generator's endless loop around one pass over the loader (`while True: for b in loader: yield
    # b`): there is no epoch variable, the passes must be counted (`loop` is the pass loop)
    counted: Optional[cst.CSTNode]

    def __init__(self, loop: cst.For, scope: Scope, cls: Optional[cst.ClassDef], var: Optional[str],
                 loader_ref: Optional[str], counted: Optional[cst.CSTNode] = None) -> None:
        self._set(loop, scope, cls, var, loader_ref, counted)


class Optimizer(Record):
    """An optimizer the script builds and the models whose parameters it optimises."""

    __slots__ = ("call", "target", "models", "obtained", "__dict__")
    call: CallSite
    target: Optional[str]
    models: List[str]  # dotted roots whose parameters it optimises
    # built and handed back by a function of the script (`model.configure_optimizers(...)`,
    # `build_optimizer(model)`): where the script obtains it, as an Optimizer of the caller's
    # scope naming the model it steps (distify.obtained); None otherwise
    obtained: Optional["Optimizer"]

    def __init__(self, call: CallSite, target: Optional[str], models: List[str],
                 obtained: Optional["Optimizer"] = None) -> None:
        self._set(call, target, models, obtained)

    @property
    def site(self) -> "Optimizer":
        """Where the script obtains this optimizer: `obtained`, else the record itself."""
        return self.obtained if self.obtained is not None else self


class Model(Record):
    """A model the script builds and trains, with where it is built, moved and optimised."""

    __slots__ = ("name", "scope", "cls", "assign", "value", "place", "optimizer", "assign_node", "stands_for",
                 "__dict__")
    name: str  # dotted, as the optimizer's scope spells it: "model", "self.model" (see Loader.target)
    scope: Scope
    cls: Optional[cst.ClassDef]
    assign: Stmt  # statement that constructs it
    value: Optional[cst.BaseExpression]  # the constructing expression
    place: Stmt  # last statement before the optimizer that moves it (== assign when in place)
    optimizer: Optimizer
    assign_node: Optional[cst.Assign]  # the Assign itself (a line may hold several)
    stands_for: Optional[str]  # the optimizer's root it is wrapped for (`raw_model = model`)

    def __init__(self, name: str, scope: Scope, cls: Optional[cst.ClassDef], assign: Stmt,
                 value: Optional[cst.BaseExpression], place: Stmt, optimizer: Optimizer,
                 assign_node: Optional[cst.Assign] = None, stands_for: Optional[str] = None) -> None:
        self._set(name, scope, cls, assign, value, place, optimizer, assign_node, stands_for)


def assigned_name(stmt: cst.CSTNode, call: cst.Call) -> Optional[str]:
    """'x' / 'self.x' when `stmt` is exactly `x = <call>` (one statement, one target), else None."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1:
            return dotted(small.targets[0].target)
    return None


def positions(wrapper: MetadataWrapper) -> Mapping[cst.CSTNode, CodeRange]:
    """``wrapper.resolve(PositionProvider)`` from one cheap code-generation pass (distify.positions);
    where libcst's codegen internals differ (another libcst version), the public call is used."""
    try:
        return ranges(wrapper.module)
    except Exception:  # noqa: BLE001 - any libcst-internal mismatch: take the public path
        return wrapper.resolve(PositionProvider)


class _Collector(cst.CSTVisitor):
    def __init__(self, homes: Optional[Dict[str, str]] = None, aliases: Optional[Dict[str, str]] = None) -> None:
        """`homes` and `aliases`, for a project view: the qualified name of each definition joined
        from another module (see ``distify.names.Defined``) and the relative imports, which the
        module's own import statements cannot resolve."""
        super().__init__()
        self.aliases: Dict[str, str] = dict(aliases or {})
        self.calls: List[CallSite] = []
        self.fors: List[Tuple[cst.For, Scope, Optional[cst.ClassDef], Tuple[cst.For, ...]]] = []
        self.assigns: List[Tuple[cst.Assign, Stmt, Scope, Optional[cst.ClassDef]]] = []
        self.functions: Defined = Defined(self.aliases, homes)  # module-level functions
        self.classes: Defined = Defined(self.aliases, homes)
        self.methods: Dict[cst.FunctionDef, cst.ClassDef] = {}
        self.main_guard: Optional[cst.If] = None
        self.func_scope: Dict[cst.FunctionDef, Scope] = {}
        self.stmt_parent: Dict[cst.CSTNode, Tuple[cst.CSTNode, ...]] = {}
        self.stmt_scope: Dict[cst.CSTNode, Scope] = {}
        self.has_backward = False
        self.horovod = False
        self.attr_uses: List[Tuple[cst.Attribute, Scope, Optional[cst.ClassDef], Stmt]] = []
        self.name_bindings: Set[str] = set()
        self.star_modules: List[str] = []  # `from utils import *`, in source order
        self.ifexps: List[cst.IfExp] = []
        self.yielding: Set[Scope] = set()  # scopes with a yield anywhere in them (nested code included)
        # comprehensions and generator expressions, with the scope and statement they are in
        self.comps: List[Tuple[cst.BaseComp, Scope, Stmt]] = []
        self._scope: List[Scope] = []
        self._cls: List[Optional[cst.ClassDef]] = []
        self._stmts: List[Stmt] = []
        self._loops: List[List[cst.For]] = []

    # scopes -------------------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self._scope.append(node)
        self._cls.append(None)
        self._loops.append([])
        for stmt in node.body:
            if (
                isinstance(stmt, cst.If)
                and isinstance(stmt.test, cst.Comparison)
                and dotted(stmt.test.left) == "__name__"
            ):
                self.main_guard = stmt

    def _visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        outer = self._scope[-1]
        if isinstance(outer, cst.Module) and self._cls[-1] is None and len(self._stmts) == 1:
            self.functions[node.name.value] = node
        if self._cls[-1] is not None and len(self._stmts) >= 2 and self._stmts[-2] is self._cls[-1]:
            self.methods[node] = self._cls[-1]
        self.name_bindings.add(node.name.value)
        self._scope.append(node)
        self._cls.append(self._cls[-1] if node in self.methods else None)
        self._loops.append([])

    def _leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scope.pop()
        self._cls.pop()
        self._loops.pop()

    def _visit_ClassDef(self, node: cst.ClassDef) -> bool:
        if len(self._stmts) == 1:
            self.classes[node.name.value] = node
        self.name_bindings.add(node.name.value)
        self._cls.append(node)
        if len(self._stmts) == 1 and is_standalone_block(node):
            # the inline runtime of a --standalone run: `runtime.x` means what distify.runtime.x does,
            # and the class is distify's own code, with nothing in it to migrate
            self.aliases[node.name.value] = "distify.runtime"
            return False
        return True

    def _leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._cls.pop()

    # statements ---------------------------------------------------------------------------
    def _enter_stmt(self, node: Stmt) -> None:
        scope = self._scope[-1]
        within = tuple(s for s in self._stmts if self.stmt_scope.get(s) is scope)
        self.stmt_parent[node] = within
        self.stmt_scope[node] = scope
        self._stmts.append(node)

    def _visit_For(self, node: cst.For) -> None:
        self.fors.append((node, self._scope[-1], self._cls[-1], tuple(self._loops[-1])))

    def visit_For_body(self, node: cst.For) -> None:
        self._loops[-1].append(node)

    def leave_For_body(self, node: cst.For) -> None:
        self._loops[-1].pop()

    # facts --------------------------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = dotted(alias.name)
            if not name:
                continue
            if name.split(".")[0] == "horovod":
                self.horovod = True
            if alias.asname is not None:
                local = dotted(alias.asname.name)
                if local:
                    self.aliases[local] = name
                    self.name_bindings.add(local)
            else:
                root = name.split(".")[0]
                self.aliases[root] = root
                self.name_bindings.add(root)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None:
            return
        module = dotted(node.module)
        if not module:
            return
        if module.split(".")[0] == "horovod":
            self.horovod = True
        if isinstance(node.names, cst.ImportStar):
            self.star_modules.append(module)
            return
        for alias in node.names:
            name = dotted(alias.name)
            local = dotted(alias.asname.name) if alias.asname is not None else name
            if name and local:
                self.aliases[local] = f"{module}.{name}"
                self.name_bindings.add(local)

    def visit_Assign(self, node: cst.Assign) -> None:
        self.assigns.append((node, self._stmts[-1], self._scope[-1], self._cls[-1]))
        for t in node.targets:
            for n in _names_in_target(t.target):
                self.name_bindings.add(n)

    def visit_Param(self, node: cst.Param) -> None:
        self.name_bindings.add(node.name.value)

    def visit_Call(self, node: cst.Call) -> None:
        qual = self.qualname(node.func)
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
            self.has_backward = True
        self.calls.append(
            CallSite(
                call=node,
                qualname=qual,
                scope=self._scope[-1],
                cls=self._cls[-1],
                stmt=self._stmts[-1],
                loops=tuple(self._loops[-1]),
                parents=self.stmt_parent.get(self._stmts[-1], ()),
            )
        )

    def _comp(self, node: cst.BaseComp) -> None:
        self.comps.append((node, self._scope[-1], self._stmts[-1]))

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comp

    def visit_Yield(self, node: cst.Yield) -> None:
        self.yielding.update(self._scope)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self.ifexps.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self._stmts:
            self.attr_uses.append((node, self._scope[-1], self._cls[-1], self._stmts[-1]))

    def qualname(self, expr: cst.BaseExpression) -> Optional[str]:
        return resolve(self.aliases, expr)


def _statement_hooks(cls: type) -> type:
    """Give the collector a visit_/leave_ hook for every statement type: each enters (leaves) the
    statement, then runs the class's own ``_visit_<Type>`` (``_leave_<Type>``) if it has one. Typed
    hooks are what ``distify.walk`` dispatches cheaply (an ``on_visit`` override is called for every
    node, and libcst's finds the hook by name each time)."""
    # by the MRO: issubclass against libcst's ABC bases searches all their subclasses for each of
    # libcst's ~500 names that is not one (10-50 ms at every start-up)
    bases = (cst.SimpleStatementLine, cst.BaseCompoundStatement)
    kinds = [t for t in vars(cst).values() if isinstance(t, type) and any(b in t.__mro__ for b in bases)]
    for t in kinds:
        own_visit = getattr(cls, f"_visit_{t.__name__}", None)
        own_leave = getattr(cls, f"_leave_{t.__name__}", None)

        def visit(self, node, own=own_visit):
            self._enter_stmt(node)
            return None if own is None else own(self, node)

        def leave(self, node, own=own_leave):
            if own is not None:
                own(self, node)
            self._stmts.pop()

        setattr(cls, f"visit_{t.__name__}", visit)
        setattr(cls, f"leave_{t.__name__}", leave)
    return cls


_statement_hooks(_Collector)


def _names_in_target(t: cst.BaseExpression) -> Iterable[str]:
    if isinstance(t, cst.Name):
        yield t.value
    elif isinstance(t, (cst.Tuple, cst.List)):
        for el in t.elements:
            yield from _names_in_target(el.value)
    elif isinstance(t, cst.StarredElement):
        yield from _names_in_target(t.value)


def _all_functions(col: _Collector) -> List[cst.FunctionDef]:
    return list(col.functions.values())
