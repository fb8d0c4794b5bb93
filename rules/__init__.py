"""The rule registry.

One module per rule (``dstNNN_<name>.py``) exporting ``RULE``. ``ALL_RULES`` is built from the
modules listed here, in the order the engine applies them: setup first, then model and optimizer,
data, rank-0 side effects, advisories. The order matters only where a rule reads what an earlier one
decided, in the run's plan (``ctx.plan``, ``distify.plan``: the sampler names DST202 uses, the
wrapped models DST102 follows). No rule module imports another rule module or this registry.
"""

from __future__ import annotations

from importlib import import_module
from typing import Dict, Sequence, Tuple

from distify.options import code_selected
from distify.rules.base import Rule

_MODULES = (
    "dst001_process_group",
    "dst005_local_rank_argument",
    "dst002_device",
    "dst101_ddp_wrap",
    "dst102_unwrap_module",
    "dst103_fp16_comm_hook",
    "dst104_model_contract",
    "dst121_fully_shard",
    "dst111_distributed_optimizer",
    "dst112_broadcast_state",
    "dst113_horovod_amp",
    "dst201_distributed_sampler",
    "dst202_set_epoch",
    "dst203_shard_eval",
    "dst204_data_rng",
    "dst205_shard_input_nodes",
    "dst901_custom_sampler",  # before DST206, which reduces the sums of what they share out
    "dst910_iterable_dataset",
    "dst206_reduce_train_sums",
    "dst307_full_state_dict",
    "dst301_rank0_save",
    "dst302_rank0_print",
    "dst303_tqdm",
    "dst304_rank0_filesystem",
    "dst305_logging",
    "dst306_load_map_location",
    "dst308_resume_broadcast",
    "dst401_scale_lr",
    "dst402_accumulation_no_sync",
    "dst403_seed_per_rank",
    "dst902_data_parallel",
    "dst903_no_epoch_loop",
    "dst904_fixed_device",
    "dst905_unwrapped_model",
    "dst906_loader_arguments",
    "dst907_compile_order",
    "dst908_device_after_optimizer",
    "dst909_manual_allreduce",
    "dst911_collective_in_rank_branch",
    "dst912_optimizer_before_shard",
    "dst921_tied_across_blocks",
    "dst922_parameter_outside_forward",
    "dst923_module_attribute",
    "dst924_custom_state_code",
    "dst925_copy_of_sharded_model",
    # the output audit (distify.audit): run on the rewritten module and by `distify lint`
    "dst950_not_distributed",
    "dst951_unsharded_loader",
    "dst952_no_set_epoch",
    "dst953_padded_eval",
    "dst954_unaveraged_optimizer",
    "dst955_write_every_rank",
    "dst956_log_every_rank",
    "dst957_wrapper_prefix",
    "dst958_call_before_init",
    "dst959_same_random_batches",
    "dst963_same_input_every_rank",
    "dst964_schedule_length",
    # what a file left unchanged says about why
    "dst960_framework_distributes",
    "dst961_training_elsewhere",
    # checked by the engine on the rewritten module against the input
    "dst962_unbound_name",
)

ALL_RULES: Tuple[Rule, ...] = tuple(import_module(f"{__name__}.{m}").RULE for m in _MODULES)
# the engine's stages that keep a code of their own (findings, --select/--ignore, --explain) but are
# no rules: the backend conversion (DST003), run before the rules on a script of another backend
STAGES: Tuple = (import_module("distify.convert").STAGE,)
# every code: the rules and the stages (--explain, --list-rules, the fixtures' folders)
BY_CODE: Dict[str, object] = {r.code: r for r in (*ALL_RULES, *STAGES)}


def selected(backend: str, select: Sequence[str] = (), ignore: Sequence[str] = ()) -> Tuple[Rule, ...]:
    """Rules for a backend, filtered by code prefixes (``--select DST2``, ``--ignore DST30``)."""

    return tuple(r for r in ALL_RULES if backend in r.backends and code_selected(r.code, select, ignore))
