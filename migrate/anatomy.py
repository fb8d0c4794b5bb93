"""Read-only analysis of a training script: the "anatomy" every rule reads.

One visitor pass records imports (with aliases), every call with its resolved qualified name, its
enclosing statement, scope and loops, every ``for`` loop, assignment and function/class definition.
A second, cheap pass over those records derives the training structure: DataLoaders and their roles,
optimizers and the models they train, batch loops, epoch loops (also across function calls and
``self.`` attributes), side-effect sites, the entry point, and existing distributed code.

Nothing here edits the tree; nothing here needs libcst's scope metadata (aliases are resolved from
import statements directly, which is an order of magnitude cheaper).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from distify.facts import Binding, Facts, RepeatedBlocks, all_nodes, arg, dotted, keeps_object, rank_dependent, reads_rank, repeated_blocks, training_call  # noqa: F401 - re-exported
from distify.model_state import final_place
from distify.walk import walk
from distify.library import PROGRESS_BARS, known, names_of
from distify.names import IMPLICIT_MODULES, resolve, row_of, seeds_sharded, star_import, unwrapped  # noqa: F401 - re-exported
from distify.standalone import find_block, is_standalone_block

Scope = Union[cst.Module, cst.FunctionDef]
Stmt = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]

DATALOADER = names_of("loader", shard="sampler")  # loaders sharded by a sampler= argument
DEVICE = {"torch.device"}
SAVE = {"torch.save"}
# methods that write a model, tokenizer or config to disk (or upload it) the Hugging Face way:
# one writer (rank 0), whoever the receiver is
SAVE_METHODS = {"save_pretrained", "push_to_hub"}
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
MAKEDIRS = {"os.makedirs", "os.mkdir", "shutil.rmtree", "shutil.copy", "shutil.copyfile", "shutil.move"}
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
    *DCP_STATE,  # gathers or scatters a sharded model's state: every rank takes part
}
# torchrun's variables for where a process sits (horovodrun and srun set none of them)
ENV_RANK_VARS = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE"})
NOT_OPTIMIZERS = ("torch.optim.lr_scheduler", "torch.optim.swa_utils", "torch.optim.Optimizer")

# nn.Module API that works unchanged on a DistributedDataParallel wrapper.
MODULE_API = {
    "train", "eval", "parameters", "named_parameters", "buffers", "named_buffers", "children",
    "named_children", "modules", "named_modules", "zero_grad", "to", "cuda", "cpu", "float",
    "double", "half", "bfloat16", "type", "apply", "requires_grad_", "training", "forward",
    "no_sync", "module", "register_forward_hook", "register_forward_pre_hook", "__call__",
    # DistributedDataParallel's own API
    "register_comm_hook", "join", "join_hook", "reducer", "process_group", "device_ids",
}
# API of the wrapper that must reach the wrapped module to keep checkpoints free of `module.`.
STATE_API = {"state_dict", "load_state_dict"}


@dataclass(eq=False)
class CallSite:
    call: cst.Call
    qualname: Optional[str]
    scope: Scope
    cls: Optional[cst.ClassDef]
    stmt: Stmt  # innermost statement containing the call
    loops: Tuple[cst.For, ...]  # enclosing for-loops, outermost first (within the scope)
    parents: Tuple[cst.CSTNode, ...]  # enclosing statements, outermost first (within the scope)


@dataclass(eq=False)
class Loader:
    call: CallSite
    target: Optional[str]  # dotted: "train_loader", "self.train_loader"
    dataset: Optional[cst.BaseExpression]
    role: str = "unknown"  # train | eval | unknown | shared (one helper builds both: not sharded)
    batch_loops: List["BatchLoop"] = field(default_factory=list)
    bound: List[str] = field(default_factory=list)  # names callers bind a helper's returned loader to
    refs: List[Tuple[Scope, str]] = field(default_factory=list)  # every (scope, reference) that reaches it
    # a family of loaders built by one dict comprehension over constant keys
    # (`loaders = {x: DataLoader(ds[x]) for x in ["train", "val"]}`): the dict's name, the
    # comprehension's variable, its keys, and the keys whose loader feeds training
    family: Optional[str] = None
    key_var: Optional[str] = None
    keys: List[str] = field(default_factory=list)
    train_keys: List[str] = field(default_factory=list)


@dataclass(eq=False)
class BatchLoop:
    loop: cst.For
    scope: Scope
    cls: Optional[cst.ClassDef]
    ref: str  # the dotted name iterated (e.g. "train_loader", "self.train_loader", a parameter)
    trains: bool  # body contains backward() / optimizer step
    # `for b in loaders[phase]` inside `for phase in ["train", "val"]`: the keys `ref[...]` takes
    # and, of those, the ones for which the body reaches backward()/step() (see keyed_loop)
    keys: Optional[List[str]] = None
    train_keys: Optional[List[str]] = None
    # "for": `loop` iterates `ref` (maybe through zip/enumerate/tqdm); "next": `loop` draws from `ref`
    # with next(); "pass": `loop` is a generator's pass over its parameter `ref`, whose batches are
    # drawn by a training loop elsewhere
    via: str = "for"


@dataclass(eq=False)
class EpochLoop:
    loop: cst.For
    scope: Scope
    cls: Optional[cst.ClassDef]
    var: Optional[str]
    # how the epoch loop's scope refers to the loader: dotted expression source
    loader_ref: Optional[str]
    # a generator's endless loop around one pass over the loader (`while True: for b in loader: yield
    # b`): there is no epoch variable, the passes must be counted (`loop` is the pass loop)
    counted: Optional[cst.CSTNode] = None


@dataclass(eq=False)
class Optimizer:
    call: CallSite
    target: Optional[str]
    models: List[str]  # dotted roots whose parameters it optimises


@dataclass(eq=False)
class Model:
    name: str  # dotted: "model", "self.model"
    scope: Scope
    cls: Optional[cst.ClassDef]
    assign: Stmt  # statement that constructs it
    value: Optional[cst.BaseExpression]  # the constructing expression
    place: Stmt  # last statement before the optimizer that moves it (== assign when in place)
    optimizer: Optimizer
    assign_node: Optional[cst.Assign] = None  # the Assign itself (a line may hold several)
    stands_for: Optional[str] = None  # the optimizer's root it is wrapped for (`raw_model = model`)


def assigned_name(stmt: cst.CSTNode, call: cst.Call) -> Optional[str]:
    """'x' / 'self.x' when `stmt` is exactly `x = <call>` (one statement, one target), else None."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1:
            return dotted(small.targets[0].target)
    return None


# node type -> is it a statement (a dict lookup instead of an ABC isinstance check per node)
_STMT_TYPES: Dict[type, bool] = {}


