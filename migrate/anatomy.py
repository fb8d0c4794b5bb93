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

from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper

from distify.blocks import RepeatedBlocks, repeated_blocks
from distify.dataflow import (
    _loop_var, optimizer_parameter_roots, _returns, bound_from_return, iterated_refs, ref_text, return_slot,
    unwrap_alias,
)
from distify.callable_training import calls_handing, passed_in_place, trains_at, trains_through_values, value_trainers
from distify.facts import Binding, Facts
from distify.instance import instance_of
from distify.obtained import obtained
from distify.model_build import (
    _compiled_alias, _find_model, built_class, moves_to_device,
)
from distify.names import resolve, unwrapped
from distify.positions import Locator, statement_of
from distify.rank import reads_rank
from distify.records import (
    BatchLoop, CallSite, DATALOADER, DDP, DIST_SAMPLER, ENV_RANK_VARS, EpochLoop, FSDP1, FULLY_SHARD,
    INIT_PG, Loader, Model, NOT_OPTIMIZERS, Optimizer, SAVE, Scope, Stmt, _Collector, _all_functions,
    assigned_name, positions,
)
from distify.runtime_class import find_block
from distify.entry import entry_point
from distify.syntax import arg, dotted
from distify.training import (
    body_trains, endless_loop, generator_passes, keyed_loop, loader_family, comprehension_consumers,
    next_consumers, stepped_names, steps_parameters, training_functions, trains_for_key,
)
from distify.values import Record
from distify.walk import walk
from distify.writes import library_method_write, own_method_names


