"""The plan of one migration: what the engine knows about the run, and what a rule has decided to do
to the tree that a later rule must know.

Rules record edits against the *input* tree, and the anatomy only describes that input: once DST101
has decided to wrap a model, the tree does not say so until the edits are applied. A later rule that
must follow the wrapped model (DST102 reaches ``.module`` through it, DST402 puts ``no_sync()`` on
it) reads the decision here. Every field is declared, with the rule that writes it and the rules
that read it, so the flow between rules is visible and checked by name; a rule never reads another
rule's private state. One ``Plan`` per ``Context`` (``ctx.plan``); the engine fills the first
group before any rule runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

from distify.values import Record

if TYPE_CHECKING:  # pragma: no cover
    import libcst as cst

    from distify.findings import Finding
    from distify.records import CallSite, Loader, Model, Optimizer


class Plan(Record):
    """The run and the rules' decisions that later rules read (see the module docstring)."""

    # -- the engine, before any rule runs ------------------------------------------------------
    # the file being migrated (DST201 looks for a sibling module's loader builder, DST960 names it)
    script_path: Optional[str]
    # distify's own output, completed with what is missing (DST001 leaves its setup alone)
    incremental: bool
    # the audit of a migration's output (DST951 holds it to what distify writes) ...
    distify_output: bool
    # ... and the warnings the rules gave (DST950 speaks only when nothing else explains)
    prior_warnings: Sequence["Finding"]
    # the name of the inline runtime class with --standalone (the engine, then Context.runtime)
    standalone_runtime: Optional[str]

    # -- DST001: the statement the setup is inserted before (DST002 puts `device = ...` there;
    # Context.before_setup asks whether a statement may run before it)
    setup_anchor: Optional["cst.CSTNode"]

    # -- DST101 (DDP) and DST121 (FSDP): each model that is or will be wrapped or sharded, with the
    # statement after which it is (DST102, DST103, DST402, DST902, DST907, DST925, Context.forward_in)
    wrapped: List[Tuple["Model", "cst.CSTNode"]]
    # -- DST121 only: whether it ran (``--select DST3`` shards nothing: then no model is sharded)
    sharding: bool
    # torch.compile assignments DST121 moved or found after the shard (DST907 leaves them alone)
    sharded_compiles: Set["cst.CSTNode"]
    # optimizers built before the shard that DST121 could not move: (call, why) for DST912
    optimizer_before_shard: List[Tuple["cst.CSTNode", str]]
    # methods registered with register_fsdp_forward_method, by model name (Context.forward_in)
    forward_methods: Dict[str, Set[str]]

    # -- DST111 (Horovod): optimizers wrapped in DistributedOptimizer, optimizers whose gradients
    # are averaged otherwise, and the statement each one's broadcast follows (DST112, DST113)
    hvd_optimizers: List["Optimizer"]
    hvd_averaged: List["Optimizer"]
    hvd_anchor: Dict["Optimizer", "cst.CSTNode"]

    # -- DST201: the sampler name given to each training loader (None: reached through
    # `<loader>.sampler`) (DST202, DST903), and the epoch loops of loaders another module builds
    samplers: Dict[Any, Optional[str]]
    foreign_epoch_loops: Dict[Any, list]

    # -- DST901, DST910: training loaders whose own sampler or stream is shared out
    # (runtime.ShareSampler, runtime.ShareStream): their sums are this rank's share too (DST206)
    shared: List[Any]
    # -- DST201 -> DST901: training loaders of a factory with its own distributed switch, which
    # every call of the factory now sets (distify.loader_switch): DST901 leaves their sampler be
    switched: List[Any]

    # -- DST206 -> DST207: the sums DST206 reduces right after a batch loop, as (scope, name, loop):
    # what the script computes from them after that loop is alike on every rank
    reduced: List[Tuple[Any, str, "cst.CSTNode"]]

    # -- the evaluation plans (rules.eval_plan), computed once for DST201 and DST203
    eval_plans: Optional[Dict["Loader", Any]]

    # -- DST307: torch.load calls whose full state set_*_state_dict shards (DST306 maps them to cpu)
    cpu_loads: List["CallSite"]

    # -- functions a rule puts a collective into (DST203's metric sums): a statement calling one is
    # a collective for every later rule (Context.gains_collective / forward_in)
    gains_collective: Set["cst.FunctionDef"]

    def __init__(self) -> None:
        self.script_path = None
        self.incremental = False
        self.distify_output = False
        self.prior_warnings = ()
        self.standalone_runtime = None
        self.setup_anchor = None
        self.wrapped = []
        self.sharding = False
        self.sharded_compiles = set()
        self.optimizer_before_shard = []
        self.forward_methods = {}
        self.hvd_optimizers = []
        self.hvd_averaged = []
        self.hvd_anchor = {}
        self.samplers = {}
        self.foreign_epoch_loops = {}
        self.shared = []
        self.switched = []
        self.reduced = []
        self.eval_plans = None
        self.cpu_loads = []
        self.gains_collective = set()

    def sharded(self) -> List[Tuple["Model", "cst.CSTNode"]]:
        """(model, anchor) for every model ``fully_shard`` shards: DST121's decision (none when
        DST121 did not run)."""
        return self.wrapped if self.sharding else []