def _is_stmt_type(t: type) -> bool:
    s = _STMT_TYPES[t] = issubclass(t, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
    return s


def positions(wrapper: MetadataWrapper) -> Mapping[cst.CSTNode, CodeRange]:
    """``wrapper.resolve(PositionProvider)``, at half the cost. The provider's own work is one
    code-generation pass; ``resolve`` also runs the batch of batchable providers, which is empty
    here but still visits (and rebuilds) the whole tree. libcst's resolver calls ``_gen`` just
    like this; where that internal differs (another libcst version), the public call is used."""
    try:
        out = PositionProvider()._gen(wrapper)
    except Exception:  # noqa: BLE001 - any libcst-internal mismatch: take the public path
        return wrapper.resolve(PositionProvider)
    if not isinstance(out, Mapping):  # pragma: no cover - an unforeseen libcst version
        return wrapper.resolve(PositionProvider)
    return out


class _Collector(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.aliases: Dict[str, str] = {}
        self.calls: List[CallSite] = []
        self.fors: List[Tuple[cst.For, Scope, Optional[cst.ClassDef], Tuple[cst.For, ...]]] = []
        self.assigns: List[Tuple[cst.Assign, Stmt, Scope, Optional[cst.ClassDef]]] = []
        self.functions: Dict[str, cst.FunctionDef] = {}  # module-level functions
        self.classes: Dict[str, cst.ClassDef] = {}
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

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        outer = self._scope[-1]
        if isinstance(outer, cst.Module) and self._cls[-1] is None and len(self._stmts) == 1:
            self.functions[node.name.value] = node
        if self._cls[-1] is not None and len(self._stmts) >= 2 and self._stmts[-2] is self._cls[-1]:
            self.methods[node] = self._cls[-1]
        self.name_bindings.add(node.name.value)
        self._scope.append(node)
        self._cls.append(self._cls[-1] if node in self.methods else None)
        self._loops.append([])

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scope.pop()
        self._cls.pop()
        self._loops.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
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

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._cls.pop()

    # statements ---------------------------------------------------------------------------
    def _enter_stmt(self, node: Stmt) -> None:
        scope = self._scope[-1]
        within = tuple(s for s in self._stmts if self.stmt_scope.get(s) is scope)
        self.stmt_parent[node] = within
        self.stmt_scope[node] = scope
        self._stmts.append(node)

    def on_visit(self, node: cst.CSTNode) -> bool:
        is_stmt = _STMT_TYPES.get(type(node))
        if is_stmt is None:
            is_stmt = _is_stmt_type(type(node))
        if is_stmt:
            self._enter_stmt(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        if _STMT_TYPES.get(type(original_node)):
            self._stmts.pop()

    def visit_For(self, node: cst.For) -> None:
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

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self.ifexps.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self._stmts:
            self.attr_uses.append((node, self._scope[-1], self._cls[-1], self._stmts[-1]))

    def qualname(self, expr: cst.BaseExpression) -> Optional[str]:
        return resolve(self.aliases, expr)


def _names_in_target(t: cst.BaseExpression) -> Iterable[str]:
    if isinstance(t, cst.Name):
        yield t.value
    elif isinstance(t, (cst.Tuple, cst.List)):
        for el in t.elements:
            yield from _names_in_target(el.value)
    elif isinstance(t, cst.StarredElement):
        yield from _names_in_target(t.value)


def _contains(node: cst.CSTNode, pred) -> bool:
    found = False

    class V(cst.CSTVisitor):
        def on_visit(self, n):
            nonlocal found
            if found:
                return False
            if pred(n):
                found = True
                return False
            return True

    walk(node, V())
    return found


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


def _returns(fn: cst.FunctionDef) -> List[cst.Return]:
    """The return statements of `fn` itself (not of functions or classes nested in it)."""
    found: List[cst.Return] = []

    class V(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is fn

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            found.append(node)

    walk(fn, V())
    return found


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


def bound_from_return(stmt: cst.CSTNode, call: cst.Call, slot: tuple) -> Optional[str]:
    """The caller's reference to the returned slot when `stmt` is `target = call` (target a name or,
    for a tuple, a tuple of names of the same length)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return None
    small = stmt.body[0]
    if not (isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1):
        return None
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


def _trains_directly(node: cst.CSTNode) -> bool:
    return _is_training_body(node)


def training_functions(functions: Mapping[str, cst.FunctionDef], methods: Mapping[cst.FunctionDef, cst.ClassDef]) -> Set[cst.FunctionDef]:
    """Functions and methods whose body reaches backward()/optimizer.step(), directly or through a
    call of another such module-level function (`name(...)`) or method of the same class
    (`self.name(...)`): `_run_epoch` trains when the `_run_batch` it calls does."""
    all_fns = list(functions.values()) + [m for m in methods if m not in functions.values()]
    by_class: Dict[cst.ClassDef, Dict[str, cst.FunctionDef]] = {}
    for m, k in methods.items():
        by_class.setdefault(k, {})[m.name.value] = m
    callees: Dict[cst.FunctionDef, Set[cst.FunctionDef]] = {}
    trains: Set[cst.FunctionDef] = set()
    for fn in all_fns:
        if _trains_directly(fn.body):
            trains.add(fn)
        own = by_class.get(methods.get(fn), {}) if fn in methods else {}
        found: Set[cst.FunctionDef] = set()

        class V(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> None:
                d = dotted(node.func)
                if d is None:
                    return
                if d in functions:
                    found.add(functions[d])
                elif d.startswith("self.") and d[5:] in own:
                    found.add(own[d[5:]])

        walk(fn.body, V())
        callees[fn] = found
    changed = True
    while changed:
        changed = False
        for fn in all_fns:
            if fn not in trains and callees[fn] & trains:
                trains.add(fn)
                changed = True
    return trains


def body_trains(node: cst.CSTNode, trainers: Set[cst.FunctionDef], functions, methods, cls) -> bool:
    """`node` reaches backward()/step() itself or calls a function in `trainers` (see
    `training_functions`): by name for module-level functions, through self for methods of `cls`."""
    if _trains_directly(node):
        return True
    if not trainers:
        return False
    own = {m.name.value: m for m, k in methods.items() if k is cls} if cls is not None else {}

    def pred(n):
        if not isinstance(n, cst.Call):
            return False
        d = dotted(n.func)
        if d is None:
            return False
        if d in functions and functions[d] in trainers:
            return True
        return d.startswith("self.") and own.get(d[5:]) in trainers

    return _contains(node, pred)


ENDLESS = {"repeat", "itertools.repeat", "count", "itertools.count", "cycle", "itertools.cycle"}


def endless_loop(node: cst.CSTNode) -> bool:
    """`while ...:` or `for ... in repeat(...)/itertools.count()/cycle(...)`: a loop around passes."""
    if isinstance(node, cst.While):
        return True
    return isinstance(node, cst.For) and isinstance(node.iter, cst.Call) and (dotted(node.iter.func) or "") in ENDLESS


def generator_passes(fn: cst.FunctionDef) -> List[Tuple[str, cst.CSTNode]]:
    """(parameter, pass) for each pass over a parameter that `fn` yields from: a `for ... in
    <parameter>:` loop whose body yields (`def forever(loader): while True: for b in loader: yield
    b`), or a `yield from <parameter>` statement (also `for l in repeat(loader): yield from l`)."""
    params = {p.name.value for p in fn.params.params}
    out: List[Tuple[str, cst.CSTNode]] = []
    repeated: Dict[str, str] = {}  # loop variable -> parameter it repeats

    class V(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is fn

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def visit_For(self, node: cst.For) -> None:
            if isinstance(node.iter, cst.Name) and node.iter.value in params:
                if _contains(node.body, lambda n: isinstance(n, (cst.Yield,))):
                    out.append((node.iter.value, node))
            elif endless_loop(node) and isinstance(node.target, cst.Name) and node.iter.args:
                src = node.iter.args[0].value
                if isinstance(src, cst.Name) and src.value in params:
                    repeated[node.target.value] = src.value

        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            for small in node.body:
                v = small.value if isinstance(small, cst.Expr) else None
                if isinstance(v, cst.Yield) and isinstance(v.value, cst.From) and isinstance(v.value.item, cst.Name):
                    name = v.value.item.value
                    if name in params:
                        out.append((name, node))
                    elif name in repeated:
                        out.append((repeated[name], node))

    walk(fn, V())
    return out


def next_consumers(calls: Sequence["CallSite"]) -> List[Tuple["CallSite", str]]:
    """(call site, reference) for each `next(<ref>)` / `next(iter(<ref>))` inside a for-loop: the loop
    draws its batches one at a time from <ref> (an endless generator, an iterator over a loader)."""
    out = []
    for c in calls:
        v = drawn_from(c.call) if c.loops else None
        r = ref_text(v) if v is not None else None
        if r is not None:
            out.append((c, r))
    return out


def drawn_from(call: cst.Call) -> Optional[cst.BaseExpression]:
    """`x` of a `next(x)` or `next(iter(x))` call, else None."""
    if dotted(call.func) != "next" or not call.args:
        return None
    v = call.args[0].value
    if isinstance(v, cst.Call) and dotted(v.func) == "iter" and v.args:
        v = v.args[0].value
    return v


# Draws of random indices/batches from a process-wide generator: identical on every rank that was
# seeded alike (and torch's default seed is a constant).
RNG_DRAWS = {
    "torch.randint", "torch.randperm", "torch.multinomial",
    "numpy.random.randint", "numpy.random.choice", "numpy.random.permutation",
    "random.sample", "random.randint", "random.randrange", "random.choice", "random.choices",
}


@dataclass(eq=False)
class GlobalDraw:
    """A training loop whose batches come from a global random stream rather than a DataLoader."""

    loop: cst.For  # the training loop
    scope: Scope
    draw: "CallSite"  # the torch.randint(...)-like call
    via: Optional[cst.FunctionDef]  # the function (called from the loop) that draws, None: the loop itself
    first_use: cst.CSTNode  # the first statement of `scope` that draws (the loop, or a prefetch before it)


def global_draws(anatomy: "Anatomy") -> List[GlobalDraw]:
    """Training loops (a body reaching backward()/step()) that consume no DataLoader and draw their
    data with torch.randint/randperm/numpy/random calls without a `generator=`/seeded RandomState:
    directly, or through a function of this module they call (also one nested in the same scope, as
    nanoGPT-style `get_batch(split)` is)."""
    a = anatomy
    loader_loops = {bl.loop for l in a.loaders for bl in l.batch_loops}
    draws_by_fn: Dict[cst.FunctionDef, CallSite] = {}
    loose: List[CallSite] = []
    for c in a.calls:
        if c.qualname not in RNG_DRAWS or arg(c.call, None, "generator") is not None:
            continue
        if isinstance(c.scope, cst.FunctionDef):
            draws_by_fn.setdefault(c.scope, c)
        loose.append(c)
    if not loose:
        return []
    defs: Dict[str, List[cst.FunctionDef]] = {}
    for stmt in a.stmt_scope:
        if isinstance(stmt, cst.FunctionDef):
            defs.setdefault(stmt.name.value, []).append(stmt)

    def drawing_fn(call: cst.Call, scope: Scope) -> Optional[cst.FunctionDef]:
        d = dotted(call.func)
        for fn in defs.get(d or "", ()):
            home = a.stmt_scope.get(fn)
            if fn in draws_by_fn and (home is scope or isinstance(home, cst.Module)):
                return fn
        return None

    out: List[GlobalDraw] = []
    for loop, scope, cls, outer in a.fors:
        if loop in loader_loops or outer or not _is_training_body(loop.body):
            continue
        direct = [c for c in loose if c.scope is scope and loop in c.loops]
        if direct:
            out.append(GlobalDraw(loop, scope, direct[0], None, loop))
            continue
        for c in a.calls:
            if c.scope is scope and loop in c.loops:
                fn = drawing_fn(c.call, scope)
                if fn is not None:
                    # a prefetch before the loop (`X, Y = get_batch("train")`) draws first
                    first = loop
                    for p in a.calls:
                        if p.scope is scope and dotted(p.call.func) == fn.name.value and not p.loops:
                            top = (*a.stmt_parent.get(p.stmt, ()), p.stmt)[0]
                            if a.is_before(top, first):
                                first = top
                    out.append(GlobalDraw(loop, scope, draws_by_fn[fn], fn, first))
                    break
    return out


def _const_strings(expr: cst.BaseExpression) -> Optional[List[str]]:
    """["train", "val"] for a list/tuple literal of plain strings, else None."""
    if not isinstance(expr, (cst.List, cst.Tuple)) or not expr.elements:
        return None
    out = []
    for e in expr.elements:
        v = e.value
        if not isinstance(v, cst.SimpleString) or not isinstance(v.evaluated_value, str):
            return None
        out.append(v.evaluated_value)
    return out


def loader_family(site: "CallSite") -> Optional[Tuple[str, str, List[str]]]:
    """(dict name, key variable, keys) when the DataLoader call is the value of
    `name = {k: DataLoader(...) for k in ["train", "val"]}` (one for, no condition)."""
    stmt = site.stmt
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)):
        return None
    assign = stmt.body[0]
    comp = assign.value
    if not (isinstance(comp, cst.DictComp) and comp.value is site.call and len(assign.targets) == 1):
        return None
    name = dotted(assign.targets[0].target)
    f = comp.for_in
    if name is None or f.inner_for_in is not None or f.ifs or not isinstance(f.target, cst.Name):
        return None
    if not (isinstance(comp.key, cst.Name) and comp.key.value == f.target.value):
        return None
    keys = _const_strings(f.iter)
    return (name, f.target.value, keys) if keys else None


def keyed_loop(loop: cst.For, outer: Sequence[cst.For], aliases_q) -> Optional[Tuple[str, List[str], str]]:
    """(dict reference, keys, key variable) when `loop` iterates `D[v]` (maybe through enumerate/tqdm)
    and `v` is the variable of an enclosing `for v in ["train", "val"]`."""
    it = _data_of(loop.iter, aliases_q)
    if not (isinstance(it, cst.Subscript) and len(it.slice) == 1 and isinstance(it.slice[0].slice, cst.Index)):
        return None
    key = it.slice[0].slice.value
    base = dotted(it.value)
    if base is None or not isinstance(key, cst.Name):
        return None
    for f in reversed(list(outer)):
        if isinstance(f.target, cst.Name) and f.target.value == key.value:
            keys = _const_strings(f.iter)
            return (base, keys, key.value) if keys else None
    return None


def trains_for_key(body: cst.CSTNode, var: str, key: str) -> bool:
    """Whether `body` reaches backward()/step() when `var == key`: branches of `if var == "other"`
    (or `if var != key`) are skipped, any other condition may hold."""

    def verdict(test: cst.BaseExpression) -> Optional[bool]:
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            left, comp = test.left, test.comparisons[0]
            right = comp.comparator
            if isinstance(left, cst.SimpleString):
                left, right = right, left
            if dotted(left) == var and isinstance(right, cst.SimpleString) and isinstance(right.evaluated_value, str):
                equal = right.evaluated_value == key
                if isinstance(comp.operator, cst.Equal):
                    return equal
                if isinstance(comp.operator, cst.NotEqual):
                    return not equal
        return None

    found = []

    class V(cst.CSTVisitor):
        def visit_If(self, node: cst.If) -> bool:
            v = verdict(node.test)
            if v is None:
                return True
            walk(node.body if v else (node.orelse or cst.IndentedBlock(body=[])), self)
            return False

        def visit_Call(self, node: cst.Call) -> None:
            if _is_training_body(node) and isinstance(node.func, cst.Attribute) and node.func.attr.value in ("backward", "step"):
                found.append(node)

    walk(body, V())
    return bool(found)


def stepped_names(calls: Sequence["CallSite"]) -> Set[str]:
    """Names whose `.step()` is called in a loop (the script has a backward() somewhere)."""
    out = set()
    for c in calls:
        f = c.call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "step" and c.loops and not c.call.args:
            d = dotted(f.value)
            if d is not None:
                out.add(d)
    return out


def steps_parameters(site: "CallSite", stepped: Set[str]) -> bool:
    """An optimizer whoever built it (transformers' AdamW, a library's Lamb): the call receives
    `X.parameters()` (or a list/groups built from it) as its first argument, its result is bound to
    a name, and that name's `.step()` runs in a loop of a script that calls backward()."""
    if not stepped or (site.qualname or "").startswith(NOT_OPTIMIZERS):
        return False
    target = assigned_name(site.stmt, site.call)
    if target is None or target not in stepped:
        return False
    p = arg(site.call, 0, "params")
    if p is None or (site.qualname or "").startswith("horovod."):
        return False
    inner = p.value
    if isinstance(inner, cst.Call) and not (
        (isinstance(inner.func, cst.Attribute) and inner.func.attr.value in ("parameters", "named_parameters"))
        or dotted(inner.func) in ("list", "tuple", "filter", "itertools.chain", "chain")
    ):
        return False  # a wrapper around an optimizer built inline (hvd.DistributedOptimizer(SGD(...)), Lookahead(...))
    return bool(_parameter_roots(p.value))


@dataclass(eq=False)
class ForeignLoader:
    """A training loop's data built by a function imported from another module (`from utils import
    get_training_dataloader`): distify cannot see or shard that loader."""

    loop: BatchLoop
    name: str  # how the building scope names it
    call: "CallSite"  # the call that builds it
    builder: str  # its qualified name ("utils.get_training_dataloader")
    # the statement that binds `name` to it when it is a plain `name = builder(...)` (or a tuple
    # of names): the place to re-shard it; None when the value is bound otherwise
    binding: Optional[cst.SimpleStatementLine] = None
    # the script already re-shards it there (`name = runtime.shard_loader(name)`)
    resharded: bool = False
    # the loops that run its passes (`for epoch in ...` around the batch loop or around a call of
    # the function that holds it), `loader_ref` spelling it where each loop runs
    epochs: List["EpochLoop"] = field(default_factory=list)
    # the training loop that draws the batches when `loop` is a generator's pass over the loader
    # (`batches = infinite(loader)` ... `next(batches)`)
    consumer: Optional[BatchLoop] = None


def foreign_loaders(anatomy: "Anatomy") -> List[ForeignLoader]:
    """Training batch loops not fed by any DataLoader of this file whose iterable is bound (in the
    loop's function, in a caller through a parameter, or as a global) from a call of a function
    imported from a non-torch module; also through a generator of this file that passes over the
    loader it is handed (`batches = infinite(get_loader(...))`): its pass loop, whose passes are
    counted there."""
    a = anatomy
    own = {id(bl) for l in a.loaders for bl in l.batch_loops}
    gens = {id(bl.scope): bl for bl in a.batch_loops if bl.via == "pass" and id(bl) not in own}
    out: List[ForeignLoader] = []
    seen = set()
    for bl in _training_loops(a):
        if id(bl) in own or bl.via == "pass":
            continue
        for site, name, via in _origin_calls(a, bl.scope, bl.ref, 0, ()):
            fn = a.facts.callee(site.call, site.scope)
            if fn is not None and id(fn) in gens:
                out += _through_generator(a, bl, site, gens[id(fn)], seen)
                continue
            q = _foreign_builder(a, site)
            if q is None:
                continue
            if _is_reshard(site.call) or (bl.loop, id(site.call), name) in seen:
                continue  # `loader = runtime.shard_loader(...)` bound before the builder's own line
            seen.add((bl.loop, id(site.call), name))
            stmt = site.stmt if isinstance(site.stmt, cst.SimpleStatementLine) else None
            out.append(ForeignLoader(bl, name, site, q, stmt, _resharded(a, site, name), _passes_of(a, bl, via)))
    return out


def counts(expr: cst.BaseExpression, aliases_q) -> bool:
    """A loop over `expr` counts (epochs, iterations, phases) rather than reading data: range(),
    trange(), itertools.count(), arange(), a literal of constants, a number, through
    enumerate()/tqdm()/iter()."""
    if isinstance(expr, (cst.Integer, cst.SimpleString, cst.ConcatenatedString)):
        return True
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        return all(
            isinstance(e, cst.Element) and isinstance(e.value, (cst.Integer, cst.Float, cst.SimpleString, cst.Name, cst.Attribute))
            for e in expr.elements
        )
    if not isinstance(expr, cst.Call):
        return False
    row = row_of(aliases_q, expr.func)
    if row is not None and row.kind == "counter":
        return True
    inner = _first_items(expr, aliases_q)
    return inner is not None and counts(inner, aliases_q)


@dataclass(eq=False)
class UntracedSource:
    """A training loop whose batches come from something distify cannot trace to a DataLoader
    (of this file or built by another module) nor to a random draw: a call of an unknown function
    iterated directly (`for x, y in utils.get_loader(...)`), a generator fed such a call, a
    collection of this file's own. Nothing shards it, so every rank may read all of it."""

    loop: cst.CSTNode  # the training loop
    source: cst.BaseExpression  # what it iterates or draws from, as the loop's scope spells it
    scope: Scope


def untraced_sources(anatomy: "Anatomy") -> List[UntracedSource]:
    """The innermost training loops (see ``Facts.training_loops``) whose batches no fact traces:
    neither to a loader of this file, nor to one another module builds (``foreign_loaders``), nor
    to a value that names the rank (a split by hand). A loop over a counter (``counts``) that draws
    nothing with next() reads no data of its own (random draws are ``global_draws``' concern)."""
    a = anatomy
    cached = a.__dict__.get("_untraced_sources")
    if cached is not None:
        return cached
    traced = {id(bl) for l in a.loaders for bl in l.batch_loops}
    traced |= {id(f.consumer or f.loop) for f in foreign_loaders(a)}
    own_refs = {l.target for l in a.loaders if l.target} | {
        bl.ref for l in a.loaders for bl in l.batch_loops
    }
    # names a script re-shards itself (`loader = runtime.shard_loader(loader)`)
    own_refs |= {n for c in a.calls if _is_reshard(c.call) or seeds_sharded(c) for n in [assigned_name(c.stmt, c.call)] if n}
    loops = a.facts.training_loops()
    training = [l for l in loops if isinstance(l, cst.For)]
    around = {id(p) for l in loops for p in a.stmt_parent.get(l, ()) if p is not l}
    out: List[UntracedSource] = []
    for loop in loops:
        if isinstance(loop, cst.While) and id(loop) not in around:
            out += _untraced_draws(a, loop, own_refs)
    by_loop: Dict[int, List[BatchLoop]] = {}
    for bl in a.batch_loops:
        if bl.via != "pass":
            by_loop.setdefault(id(bl.loop), []).append(bl)
    for loop in training:
        if id(loop) in around:
            continue  # an epoch loop around the batch loop
        scope = a.stmt_scope.get(loop, a.module)
        loops = by_loop.get(id(loop), [])
        drawn = [bl for bl in loops if bl.via == "next"]
        iterated = [bl for bl in loops if bl.via == "for"]
        if not counts(loop.iter, a.qualname):
            if iterated:
                for bl in iterated:
                    if id(bl) not in traced and not _bound_to_known_data(a, scope, bl.ref, own_refs):
                        out.append(UntracedSource(loop, _ref_node(loop.iter, bl.ref), scope))
            elif not _mentions_any(loop.iter, own_refs) and not a.mentions_rank(loop.iter):
                out.append(UntracedSource(loop, _data_of(loop.iter, a.qualname), scope))
        for bl in drawn:
            if id(bl) not in traced and not _bound_to_known_data(a, scope, bl.ref, own_refs):
                out.append(UntracedSource(loop, _ref_node(loop, bl.ref), scope))
    a.__dict__["_untraced_sources"] = out
    return out


def _untraced_draws(a: "Anatomy", loop: cst.While, own_refs: Set[str]) -> List[UntracedSource]:
    """A training `while` loop that draws its batches with `next(<ref>)` (`batch = next(data_iter)`,
    re-made with `iter(loader)` on StopIteration): each drawn reference no fact traces to a loader
    of this file, to one the script re-shards, or to a split by rank."""
    scope = a.stmt_scope.get(loop, a.module)
    out, seen = [], set()
    for c in a.calls:
        v = drawn_from(c.call) if c.scope is scope and loop in c.parents else None
        ref = ref_text(v) if v is not None else None
        if ref is None or ref in seen or _bound_to_known_data(a, scope, ref, own_refs):
            continue
        seen.add(ref)
        out.append(UntracedSource(loop, v, scope))
    return out


def _data_of(expr: cst.BaseExpression, aliases_q) -> cst.BaseExpression:
    """What a loop over `expr` reads, seen through enumerate()/tqdm()/iter() (their first argument)."""
    while isinstance(expr, cst.Call):
        inner = _first_items(expr, aliases_q)
        if inner is None:
            break
        expr = inner
    return expr


def _mentions_any(expr: cst.CSTNode, refs: Set[str]) -> bool:
    return any(dotted(n) in refs for n in all_nodes(expr) if isinstance(n, (cst.Name, cst.Attribute)))


def _ref_node(node: cst.CSTNode, ref: str) -> cst.CSTNode:
    """The first node under `node` that spells `ref` (for the warning's position), else `node`."""
    for n in all_nodes(node):
        if isinstance(n, (cst.Name, cst.Attribute, cst.Subscript)) and ref_text(n) == ref:
            return n
    return node


def _bound_to_known_data(a: "Anatomy", scope: Scope, ref: str, own_refs: Set[str]) -> bool:
    """`ref` is one of this file's loader names (`own_refs`: also one a closure reads), or is
    bound (in `scope`, else at module level) to a value that names the rank (`shard =
    data[rank::world]`, `loader = get_loader(rank=rank)`), or that comes from this file's own
    loaders, which the rules shard where they are built: a loader's name, or a call of a function
    of this file that builds one (`batches = get_loaders(32)[0]`)."""
    if ref in own_refs:
        return True
    builders = {id(l.call.scope) for l in a.loaders if isinstance(l.call.scope, cst.FunctionDef)}
    for sc in (scope, a.module):
        if sc is None:
            continue
        for b in a.facts.bindings(sc).get(ref.split(".")[0].split("[")[0], ()):
            if b.kind != "assign":
                continue
            if a.mentions_rank(b.stmt) or _mentions_any(b.stmt, own_refs):
                return True
            for n in all_nodes(b.stmt):
                if isinstance(n, cst.Call):
                    fn = a.facts.callee(n, sc)
                    if fn is not None and id(fn) in builders:
                        return True
    return False


def _foreign_builder(a: "Anatomy", site: "CallSite") -> Optional[str]:
    """The qualified name of the function `site` calls when another module (not torch) defines
    it, else None."""
    q = site.qualname or star_import(a.star_modules, site.call.func, a.name_bindings) or ""
    if not q or q.split(".")[0] in ("torch", "builtins", "distify") or (dotted(site.call.func) or "") in a.functions:
        return None
    return None if (known(q) is not None and known(q).kind == "loader") else q  # the table says how a library loader shards


def _through_generator(a: "Anatomy", consumer: BatchLoop, site: "CallSite", gen: BatchLoop, seen: set) -> List[ForeignLoader]:
    """The foreign loaders handed (by name) to a generator of this file whose pass loop `gen`
    reads them, the generator's object drawn by the training loop `consumer`."""
    fn = gen.scope
    v = a.facts.bound_value(site.call, fn, gen.ref)
    if v is None or dotted(v) is None:
        return []
    out = []
    for origin, name, _via in _origin_calls(a, site.scope, dotted(v), 0, ()):
        q = _foreign_builder(a, origin)
        if q is None:
            continue
        if _is_reshard(origin.call) or (gen.loop, id(origin.call), name) in seen:
            continue
        seen.add((gen.loop, id(origin.call), name))
        stmt = origin.stmt if isinstance(origin.stmt, cst.SimpleStatementLine) else None
        outer = [p for p in a.stmt_parent.get(gen.loop, ()) if isinstance(p, (cst.For, cst.While)) and p is not gen.loop]
        passes = [EpochLoop(gen.loop, fn, gen.cls, None, gen.ref, counted=gen.loop)] if outer and endless_loop(outer[-1]) else []
        out.append(ForeignLoader(gen, name, origin, q, stmt, _resharded(a, origin, name), passes, consumer=consumer))
    return out


def _is_reshard(call: cst.Call) -> bool:
    """`runtime.shard_loader(x, ...)` (distify's runtime or its inline twin)."""
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "shard_loader"


def _resharded(a: "Anatomy", site: "CallSite", name: str) -> bool:
    """The scope that binds `name` from `site` also rebinds it through ``shard_loader(name)``."""
    for c in a.calls:
        if c.scope is site.scope and _is_reshard(c.call) and c.call.args:
            if dotted(c.call.args[0].value) == name and assigned_name(c.stmt, c.call) == name:
                return True
    return False


def _passes_of(a: "Anatomy", bl: BatchLoop, via=()) -> List["EpochLoop"]:
    """The loop that runs the passes of a training batch loop: the outermost `for` around it in its
    function, else the innermost `for` around a call of that function (climbing callers), with the
    batch loop's iterable translated into that scope's terms (through the parameter it was passed
    as). None for a loop that draws with next() (it has no passes of its own)."""
    if bl.via != "for":
        return []
    outer = [p for p in a.stmt_parent.get(bl.loop, ()) if isinstance(p, cst.For) and p is not bl.loop]
    if outer:
        return [EpochLoop(outer[-1], bl.scope, bl.cls, _loop_var(outer[-1]), bl.ref)]
    for site, ref in via:  # the calls that handed the loader in, innermost first
        if site.loops:
            ep = site.loops[-1]
            return [EpochLoop(ep, site.scope, site.cls, _loop_var(ep), ref)]
    if via:
        return []
    fn, ref = bl.scope, bl.ref
    for _ in range(4):
        if not isinstance(fn, cst.FunctionDef):
            break
        sites = a.facts.callers(fn)
        if not sites:
            break
        site = sites[0]
        if ref in a.facts.params(fn):
            v = a.facts.bound_value(site.call, fn, ref)
            ref = dotted(v) if v is not None else None
        if site.loops:
            ep = site.loops[-1]
            return [EpochLoop(ep, site.scope, site.cls, _loop_var(ep), ref)]
        fn = site.scope
    return []


def _training_loops(a: "Anatomy") -> List[BatchLoop]:
    return [bl for bl in a.batch_loops if bl.trains]


def _origin_calls(a: "Anatomy", scope: Scope, name: str, depth: int, via: tuple) -> list:
    """Every (call site, name, via) whose call's result `name` holds in `scope`: an assignment
    there, or through the parameter each caller binds (`via`: those calls with the name each one
    passes, innermost first), or a module-level global."""
    if depth > 4 or "." in name or "[" in name:
        return []
    if isinstance(scope, cst.FunctionDef) and name in a.facts.params(scope):
        out = []
        for site in a.facts.callers(scope):
            v = a.facts.bound_value(site.call, scope, name)
            if v is not None and dotted(v) is not None:
                out += _origin_calls(a, site.scope, dotted(v), depth + 1, via + ((site, dotted(v)),))
        return out
    for c in a.calls:
        if c.scope is scope and isinstance(c.stmt, cst.SimpleStatementLine) and len(c.stmt.body) == 1:
            small = c.stmt.body[0]
            if isinstance(small, cst.AnnAssign) and small.value is c.call and dotted(small.target) == name:
                return [(c, name, via)]  # `train_loader: DataLoader = get_loader(...)`
            if isinstance(small, cst.Assign) and small.value is c.call and len(small.targets) == 1:
                t = small.targets[0].target
                names = [dotted(t)] if dotted(t) else [dotted(e.value) for e in getattr(t, "elements", [])]
                if name in names:
                    return [(c, name, via)]
    if isinstance(scope, cst.FunctionDef) and name not in a.facts.bindings(scope):
        return _origin_calls(a, a.module, name, depth + 1, via)
    return []


# --- end of data flow -------------------------------------------------------------------------------


@dataclass(eq=False)
class Anatomy:
    module: cst.Module
    wrapper: MetadataWrapper
    aliases: Dict[str, str]
    calls: List[CallSite]
    loaders: List[Loader]
    optimizers: List[Optimizer]
    models: List[Model]
    epoch_loops: Dict[Loader, List[EpochLoop]]
    entry_owner: Optional[cst.CSTNode]  # the FunctionDef / main-guard If / Module to set up in
    entry_body: Sequence[cst.CSTNode]  # its statements
    distributed: List[str]  # reasons the script already is distributed
    has_training: bool
    functions: Dict[str, cst.FunctionDef]
    classes: Dict[str, cst.ClassDef]
    methods: Dict[cst.FunctionDef, cst.ClassDef]
    stmt_parent: Dict[cst.CSTNode, Tuple[cst.CSTNode, ...]]
    stmt_scope: Dict[cst.CSTNode, Scope]
    attr_uses: List[Tuple[cst.Attribute, Scope, Optional[cst.ClassDef], Stmt]]
    name_bindings: Set[str]
    star_modules: Tuple[str, ...]
    fors: List[Tuple[cst.For, Scope, Optional[cst.ClassDef], Tuple[cst.For, ...]]]
    ifexps: List[cst.IfExp] = field(default_factory=list)
    facts: Optional[Facts] = None  # the queries below answer from it
    # (scope, name) -> the other (scope, name) pairs its value flows to: arguments to parameters (also
    # through `Cls(...)` into `__init__`), returns to the caller's names, `self.x = name(.to(dev))`
    flow_from: Optional[object] = None
    batch_loops: List[BatchLoop] = field(default_factory=list)  # every loop over an iterable (see BatchLoop)
    want_positions: bool = True  # False when nothing will show them (--quiet): skips a costly pass
    _positions: Optional[dict] = None
    _order: Optional[dict] = None

    def position(self, node: cst.CSTNode) -> Tuple[int, int]:
        if not self.want_positions:
            return (0, 0)
        if self._positions is None:
            self._positions = positions(self.wrapper)
        rng: Optional[CodeRange] = self._positions.get(node)
        if rng is None:
            return (0, 0)
        return (rng.start.line, rng.start.column + 1)

    def qualname(self, expr: cst.BaseExpression) -> Optional[str]:
        return resolve(self.aliases, expr)

    def local_name_for(self, qualified: str) -> Optional[str]:
        """An existing local spelling of a qualified name (e.g. 'dist' for torch.distributed)."""
        for local, q in self.aliases.items():
            if q == qualified:
                return local
        return None

    @property
    def migrated_by_distify(self) -> bool:
        """The script imports distify's runtime, or holds the inline runtime class of a --standalone
        run: it is distify's output (maybe edited since)."""
        return any(q == "distify.runtime" for q in self.aliases.values()) or self.standalone_runtime is not None

    @property
    def standalone_runtime(self) -> Optional[str]:
        """Name of the inline runtime class a ``distify --standalone`` run wrote, if any."""
        block = find_block(self.module)
        return block.name if block is not None else None

    @property
    def flavour(self) -> Optional[str]:
        """The distributed backend the script already uses: "horovod", "fsdp", "ddp" or None.
        A sharded script also calls init_process_group: sharding decides before the process group."""
        if "imports horovod" in self.distributed:
            return "horovod"
        if {"shards a model with fully_shard", "wraps a model in FullyShardedDataParallel"} & set(self.distributed):
            return "fsdp"
        if {"calls init_process_group", "wraps a model in DistributedDataParallel"} & set(self.distributed):
            return "ddp"
        return None

    def model_class(self, model: "Model") -> Optional[cst.ClassDef]:
        """The class of this file a model is built from (``GPT(cfg).to(device)``, also through
        DataParallel, torch.compile and ``.to``/``.cuda``/``.train`` chains), None for a model of
        another module (torchvision, ``from_pretrained``) or one that arrives as a parameter."""
        expr = model.value
        while expr is not None:
            expr = through_compile(self.qualname, through_data_parallel(self.qualname, expr))
            if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _SAME_MODULE:
                expr = expr.func.value
                continue
            break
        if isinstance(expr, cst.Call):
            name = dotted(expr.func)
            if name in self.classes:
                return self.classes[name]
        return None

    def repeated_blocks(self, model: "Model") -> List[RepeatedBlocks]:
        """The repeated-block containers of a model whose class this file defines (see
        ``distify.facts.repeated_blocks``): what FSDP shards one by one before the root."""
        cls = self.model_class(model)
        if cls is None:
            return []
        return repeated_blocks(cls, self.classes, self.qualname)

    def sampler_call(self, loader: "Loader") -> Optional[cst.Call]:
        """The DistributedSampler(...) call a loader already uses (inline or through a name)."""
        a = arg(loader.call.call, 5, "sampler")
        if a is None:
            return None
        if isinstance(a.value, cst.Call) and self.qualname(a.value.func) in DIST_SAMPLER:
            return a.value
        name = dotted(a.value)
        if name is None:
            return None
        for c in self.calls:
            if c.qualname in DIST_SAMPLER and isinstance(c.stmt, cst.SimpleStatementLine):
                small = c.stmt.body[0]
                if (
                    isinstance(small, cst.Assign)
                    and small.value is c.call
                    and any(dotted(t.target) == name for t in small.targets)
                ):
                    return c.call
        return None

    def save_sites(self) -> List[CallSite]:
        """Checkpoint writes: torch.save(...) and `x.save_pretrained(...)` / `x.push_to_hub(...)`."""
        return [
            c for c in self.calls
            if c.qualname in SAVE
            or (isinstance(c.call.func, cst.Attribute) and c.call.func.attr.value in SAVE_METHODS)
        ]

    def calls_to(self, names: Set[str]) -> List[CallSite]:
        return [c for c in self.calls if c.qualname in names]

    def method_calls(self, scope: Scope, receiver: str) -> List[Tuple[str, CallSite]]:
        """(method, call site) for each ``receiver.method(...)`` in ``scope``, the receiver a dotted
        name (``model.decode(z)``, ``self.model.generate(ids)``), in source order."""
        return [
            (c.call.func.attr.value, c)
            for c in self.calls
            if c.scope is scope and isinstance(c.call.func, cst.Attribute) and dotted(c.call.func.value) == receiver
        ]

    def class_methods(self, cls: cst.ClassDef, depth: int = 0) -> Tuple[Set[str], bool]:
        """(the methods ``cls`` and its bases of this file define, whether some base is a class of
        another module other than ``nn.Module``: its methods are not known here)."""
        found = {
            s.name.value for s in cls.body.body if isinstance(s, cst.FunctionDef)
        }
        foreign = False
        for base in cls.bases:
            name = dotted(base.value)
            if name in self.classes and depth < 8:
                more, far = self.class_methods(self.classes[name], depth + 1)
                found |= more
                foreign = foreign or far
            elif self.qualname(base.value) != "torch.nn.Module":
                foreign = True
        return found, foreign

    def is_before(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        """Source order of two statements (from the analysis pass: independent of positions)."""
        if self._order is None:
            self._order = {s: i for i, s in enumerate(self.stmt_parent)}
        if a in self._order and b in self._order:
            return self._order[a] < self._order[b]
        return self._positions_for_order(a) < self._positions_for_order(b)

    def _positions_for_order(self, node: cst.CSTNode) -> Tuple[int, int]:
        if self._positions is None:
            self._positions = positions(self.wrapper)
        rng = self._positions.get(node)
        return (rng.start.line, rng.start.column) if rng is not None else (0, 0)

    def scope_of(self, stmt: cst.CSTNode) -> Optional[Scope]:
        return self.stmt_scope.get(stmt)

    # program facts (see distify.facts): rules and the audit ask these, they keep no analysers --
    def order(self, stmt: cst.CSTNode) -> int:
        return self.facts.order(stmt)

    def all_functions(self) -> List[cst.FunctionDef]:
        return self.facts.all_functions()

    def loops_around(self, stmt: cst.CSTNode) -> List[cst.CSTNode]:
        return self.facts.loops_around(stmt)

    def rank_guards(self, stmt: cst.CSTNode) -> List[Tuple[cst.If, str]]:
        return self.facts.rank_guards(stmt)

    def rank_condition(self, test: cst.BaseExpression) -> bool:
        return self.facts.rank_condition(test)

    def runs_on_some_ranks(self, stmt: cst.CSTNode) -> bool:
        return self.facts.runs_on_some_ranks(stmt)

    def call_on_some_ranks(self, site: CallSite) -> bool:
        return self.facts.call_on_some_ranks(site)

    def trains(self, node: cst.CSTNode) -> bool:
        return self.facts.trains(node)

    def on_training_path(self, stmt: cst.CSTNode) -> bool:
        return self.facts.on_training_path(stmt)

    def in_rank_guard(self, stmt: cst.CSTNode) -> bool:
        return self.facts.in_rank_guard(stmt)

    def reads_rank(self, node: cst.CSTNode) -> bool:
        """The expression's value differs between ranks because it reads a rank: a rank call or
        name, a name the script binds to one, a rank environment variable (see ``facts.reads_rank``).
        A write whose arguments read the rank goes to a per-rank file: every rank keeps it."""
        return reads_rank(node, self.facts.rank_names)

    def environ_rank(self, call: cst.Call) -> Optional[Tuple[str, Optional[cst.BaseExpression]]]:
        """``int(os.environ["LOCAL_RANK"])`` -> ("LOCAL_RANK", None); ``int(os.environ.get("RANK",
        -1))`` -> ("RANK", <-1>): a read of one of torchrun's rank variables (RANK, LOCAL_RANK,
        WORLD_SIZE) with its default, else None. horovodrun and srun set none of them."""
        if not (isinstance(call.func, cst.Name) and call.func.value == "int" and len(call.args) == 1):
            return None
        inner = call.args[0].value
        key: Optional[str] = None
        default: Optional[cst.BaseExpression] = None
        if isinstance(inner, cst.Subscript) and self.qualname(inner.value) == "os.environ":
            sl = inner.slice[0].slice if len(inner.slice) == 1 else None
            if isinstance(sl, cst.Index) and isinstance(sl.value, cst.SimpleString):
                key = sl.value.evaluated_value
        elif (
            isinstance(inner, cst.Call)
            and isinstance(inner.func, cst.Attribute)
            and inner.func.attr.value == "get"
            and self.qualname(inner.func.value) == "os.environ"
            and inner.args
            and isinstance(inner.args[0].value, cst.SimpleString)
        ):
            key = inner.args[0].value.evaluated_value
            default = inner.args[1].value if len(inner.args) > 1 else None
        return (key, default) if key in ENV_RANK_VARS else None

    def mentions_rank(self, node: cst.CSTNode) -> bool:
        """The expression names a rank, a device index or a process-specific value: a per-rank file
        name, a log line that says which rank speaks. Rules leave such a write or print on every
        rank (each process has its own file or line); the audit does not count it as a duplicate."""
        if self.reads_rank(node):
            return True
        return any(
            isinstance(n, cst.Name) and any(k in n.value.lower() for k in ("gpu", "device", "worker", "pid"))
            for n in all_nodes(node)
        )

    def callers(self, fn: cst.FunctionDef, any_receiver: bool = False) -> List[CallSite]:
        return self.facts.callers(fn, any_receiver)

    def callee(self, call: cst.Call, scope: Scope) -> Optional[cst.FunctionDef]:
        return self.facts.callee(call, scope)

    def param_for(self, fn: cst.FunctionDef, call: cst.Call, a: cst.Arg) -> Optional[str]:
        return self.facts.param_for(fn, call, a)

    def bound_value(self, call: cst.Call, fn: cst.FunctionDef, param: str) -> Optional[cst.BaseExpression]:
        return self.facts.bound_value(call, fn, param)

    def bindings(self, scope: Scope) -> Dict[str, List[Binding]]:
        return self.facts.bindings(scope)

    def reaching_binding(self, scope: Scope, name: str, stmt: cst.CSTNode) -> Optional[Binding]:
        return self.facts.reaching_binding(scope, name, stmt)

    def uses(self, scope: Scope, name: str):
        return self.facts.uses(scope, name)

    def rebindings(self, scope: Scope, name: str) -> List[cst.CSTNode]:
        return self.facts.rebindings(scope, name)

    def holds(self, scope: Scope, name: str, since: cst.CSTNode, use: cst.CSTNode) -> str:
        return self.facts.holds(scope, name, since, use)


def analyse(module: cst.Module) -> Anatomy:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    col = _Collector()
    walk(module, col)  # the collector's hooks, in libcst's order, without rebuilding the tree
    q = col.qualname

    # existing distributed code --------------------------------------------------------------
    distributed: List[str] = []
    if col.horovod:
        distributed.append("imports horovod")
    for c in col.calls:
        if c.qualname in INIT_PG:
            distributed.append("calls init_process_group")
        elif c.qualname in DDP:
            distributed.append("wraps a model in DistributedDataParallel")
        elif c.qualname in DIST_SAMPLER:
            distributed.append("uses DistributedSampler")
        elif c.qualname in FULLY_SHARD:
            distributed.append("shards a model with fully_shard")
        elif c.qualname in FSDP1:
            distributed.append("wraps a model in FullyShardedDataParallel")

    # loaders --------------------------------------------------------------------------------
    loaders: List[Loader] = []
    for c in col.calls:
        if c.qualname not in DATALOADER:
            continue
        target = assigned_name(c.stmt, c.call)
        ds = arg(c.call, 0, "dataset")
        loader = Loader(call=c, target=target, dataset=ds.value if ds else None)
        fam = loader_family(c)
        if fam is not None:
            loader.family, loader.key_var, loader.keys = fam
        loaders.append(loader)

    # batch loops ----------------------------------------------------------------------------
    batch_loops: List[BatchLoop] = []
    trainers = training_functions(col.functions, col.methods)
    for loop, scope, cls, _outer in col.fors:
        trains = None
        for ref in iterated_refs(loop.iter, q):
            if trains is None:
                trains = body_trains(loop.body, trainers, col.functions, col.methods, cls)
            batch_loops.append(BatchLoop(loop=loop, scope=scope, cls=cls, ref=ref, trains=trains))
    for loop, scope, cls, outer in col.fors:
        keyed = keyed_loop(loop, outer, q)
        if keyed is not None:
            base, keys, var = keyed
            trains_for = [k for k in keys if trains_for_key(loop.body, var, k)]
            batch_loops.append(
                BatchLoop(loop=loop, scope=scope, cls=cls, ref=base, trains=bool(trains_for), keys=keys, train_keys=trains_for)
            )
    for c, ref in next_consumers(col.calls):
        loop = c.loops[-1]
        trains = body_trains(loop.body, trainers, col.functions, col.methods, c.cls)
        batch_loops.append(BatchLoop(loop=loop, scope=c.scope, cls=c.cls, ref=ref, trains=trains, via="next"))
    passes: Dict[cst.CSTNode, cst.FunctionDef] = {}
    for fn in _all_functions(col):
        for param, loop in generator_passes(fn):
            passes[loop] = fn
            if not isinstance(loop, cst.For):  # `yield from loader`: a pass without a for-loop
                batch_loops.append(BatchLoop(loop=loop, scope=fn, cls=None, ref=param, trains=False, via="pass"))
    for bl in batch_loops:
        if bl.loop in passes and bl.scope is passes[bl.loop]:
            bl.via = "pass"

    facts = Facts(module, col.calls, col.functions, col.methods, col.stmt_parent, col.stmt_scope, col.assigns)
    col.facts = facts  # _find_model asks it when the model is final (distify.model_state)
    facts.trainers = frozenset(trainers)
    for bl in batch_loops:  # `for b in bar` after `bar = tqdm(loader)` reads `loader`
        bl.ref = unwrapped(facts, q, bl.scope, bl.ref, bl.loop, ref_text) if bl.via != "pass" else bl.ref

    def params_of(fn: cst.FunctionDef) -> List[str]:
        return [p.name.value for p in fn.params.params]

    callers = facts.callers

    def bind_param(site: CallSite, fn: cst.FunctionDef, pname: str) -> Optional[cst.BaseExpression]:
        if pname not in facts.params(fn):
            return None
        return facts.bound_value(site.call, fn, pname)

    called_functions = [fn for fn in list(col.functions.values()) + list(col.methods) if callers(fn)]

    # which references reach a loader: (scope, reference) pairs, following function parameters,
    # plain-name aliases (`loader = loaders["train"]`) and return values bound by the callers of a
    # helper (`train_loader, val_loader = get_loaders(args)`, `loader = make_loader(ds)`)
    assigns_in: Dict[int, List[cst.Assign]] = {}
    for a_node, _stmt, a_scope, _cls in col.assigns:
        assigns_in.setdefault(id(a_scope), []).append(a_node)

    Ref = Tuple[Scope, str, Optional[CallSite]]  # the call site whose return bound it (None: none)

    def placed(site: CallSite, name: str, origin: Optional[CallSite]) -> List[Ref]:
        """Where a name bound at `site` is visible: its scope, a class's methods, a global's readers."""
        if name.startswith("self."):
            return [(m, name, origin) for m, k in col.methods.items() if k is site.cls and site.cls is not None]
        out = [(site.scope, name, origin)]
        if isinstance(site.scope, cst.Module):
            out += [(f, name, origin) for f in _all_functions(col)]
        return out

    returns_of: Dict[cst.FunctionDef, List[cst.Return]] = {}

    def returned(fn: cst.FunctionDef, matches, origin: Optional[CallSite]) -> List[Ref]:
        if fn not in returns_of:
            returns_of[fn] = _returns(fn) if callers(fn) else []
        slot = return_slot(fn, matches, returns_of[fn])
        if slot is None:
            return []
        out: List[Ref] = []
        for site in callers(fn):
            name = bound_from_return(site.stmt, site.call, slot)
            if name is not None:
                out += placed(site, name, origin if origin is not None else site)
        return out

    def wrapped_refs(value: cst.BaseExpression) -> List[str]:
        """References whose items iterating `value` yields: through wrappers (see iterated_refs) and
        calls of a generator over its parameter (see generator_passes)."""
        refs = iterated_refs(value, q)
        if not refs and isinstance(value, cst.Call):
            fn = col.functions.get(dotted(value.func) or "")
            if fn is not None:
                for pname, loop in generator_passes(fn):
                    if loop in passes:
                        site = next((c for c in col.calls if c.call is value), None)
                        v = bind_param(site, fn, pname) if site is not None else None
                        if v is not None and ref_text(v) is not None:
                            refs.append(ref_text(v))
        return refs

    def refs_of(loader: Loader) -> List[Ref]:
        out: List[Ref] = []
        if loader.family is not None:
            return spread(placed(loader.call, loader.family, None))
        if loader.target is not None:
            if loader.target.startswith("self."):
                cls = loader.call.cls
                return [(m, loader.target, None) for m, k in col.methods.items() if k is cls]
            out = placed(loader.call, loader.target, None)
        elif isinstance(loader.call.scope, cst.FunctionDef):
            # `return DataLoader(...)`: the loader is only known by the names its callers bind
            out = returned(loader.call.scope, lambda e, c=loader.call.call: e is c, None)
        return spread(out)

    def spread(out: List[Ref]) -> List[Ref]:
        """`out` and every reference the values it names flow to: parameters of the functions they
        are passed to (also `Cls(...)` to `__init__`), plain-name aliases and wrappers, `self.`
        attributes set from them, and the names callers bind a returned value to."""
        out = list(out)
        frontier = list(out)
        seen = {(id(s), r) for s, r, _ in out}

        def add(ref: Ref) -> None:
            key = (id(ref[0]), ref[1])
            if key not in seen:
                seen.add(key)
                out.append(ref)
                frontier.append(ref)

        while frontier:
            scope, name, origin = frontier.pop()
            for fn in called_functions:
                for site in callers(fn):
                    if site.scope is not scope:
                        continue
                    for pname in params_of(fn):
                        v = bind_param(site, fn, pname)
                        if v is not None and ref_text(v) == name:
                            add((fn, pname, origin))
            for a_node in assigns_in.get(id(scope), ()):
                if len(a_node.targets) == 1 and isinstance(a_node.targets[0].target, cst.Name):
                    if ref_text(a_node.value) == name or (
                        ref_text(a_node.value) is None and name in wrapped_refs(a_node.value)
                    ):
                        # `loader = loaders["train"]`, `pbar = tqdm(loader)`, `batches = forever(loader)`
                        add((scope, a_node.targets[0].target.value, origin))
                elif (
                    len(a_node.targets) == 1
                    and scope in col.methods
                    and (dotted(a_node.targets[0].target) or "").startswith("self.")
                    and (
                        ref_text(a_node.value) == name
                        or (moves_to_device(a_node.value) and dotted(a_node.value.func.value) == name)
                    )
                ):
                    # `self.train_data = train_data` in a method: every method of the class sees it
                    attr = dotted(a_node.targets[0].target)
                    for m, k in col.methods.items():
                        if k is col.methods[scope]:
                            add((m, attr, origin))
            if isinstance(scope, cst.FunctionDef) and not name.startswith("self."):
                for ref in returned(scope, lambda e, name=name: ref_text(e) == name, origin):
                    add(ref)
        return out

    def flow_from(scope: Scope, name: str) -> List[Tuple[Scope, str]]:
        """Where the value `name` holds in `scope` is also reachable (see `spread`), itself excluded."""
        return [(s, r) for s, r, _ in spread([(scope, name, None)]) if not (s is scope and r == name)]

    all_batch_loops = batch_loops

    for loader in loaders:
        refs = refs_of(loader)
        loader.refs = [(s, r) for s, r, _o in refs]
        origins: Dict[Optional[CallSite], bool] = {o: False for _, _, o in refs}  # -> feeds training
        for bl in batch_loops:
            hit = [o for s, r, o in refs if bl.scope is s and bl.ref == r]
            if hit:
                loader.batch_loops.append(bl)
        if loader.family is not None:
            keyed = [bl for bl in loader.batch_loops if bl.keys is not None and set(bl.keys) <= set(loader.keys)]
            loader.batch_loops = keyed
            loader.train_keys = sorted({k for bl in keyed for k in bl.train_keys or ()})
        if any(bl.trains for bl in loader.batch_loops if bl.via != "pass"):
            for bl in loader.batch_loops:
                if bl.via == "pass":
                    bl.trains = True  # the generator hands this loader's batches to training
        for bl in loader.batch_loops:
            hit = [o for s, r, o in refs if bl.scope is s and bl.ref == r]
            if hit:
                for o in hit:
                    origins[o] = origins[o] or bl.trains
        loader.bound = sorted({r for s, r, o in refs if o is not None and s is o.scope})
        bindings = [trains for o, trains in origins.items() if o is not None]
        if len(bindings) > 1 and any(bindings) and not all(bindings):
            # one helper builds the loaders of training and of evaluation: sharding it would
            # shard evaluation too (DST201 warns)
            loader.role = "shared"
        elif any(bl.trains for bl in loader.batch_loops):
            loader.role = "train"
        elif loader.batch_loops:
            loader.role = "eval"
        else:
            hint = " ".join(
                filter(None, [loader.target, *loader.bound, dotted(loader.dataset) if loader.dataset else None])
            ).lower()
            if any(k in hint for k in ("val", "test", "eval", "dev")):
                loader.role = "eval"
            elif "train" in hint:
                loader.role = "train"

    # epoch loops ----------------------------------------------------------------------------
    def enclosing_fors(node_stmt: cst.CSTNode) -> List[cst.For]:
        return [p for p in col.stmt_parent.get(node_stmt, ()) if isinstance(p, cst.For)]

    def function_of(scope: Scope) -> Optional[cst.FunctionDef]:
        return scope if isinstance(scope, cst.FunctionDef) else None

    epoch_loops: Dict[Loader, List[EpochLoop]] = {}
    for loader in loaders:
        if loader.role != "train":
            continue
        found: List[EpochLoop] = []
        for bl in loader.batch_loops:
            if not bl.trains or bl.via == "next":
                continue  # a loop drawing with next() has no passes of its own
            outer = [f for f in enclosing_fors(bl.loop) if f is not bl.loop]
            if bl.keys is not None:
                # the loop over the phases is not the epoch loop: the one around it is
                outer = [f for f in outer if not (isinstance(f.target, cst.Name) and keyed_loop(bl.loop, (f,), q))]
                if loader.train_keys and len(loader.train_keys) == 1 and outer:
                    ep = outer[-1]
                    found.append(EpochLoop(ep, bl.scope, bl.cls, _loop_var(ep), f'{bl.ref}["{loader.train_keys[0]}"]'))
                continue
            if bl.via == "pass" and (not outer or endless_loop(outer[-1])):
                # `while True: for b in loader: yield b`: count the passes in the generator
                found.append(EpochLoop(bl.loop, bl.scope, bl.cls, None, bl.ref, counted=bl.loop))
                continue
            if outer:
                ep = outer[-1]
                found.append(EpochLoop(ep, bl.scope, bl.cls, _loop_var(ep), bl.ref))
                continue
            # climb to callers: the loop around the call of the function holding the batch loop
            fn = function_of(bl.scope)
            ref_here: Optional[str] = bl.ref
            depth = 0
            while fn is not None and depth < 4:
                depth += 1
                sites = callers(fn)
                if not sites:
                    break
                site = sites[0]
                # translate the reference into the caller's terms
                params = params_of(fn)
                if ref_here in params:
                    v = bind_param(site, fn, ref_here)
                    ref_here = dotted(v) if v is not None else None
                fors = [f for f in site.loops]
                if fors:
                    ep = fors[-1]
                    found.append(EpochLoop(ep, site.scope, site.cls, _loop_var(ep), ref_here))
                    break
                fn = function_of(site.scope)
        epoch_loops[loader] = found

    # optimizers and models ------------------------------------------------------------------
    optimizers: List[Optimizer] = []
    stepped = stepped_names(col.calls) if col.has_backward else set()
    for c in col.calls:
        qn = c.qualname or ""
        if not qn.startswith("torch.optim.") or qn.startswith(NOT_OPTIMIZERS):
            if not steps_parameters(c, stepped):
                continue
        elif len(qn.split(".")) != 3 or not qn.split(".")[2][:1].isupper():
            continue
        target = assigned_name(c.stmt, c.call)
        p = arg(c.call, 0, "params")
        roots: List[str] = []
        if p is not None:
            roots = _parameter_roots(p.value)
        optimizers.append(Optimizer(call=c, target=target, models=roots))

    models: List[Model] = []
    seen_models: Set[Tuple[int, str]] = set()
    for opt in optimizers:
        for root in opt.models:
            key = (id(opt.call.scope if not root.startswith("self.") else opt.call.cls), root)
            if key in seen_models:
                continue
            m = _find_model(col, opt, root)
            compiled = _compiled_alias(col, opt, m) if m is not None else None
            if compiled is not None:
                m = compiled
            if m is not None:
                seen_models.add(key)
                models.append(m)

    # entry point ----------------------------------------------------------------------------
    constructions = [l.call for l in loaders if l.role == "train"] + [o.call for o in optimizers]
    entry_owner, entry_body = _entry(col, module, constructions)

    has_training = col.has_backward and bool(optimizers)

    return Anatomy(
        module=module,
        wrapper=wrapper,
        aliases=col.aliases,
        calls=col.calls,
        loaders=loaders,
        optimizers=optimizers,
        models=models,
        epoch_loops=epoch_loops,
        entry_owner=entry_owner,
        entry_body=entry_body,
        distributed=sorted(set(distributed)),
        has_training=has_training,
        functions=col.functions,
        classes=col.classes,
        methods=col.methods,
        stmt_parent=col.stmt_parent,
        stmt_scope=col.stmt_scope,
        attr_uses=col.attr_uses,
        name_bindings=col.name_bindings,
        star_modules=tuple(col.star_modules),
        fors=col.fors,
        ifexps=col.ifexps,
        facts=facts,
        flow_from=flow_from,
        batch_loops=all_batch_loops,
    )


def _all_functions(col: _Collector) -> List[cst.FunctionDef]:
    return list(col.functions.values())


def _loop_var(loop: cst.For) -> Optional[str]:
    return loop.target.value if isinstance(loop.target, cst.Name) else None


def _parameter_roots(expr: cst.BaseExpression) -> List[str]:
    """Dotted roots of `X.parameters()` / `X.sub.parameters()` calls in an optimizer's params."""
    roots: List[str] = []

    class V(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Attribute) and node.func.attr.value in (
                "parameters",
                "named_parameters",
            ):
                d = dotted(node.func.value)
                if d:
                    parts = d.split(".")
                    root = ".".join(parts[:2]) if parts[0] == "self" and len(parts) > 1 else parts[0]
                    if root not in roots:
                        roots.append(root)

    expr.visit(V())
    return roots


def moves_to_device(expr: cst.BaseExpression) -> bool:
    """`X.to(...)` / `X.cuda(...)` as the outermost call."""
    return (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in ("to", "cuda")
    )


def data_parallel_module(qualname, expr: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    """The module `nn.DataParallel(module, ...)` wraps (None when `expr` is no such call).

    `qualname` resolves a callee through the module's imports (`Anatomy.qualname`)."""
    return _first_arg_of(qualname, expr, DATA_PARALLEL, "module")


def _first_arg_of(qualname, expr, callees, keyword: str) -> Optional[cst.BaseExpression]:
    """The first argument of `expr` when it is a call of one of `callees`, else None."""
    if isinstance(expr, cst.Call) and qualname(expr.func) in callees:
        a = arg(expr, 0, keyword)
        if a is not None and not a.star:
            return a.value
    return None


def through_data_parallel(qualname, expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` with any `nn.DataParallel(...)` around it looked through: DST902 removes the wrapper,
    so the model is what it wraps."""
    inner = data_parallel_module(qualname, expr)
    while inner is not None:
        expr = inner
        inner = data_parallel_module(qualname, expr)
    return expr


COMPILE = {"torch.compile"}
# methods that return the module they are called on
_SAME_MODULE = frozenset({"to", "cuda", "cpu", "train", "float", "double", "half", "bfloat16", "requires_grad_"})


def compiled_module(qualname, expr: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    """The module `torch.compile(module, ...)` compiles (None when `expr` is no such call)."""
    return _first_arg_of(qualname, expr, COMPILE, "model")


def through_compile(qualname, expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` with a `torch.compile(...)` around it looked through (the module it compiles)."""
    inner = compiled_module(qualname, expr)
    return inner if inner is not None else expr


def compiles_model(qualname, expr: cst.BaseExpression, root: str) -> bool:
    """`torch.compile(root, ...)`: the name keeps the same module, compiled (its parameters are the
    module's own; the wrapper goes around the compiled module, as PyTorch advises for DDP)."""
    return dotted(compiled_module(qualname, expr)) == root


def moves_model(qualname, expr: cst.BaseExpression, root: str) -> bool:
    """`root.to(...)` / `root.cuda(...)`, also through DataParallel: `nn.DataParallel(root).cuda()`,
    `nn.DataParallel(root.to(device))`."""
    expr = through_data_parallel(qualname, expr)
    return moves_to_device(expr) and dotted(through_data_parallel(qualname, expr.func.value)) == root


def _find_model(col: _Collector, opt: Optimizer, root: str) -> Optional[Model]:
    """The statement constructing `root` and the last one moving it, before the optimizer."""
    if root.startswith("self."):
        candidates = [
            (a, s, sc) for a, s, sc, k in col.assigns if k is opt.call.cls and k is not None
        ]
    else:
        candidates = [(a, s, sc) for a, s, sc, k in col.assigns if sc is opt.call.scope]
    assign_stmt = None
    value = None
    place = None
    rebinding = None
    assign_node = None
    opt_stmt = opt.call.stmt
    for a, s, sc in candidates:
        if len(a.targets) != 1 or dotted(a.targets[0].target) != root:
            continue
        if sc is opt.call.scope and not _before(col, s, opt_stmt):
            continue
        v = a.value
        if moves_model(col.qualname, v, root) or compiles_model(col.qualname, v, root):
            # model = model.to(device), also `model = nn.DataParallel(model).to(device)`, and
            # model = torch.compile(model): the wrap goes after it (compile first, then wrap)
            place = s
            if assign_stmt is None:
                rebinding = (s, v, a)
            continue
        if dotted(data_parallel_module(col.qualname, v)) == root:
            # model = nn.DataParallel(model): DST902 removes it. A model that comes from a parameter
            # is wrapped in its place, when that is at the optimizer's level (not under an `if`)
            if assign_stmt is None and rebinding is None and col.stmt_parent.get(s) == col.stmt_parent.get(opt_stmt):
                rebinding = (s, v, a)
            continue
        assign_stmt, value, place, assign_node = s, v, s, a
    if assign_stmt is None and rebinding is not None:
        # the model comes from a parameter or a global and is rebound by `model = model.to(...)`
        assign_stmt, value, assign_node = rebinding
        place = assign_stmt
    if assign_stmt is None:
        return None
    # statement-form moves: `model.to(device)` / `model.cuda()` between assignment and optimizer
    for c in col.calls:
        if c.scope is not opt.call.scope and not root.startswith("self."):
            continue
        if moves_model(col.qualname, c.call, root) and isinstance(c.stmt, cst.SimpleStatementLine):
            small = c.stmt.body[0]
            if isinstance(small, cst.Expr) and small.value is c.call:
                if _before(col, place, c.stmt) and _before(col, c.stmt, opt_stmt):
                    place = c.stmt
    late = final_place(col.facts, col.qualname, root, assign_stmt, place, opt_stmt)
    if late is not None:
        place = late
    if place is not assign_stmt:
        # a move nested deeper than the construction (`if args.cuda: model.cuda()`): the wrap goes
        # after the enclosing statement at the construction's level, so it happens on every path
        level = col.stmt_parent.get(assign_stmt, ())
        for s in (*col.stmt_parent.get(place, ()), place):
            if col.stmt_parent.get(s, ()) == level:
                place = s
                break
    return Model(
        name=root,
        scope=col.stmt_scope[assign_stmt],
        cls=opt.call.cls if root.startswith("self.") else None,
        assign=assign_stmt,
        value=value,
        place=place,
        optimizer=opt,
        assign_node=assign_node,
    )


def _compiled_alias(col: _Collector, opt: Optimizer, m: Model) -> Optional[Model]:
    """`raw_model = model` then `model = torch.compile(model)`, the optimizer built on raw_model's
    parameters: training calls `model`, so `model` is what gets wrapped (after the compile),
    while raw_model stays the plain module (its state_dict keeps the original's keys)."""
    other = dotted(m.value) if isinstance(m.value, cst.Name) else None
    if other is None or other == m.name or m.name.startswith("self."):
        return None
    for a, s, sc, _cls in col.assigns:
        if (
            sc is m.scope
            and len(a.targets) == 1
            and dotted(a.targets[0].target) == other
            and compiles_model(col.qualname, a.value, other)
            and _before(col, m.assign, s)
            and _before(col, s, opt.call.stmt)
        ):
            found = _find_model(col, opt, other)
            if found is not None:
                found.stands_for = m.name
            return found
    return None


def _before(col: _Collector, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """Statement order by the visitor's discovery order (source order)."""
    order = col.__dict__.setdefault("_order", {s: i for i, s in enumerate(col.stmt_parent)})
    return order.get(a, -1) < order.get(b, -1)


def _entry(
    col: _Collector, module: cst.Module, constructions: List[CallSite]
) -> Tuple[Optional[cst.CSTNode], Sequence[cst.CSTNode]]:
    """Where process-group setup goes: the body that first builds the training pieces."""
    if not constructions:
        return None, ()
    at_module = [c for c in constructions if isinstance(c.scope, cst.Module) and c.cls is None]
    if at_module:
        guard = col.main_guard
        if guard is not None and all(guard in c.parents for c in at_module):
            return guard, guard.body.body  # training written inline under `if __name__ == ...`
        return module, module.body

    construction_scopes: Set[cst.CSTNode] = {c.scope for c in constructions}
    construction_classes: Set[cst.CSTNode] = {c.cls for c in constructions if c.cls is not None}

    def relevant(fn: cst.FunctionDef, seen=frozenset()) -> bool:
        if fn in construction_scopes or col.methods.get(fn) in construction_classes:
            return True
        for c in col.calls:
            if c.scope is fn:
                d = dotted(c.call.func)
                if d in col.functions and col.functions[d] not in seen and col.functions[d] is not fn:
                    if relevant(col.functions[d], seen | {fn}):
                        return True
                if d in col.classes and col.classes[d] in construction_classes:
                    return True
        return False

    def descend(owner: cst.CSTNode, body: Sequence[cst.CSTNode], seen) -> Tuple[cst.CSTNode, Sequence[cst.CSTNode]]:
        # the first statement of `body` that (transitively) builds training pieces
        for stmt in body:
            sites = [c for c in col.calls if c.stmt is stmt or stmt in c.parents]
            for c in sites:
                d = dotted(c.call.func)
                fn = col.functions.get(d) if d else None
                if fn is not None and fn not in seen and relevant(fn):
                    is_bare_call = (
                        isinstance(stmt, cst.SimpleStatementLine)
                        and isinstance(stmt.body[0], cst.Expr)
                        and stmt.body[0].value is c.call
                    )
                    if is_bare_call:
                        return descend(fn, fn.body.body, seen | {fn})
                    return owner, body
                if c.scope in construction_scopes or (d in col.classes and col.classes[d] in construction_classes):
                    return owner, body
        return owner, body

    if col.main_guard is not None:
        owner, body = descend(col.main_guard, col.main_guard.body.body, frozenset())
        return owner, body
    # no guard: module-level calls of a function, e.g. a bare `main()` at the bottom
    return descend(module, module.body, frozenset())