class Anatomy(Record):
    """What ``analyse`` found in a module: its records, the training structure, and its facts."""

    __slots__ = ("module", "wrapper", "aliases", "calls", "loaders", "optimizers", "models", "epoch_loops",
                 "entry_owner", "entry_body", "distributed", "has_training", "functions", "classes", "methods",
                 "stmt_parent", "stmt_scope", "attr_uses", "name_bindings", "star_modules", "fors", "ifexps", "facts",
                 "flow_from", "batch_loops", "want_positions", "text", "_positions", "_order", "_locator", "__dict__")
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
    ifexps: List[cst.IfExp]
    facts: Optional[Facts]  # the queries below answer from it
    # (scope, name) -> the other (scope, name) pairs its value flows to: arguments to parameters (also
    # through `Cls(...)` into `__init__`), returns to the caller's names, `self.x = name(.to(dev))`
    flow_from: Optional[object]
    batch_loops: List[BatchLoop]  # every loop over an iterable (see BatchLoop)
    want_positions: bool  # False when nothing will show them (--quiet): skips a costly pass
    text: Optional[str]  # the text `module` was parsed from, when known: nodes are then located alone
    _positions: Optional[dict]
    _order: Optional[dict]
    _locator: Optional[Locator]

    def __init__(self, module: cst.Module, wrapper: MetadataWrapper, aliases: Dict[str, str], calls: List[CallSite],
                 loaders: List[Loader], optimizers: List[Optimizer], models: List[Model],
                 epoch_loops: Dict[Loader, List[EpochLoop]], entry_owner: Optional[cst.CSTNode],
                 entry_body: Sequence[cst.CSTNode], distributed: List[str], has_training: bool,
                 functions: Dict[str, cst.FunctionDef], classes: Dict[str, cst.ClassDef],
                 methods: Dict[cst.FunctionDef, cst.ClassDef], stmt_parent: Dict[cst.CSTNode, Tuple[cst.CSTNode, ...]],
                 stmt_scope: Dict[cst.CSTNode, Scope],
                 attr_uses: List[Tuple[cst.Attribute, Scope, Optional[cst.ClassDef], Stmt]], name_bindings: Set[str],
                 star_modules: Tuple[str, ...],
                 fors: List[Tuple[cst.For, Scope, Optional[cst.ClassDef], Tuple[cst.For, ...]]],
                 ifexps: Optional[List[cst.IfExp]] = None, facts: Optional[Facts] = None,
                 flow_from: Optional[object] = None, batch_loops: Optional[List[BatchLoop]] = None,
                 want_positions: bool = True, text: Optional[str] = None) -> None:
        self._set(module, wrapper, aliases, calls, loaders, optimizers, models, epoch_loops, entry_owner, entry_body,
                  distributed, has_training, functions, classes, methods, stmt_parent, stmt_scope, attr_uses,
                  name_bindings, star_modules, fors, [] if ifexps is None else ifexps, facts, flow_from,
                  [] if batch_loops is None else batch_loops, want_positions, text)
        self._positions = None
        self._order = None
        self._locator = None

    def position(self, node: cst.CSTNode) -> Tuple[int, int]:
        if not self.want_positions:
            return (0, 0)
        line, column = self._start(node)
        return (line, column + 1) if line else (0, 0)

    def _start(self, node: cst.CSTNode) -> Tuple[int, int]:
        """(line, zero-based column) where `node` starts; (0, 0) for a node not in the module. The
        statement around it is rendered alone where it can be (distify.positions.Locator), else the
        whole module once."""
        if self._positions is None and self.text is not None:
            if self._locator is None:
                owner = statement_of(self.stmt_parent, self.calls, self.attr_uses, self.module)
                self._locator = Locator(self.module, self.text, owner)
            found = self._locator.start(node)
            if found is not None:
                return found
        if self._positions is None:
            self._positions = positions(self.wrapper)
        rng: Optional[CodeRange] = self._positions.get(node)
        return (rng.start.line, rng.start.column) if rng is not None else (0, 0)

    def top_spans(self) -> Optional[List[Tuple[int, int]]]:
        """Where each statement of the module's body lies in `text` (``positions.Locator.top_spans``),
        when locating a finding has read the statements' lines already; None otherwise."""
        return self._locator.top_spans() if self._locator is not None else None

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
        return built_class(self.classes, self.qualname, model.value)

    def repeated_blocks(self, model: "Model") -> List[RepeatedBlocks]:
        """The repeated-block containers of a model whose class this file defines (see
        ``distify.blocks.repeated_blocks``): what FSDP shards one by one before the root."""
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
        """Checkpoint writes: torch.save(...) and `x.save_pretrained(...)` / `x.push_to_hub(...)` of a
        library's object (not a method of the script's own classes: see distify.writes)."""
        own = own_method_names(self.methods)
        return [c for c in self.calls if c.qualname in SAVE or library_method_write(c.call, own) is not None]

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
        return self._start(a) < self._start(b)

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
        return reads_rank(node, self.facts.rank_names, self.facts.rank_calls)

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
        """The expression names a rank or a value made from one (a device, a path built from it): a
        per-rank file name, a log line that says which rank speaks. Rules leave such a write or
        print on every rank (each process has its own file or line); the audit does not count it
        as a duplicate. Data flow from the rank sources, never the spelling (``distify.rank_flow``)."""
        return reads_rank(node, self.facts.made_from_rank, self.facts.process_calls)

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


