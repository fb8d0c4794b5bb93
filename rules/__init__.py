"""The rule registry.

One module per rule (``dstNNN_<name>.py``) exporting ``RULE``, listed here with its code and
backends, in the order the engine applies them: setup first, then model and optimizer,
data, rank-0 side effects, advisories. The order matters only where a rule reads what an earlier one
decided, in the run's plan (``ctx.plan``, ``distify.plan``: the sampler names DST202 uses, the
wrapped models DST102 follows). No rule module imports another rule module or this registry.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Optional, Sequence, Tuple

from distify.options import code_selected

if TYPE_CHECKING:
    from distify.rules.base import Rule

# The registry as data: code, module and backends of each rule, in the order the engine applies them.
# A run imports only the modules of the rules it applies (a ddp run never loads the FSDP and Horovod
# rules; a file left unchanged loads the one rule that says why); tests/test_registry.py holds every
# row to its module's RULE.
_EVERY = ("ddp", "fsdp", "horovod")
_TABLE: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("DST001", "dst001_process_group", _EVERY),
    ("DST005", "dst005_local_rank_argument", _EVERY),
    ("DST002", "dst002_device", _EVERY),
    ("DST101", "dst101_ddp_wrap", ('ddp',)),
    ("DST102", "dst102_unwrap_module", ('ddp',)),
    ("DST103", "dst103_fp16_comm_hook", ('ddp',)),
    ("DST104", "dst104_model_contract", _EVERY),
    ("DST121", "dst121_fully_shard", ('fsdp',)),
    ("DST111", "dst111_distributed_optimizer", ('horovod',)),
    ("DST112", "dst112_broadcast_state", ('horovod',)),
    ("DST113", "dst113_horovod_amp", ('horovod',)),
    ("DST201", "dst201_distributed_sampler", _EVERY),
    ("DST202", "dst202_set_epoch", _EVERY),
    ("DST203", "dst203_shard_eval", _EVERY),
    ("DST204", "dst204_data_rng", _EVERY),
    ("DST205", "dst205_shard_input_nodes", _EVERY),
    ("DST901", "dst901_custom_sampler", _EVERY),  # before DST206, which reduces the sums of what they share out
    ("DST910", "dst910_iterable_dataset", _EVERY),
    ("DST208", "dst208_shared_split_seed", _EVERY),  # after DST201 and DST901, whose shards it makes alike
    ("DST206", "dst206_reduce_train_sums", _EVERY),
    ("DST131", "dst131_scale_sum_loss", _EVERY),  # after DST201, DST901, DST910: reads the plan's shards
    ("DST207", "dst207_agree_early_stop", _EVERY),
    ("DST307", "dst307_full_state_dict", ('fsdp',)),
    ("DST301", "dst301_rank0_save", _EVERY),
    ("DST302", "dst302_rank0_print", _EVERY),
    ("DST303", "dst303_tqdm", _EVERY),
    ("DST304", "dst304_rank0_filesystem", _EVERY),
    ("DST305", "dst305_logging", _EVERY),
    ("DST306", "dst306_load_map_location", _EVERY),
    ("DST308", "dst308_resume_broadcast", ('ddp', 'fsdp')),
    ("DST401", "dst401_scale_lr", _EVERY),
    ("DST402", "dst402_accumulation_no_sync", ('ddp', 'fsdp')),
    ("DST403", "dst403_seed_per_rank", _EVERY),
    ("DST902", "dst902_data_parallel", _EVERY),
    ("DST903", "dst903_no_epoch_loop", _EVERY),
    ("DST904", "dst904_fixed_device", _EVERY),
    ("DST905", "dst905_unwrapped_model", ('ddp', 'fsdp')),
    ("DST906", "dst906_loader_arguments", _EVERY),
    ("DST907", "dst907_compile_order", _EVERY),
    ("DST908", "dst908_device_after_optimizer", _EVERY),
    ("DST909", "dst909_manual_allreduce", _EVERY),
    ("DST911", "dst911_collective_in_rank_branch", _EVERY),
    ("DST912", "dst912_optimizer_before_shard", ('fsdp',)),
    ("DST921", "dst921_tied_across_blocks", ('fsdp',)),
    ("DST922", "dst922_parameter_outside_forward", ('fsdp',)),
    ("DST923", "dst923_module_attribute", ('fsdp',)),
    ("DST924", "dst924_custom_state_code", ('fsdp',)),
    ("DST925", "dst925_copy_of_sharded_model", ('fsdp',)),
    # the output audit (distify.audit): run on the rewritten module and by `distify lint`
    ("DST950", "dst950_not_distributed", _EVERY),
    ("DST951", "dst951_unsharded_loader", _EVERY),
    ("DST952", "dst952_no_set_epoch", _EVERY),
    ("DST953", "dst953_padded_eval", _EVERY),
    ("DST954", "dst954_unaveraged_optimizer", _EVERY),
    ("DST955", "dst955_write_every_rank", _EVERY),
    ("DST956", "dst956_log_every_rank", _EVERY),
    ("DST957", "dst957_wrapper_prefix", _EVERY),
    ("DST958", "dst958_call_before_init", _EVERY),
    ("DST959", "dst959_same_random_batches", _EVERY),
    ("DST963", "dst963_same_input_every_rank", _EVERY),
    ("DST964", "dst964_schedule_length", _EVERY),
    ("DST965", "dst965_unseeded_split", _EVERY),
    ("DST966", "dst966_training_on_some_ranks", _EVERY),
    # what a file left unchanged says about why
    ("DST960", "dst960_framework_distributes", _EVERY),
    ("DST961", "dst961_training_elsewhere", _EVERY),
    # checked by the engine on the rewritten module against the input
    ("DST962", "dst962_unbound_name", _EVERY),
)

# the engine's stages that keep a code of their own (findings, --select/--ignore, --explain) but are
# no rules: the backend conversion (DST003), run before the rules on a script of another backend
_STAGES: Tuple[Tuple[str, str], ...] = (("DST003", "distify.convert"),)


def _load(module: str) -> "Rule":
    return import_module(f"{__name__}.{module}").RULE


def selected(backend: str, select: Sequence[str] = (), ignore: Sequence[str] = (),
             codes: Optional[Sequence[str]] = None) -> Tuple["Rule", ...]:
    """Rules for a backend, filtered by code prefixes (``--select DST2``, ``--ignore DST30``) and,
    when given, to `codes`, in the engine's order; only their modules are imported."""
    return tuple(_load(m) for code, m, backends in _TABLE
                 if backend in backends and (codes is None or code in codes) and code_selected(code, select, ignore))


def by_code(code: str) -> Optional[object]:
    """The rule or stage with this code (its module alone imported), or None."""
    for c, m, _ in _TABLE:
        if c == code:
            return _load(m)
    for c, m in _STAGES:
        if c == code:
            return import_module(m).STAGE
    return None


def __getattr__(name: str):
    """``ALL_RULES`` (every rule, in order), ``STAGES`` and ``BY_CODE`` (every code: the rules and
    the stages, for --explain, --list-rules and the fixtures' folders) import every module: built
    on first use, never by a migration run."""
    if name in globals():
        return globals()[name]
    if name == "ALL_RULES":
        value: object = tuple(_load(m) for _, m, _ in _TABLE)
    elif name == "STAGES":
        value = tuple(import_module(m).STAGE for _, m in _STAGES)
    elif name == "BY_CODE":
        value = {r.code: r for r in (*__getattr__("ALL_RULES"), *__getattr__("STAGES"))}
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