def analyse(module: cst.Module, project=None, joined=None, text: Optional[str] = None) -> Anatomy:
    """The anatomy of `module`. `project` answers which function of another module of the project a
    qualified name is (``distify.project_reach.ProjectReach``): the facts follow the model there
    too. For a project view, `joined` is (homes, relative aliases): see
    ``distify.records._Collector``. `text`: the text `module` was parsed from (or renders to), which
    lets positions be found statement by statement instead of by rendering the module."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    col = _Collector(*(joined or ()))
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
    facts = Facts(module, col.calls, col.functions, col.methods, col.stmt_parent, col.stmt_scope, col.assigns)
    facts.project, facts.classes, facts.qualname = project, col.classes, q
    trainers = own_trainers = training_functions(col.functions, col.methods, col.calls, col.stmt_scope)
    facts.trainers = frozenset(trainers)
    handed = value_trainers(facts)  # training in a value the function is handed (loss_compute(out, y))
    seeds = {fn for fn in handed if isinstance(fn, cst.FunctionDef)}
    if seeds - trainers:
        trainers = training_functions(col.functions, col.methods, col.calls, col.stmt_scope, seeds=seeds)
        facts.trainers = frozenset(trainers)
        facts._trains.clear()
    for loop, scope, cls, _outer in col.fors:
        trains = None
        for ref in iterated_refs(loop.iter, q):
            if trains is None:
                trains = body_trains(loop.body, trainers, col.functions, col.methods, instance_of(scope, col.methods, col.stmt_scope)) or (
                    bool(handed) and trains_through_values(facts, loop.body, scope, loop)
                )
            batch_loops.append(BatchLoop(loop=loop, scope=scope, cls=cls, ref=ref, trains=trains))
    for loop, scope, cls, outer in col.fors:
        keyed = keyed_loop(loop, outer, q)
        if keyed is not None:
            base, keys, var = keyed
            trains_for = [k for k in keys if trains_for_key(loop.body, var, k)]
            batch_loops.append(
                BatchLoop(loop=loop, scope=scope, cls=cls, ref=base, trains=bool(trains_for), keys=keys, train_keys=trains_for)
            )
    for c, loop, ref in next_consumers(col.calls):
        trains = body_trains(loop.body, trainers, col.functions, col.methods, instance_of(c.scope, col.methods, col.stmt_scope)) or (
            bool(handed) and trains_through_values(facts, loop.body, c.scope, loop)
        )
        batch_loops.append(BatchLoop(loop=loop, scope=c.scope, cls=c.cls, ref=ref, trains=trains, via="next"))
    passes: Dict[cst.CSTNode, cst.FunctionDef] = {}
    for fn in _all_functions(col):
        for param, loop in generator_passes(fn, q, col.yielding):
            passes[loop] = fn
            if not isinstance(loop, cst.For):  # `yield from loader`: a pass without a for-loop
                batch_loops.append(BatchLoop(loop=loop, scope=fn, cls=None, ref=param, trains=False, via="pass"))
    for bl in batch_loops:
        if bl.loop in passes and bl.scope is passes[bl.loop]:
            bl.via = "pass"

    col.facts = facts  # _find_model asks it when the model is final (distify.model_state)
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
    # by calling scope: (function, parameter, the reference a call there passes for it) (spread's index)
    passed_from: Dict[int, List[Tuple[cst.FunctionDef, str, Optional[str]]]] = {}
    for fn, site in ((f, s) for f in called_functions for s in callers(f)):
        for pname, v in [(p, bind_param(site, fn, p)) for p in params_of(fn)] + list(facts.bound_keywords(site.call, fn).items()):
            passed_from.setdefault(id(site.scope), []).append((fn, pname, ref_text(v) if v is not None else None))

    # which references reach a loader: (scope, reference) pairs, following function parameters,
    # plain-name aliases (`loader = loaders["train"]`) and return values bound by the callers of a
    # helper (`train_loader, val_loader = get_loaders(args)`, `loader = make_loader(ds)`)
    assigns_in: Dict[int, List[cst.Assign]] = {}
    for a_node, _stmt, a_scope, _cls in col.assigns:
        assigns_in.setdefault(id(a_scope), []).append(a_node)

    Ref = Tuple[Scope, str, Optional[CallSite]]  # the call site whose return bound it (None: none)

    def placed(site: CallSite, name: str, origin: Optional[CallSite]) -> List[Ref]:
        """Where a name bound at `site` is visible: its scope, a class's methods, a global's readers."""
        if facts.instance_attr(site.scope, name) is not None:  # an attribute of the instance
            return on_instance(site.scope, name, origin)
        out = [(site.scope, name, origin)]
        if isinstance(site.scope, cst.Module):
            out += [(f, name, origin) for f in _all_functions(col) if not facts.local_to(f, name)]
        return out

    def on_instance(scope: Scope, name: str, origin: Optional[CallSite]) -> List[Ref]:
        """An attribute of the instance bound in `scope`: every method of the class sees it, each
        under its own spelling of the instance (``this.loader`` in one, ``self.loader`` in another)."""
        cls = facts.instance(scope)[1]
        out = []
        for m, k in col.methods.items():
            there = facts.respell(name, scope, m) if k is cls else None
            if there is not None:
                out.append((m, there, origin))
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
            fn = col.functions.named(dotted(value.func))
            if fn is not None:
                for pname, loop in generator_passes(fn, q, col.yielding):
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
            if facts.instance_attr(loader.call.scope, loader.target) is not None:
                return on_instance(loader.call.scope, loader.target, None)
            out = placed(loader.call, loader.target, None)
        elif loader.family is None and passed_in_place(facts, loader.call) is not None:
            # `train(DataLoader(ds, shuffle=True), model, opt)`: known by the parameter it binds
            _site, fn, loader.param = passed_in_place(facts, loader.call)
            out = [(fn, loader.param, None)]
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
            for fn, pname, text in passed_from.get(id(scope), ()):
                if text == name:
                    add((fn, pname, origin))
            for a_node in assigns_in.get(id(scope), ()):
                if len(a_node.targets) == 1 and isinstance(a_node.targets[0].target, cst.Name):
                    if ref_text(a_node.value) == name or unwrap_alias(a_node.value) == name or (
                        ref_text(a_node.value) is None and name in wrapped_refs(a_node.value)
                    ):
                        # `loader = loaders["train"]`, `pbar = tqdm(loader)`, `batches = forever(loader)`,
                        # `to_save = model.module if hasattr(model, "module") else model`
                        add((scope, a_node.targets[0].target.value, origin))
                elif (
                    len(a_node.targets) == 1
                    and scope in col.methods
                    and facts.instance_attr(scope, dotted(a_node.targets[0].target)) is not None
                    and (
                        ref_text(a_node.value) == name
                        or (moves_to_device(a_node.value) and ref_text(a_node.value.func.value) == name)
                    )
                ):
                    # `self.train_data = train_data` in a method: every method of the class sees it
                    for ref in on_instance(scope, dotted(a_node.targets[0].target), origin):
                        add(ref)
            if isinstance(scope, cst.FunctionDef) and facts.instance_attr(scope, name) is None:
                for ref in returned(scope, lambda e, name=name: ref_text(e) == name, origin):
                    add(ref)
        return out

    def flow_from(scope: Scope, name: str) -> List[Tuple[Scope, str]]:
        """Where the value `name` holds in `scope` is also reachable (see `spread`), itself excluded."""
        return [(s, r) for s, r, _ in spread([(scope, name, None)]) if not (s is scope and r == name)]

    all_batch_loops = batch_loops
    comp_refs = [(sc, unwrapped(facts, q, sc, r, st, ref_text), t) for sc, st, r, t in comprehension_consumers(col.comps, q)]

    def handing(fn: cst.FunctionDef, param: str, reached: Set[Tuple[int, str]], loader: Loader) -> List[CallSite]:
        return calls_handing(facts, fn, param, lambda v, sc: v is loader.call.call or (id(sc), ref_text(v)) in reached)

    def seen_by(loader: Loader, bl: BatchLoop, reached: Set[Tuple[int, str]]) -> BatchLoop:
        """`bl` as `loader` sees it: a loop that trains only through a value its function is handed
        (``loss_compute(out, y)``) trains for this loader when a call handing the loader in hands a
        value that trains there (distify.callable_training.trains_at)."""
        if not (handed and bl.trains and bl.via in ("for", "next") and isinstance(bl.scope, cst.FunctionDef)):
            return bl
        if body_trains(bl.loop.body, own_trainers, col.functions, col.methods, instance_of(bl.scope, col.methods, col.stmt_scope)):
            return bl
        sites = handing(bl.scope, bl.ref, reached, loader)
        verdicts = [trains_at(facts, bl.loop.body, bl.scope, site) for site in sites]
        if not sites or any(v is not False for v in verdicts):
            return bl
        loader.untrained.append(bl.loop)
        return BatchLoop(bl.loop, bl.scope, bl.cls, bl.ref, False, bl.keys, bl.train_keys, bl.via)

    reached_by: Dict[Loader, Set[Tuple[int, str]]] = {}
    for loader in loaders:
        refs = refs_of(loader)
        loader.refs = [(s, r) for s, r, _o in refs]
        reached = reached_by[loader] = {(id(s), r) for s, r, _o in refs}
        origins: Dict[Optional[CallSite], bool] = {o: False for _, _, o in refs}  # -> feeds training
        for bl in batch_loops:
            hit = [o for s, r, o in refs if bl.scope is s and bl.ref == r]
            if hit:
                loader.batch_loops.append(seen_by(loader, bl, reached))
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
        else:  # read only by comprehensions: what they do with the batches says which
            drawn = [trains for s, r, trains in comp_refs if (s, r) in loader.refs]
            loader.role = ("train" if any(drawn) else "eval") if drawn else loader.role

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
            if bl.via == "pass" and (not outer or endless_loop(outer[-1], q)):
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
                # the call handing this loader in, one that trains first (run_epoch(train_loader,
                # model, SimpleLossCompute(criterion, opt)) before run_epoch(val_loader, ...))
                passing = handing(fn, ref_here, reached_by[loader], loader) if ref_here else []
                trained = [c for c in passing if trains_at(facts, bl.loop.body, bl.scope, c) is not False] if fn is bl.scope else []
                site = (trained or passing or sites)[0]
                # translate the reference into the caller's terms
                params = params_of(fn)
                if ref_here in params:
                    v = bind_param(site, fn, ref_here)
                    ref_here = dotted(v) if v is not None else None
                elif ref_here is not None:  # the instance's attribute, as the caller spells it
                    ref_here = facts.respell(ref_here, fn, site.scope)
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
        if isinstance(c.scope, cst.FunctionDef) and facts.never_runs(c.scope):
            continue  # built in a function nothing in the script calls (a model's unused configure_optimizers)
        target = assigned_name(c.stmt, c.call)
        p = arg(c.call, 0, "params")
        roots: List[str] = []
        if p is not None:
            roots = optimizer_parameter_roots(facts, c.scope, c.stmt, p.value)
        optimizers.append(Optimizer(call=c, target=target, models=roots))
    for opt in optimizers:
        opt.obtained = obtained(facts, col.qualname, col.classes, optimizers, opt)

    models: List[Model] = []
    seen_models: Set[Tuple[int, str]] = set()
    for opt in optimizers:
        site = opt.site  # the model a builder's optimizer steps is found where the script obtains it
        for root in site.models:
            inst = facts.instance(site.call.scope) if facts.instance_attr(site.call.scope, root) is not None else None
            key = (id(inst[1]), facts.canonical(site.call.scope, root)) if inst is not None else (id(site.call.scope), root)
            if key in seen_models:
                continue
            m = _find_model(col, site, root)
            compiled = _compiled_alias(col, site, m) if m is not None else None
            if compiled is not None:
                m = compiled
            if m is not None:
                m.optimizer = opt
            if m is not None:
                seen_models.add(key)
                models.append(m)

    # entry point ----------------------------------------------------------------------------
    constructions = [l.call for l in loaders if l.role == "train"] + [o.call for o in optimizers]
    entry_owner, entry_body = entry_point(col, module, constructions)

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
        text=text,
    )

