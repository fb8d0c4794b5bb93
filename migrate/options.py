"""Options shared by the CLI and the rules; import-light (no libcst), so `--help` stays fast."""

from __future__ import annotations

from typing import Optional, Sequence

from distify.values import Value

DDP_BACKEND = "ddp"
HOROVOD_BACKEND = "horovod"
FSDP_BACKEND = "fsdp"  # FSDP2: torch.distributed.fsdp.fully_shard
BACKENDS = (DDP_BACKEND, HOROVOD_BACKEND, FSDP_BACKEND)
# the backends built on torch.distributed process groups (init_process_group, DistributedSampler, torchrun)
TORCH_BACKENDS = (DDP_BACKEND, FSDP_BACKEND)


class Options(Value):
    """What a migration is asked for: backend, rule selection, flags, limits (``distify.runner.migration_options``)."""

    __slots__ = ("backend", "select", "ignore", "scale_lr", "fp16_allreduce", "adasum", "seed_per_rank", "bf16",
                 "standalone", "positions", "max_bytes", "project_root", "exclude")
    backend: str
    select: Sequence[str]
    ignore: Sequence[str]
    scale_lr: bool
    fp16_allreduce: bool
    adasum: bool
    seed_per_rank: bool  # re-seed each rank once the models are built (DST403)
    bf16: bool  # FSDP: a bfloat16 MixedPrecisionPolicy (parameters in bf16, gradients reduced in fp32)
    standalone: bool  # inline the runtime helpers: the script does not import distify
    positions: bool  # report line:col (the CLI turns it off with --quiet)
    max_bytes: int  # libcst needs ~30 s per MB: refuse what is no training script
    # the user's project (distify.project): `[tool.distify] project-root` (absolute), else found
    # from each script; `exclude` names files never read as part of it nor written
    project_root: Optional[str]
    exclude: Sequence[str]

    def __init__(self, backend: str = DDP_BACKEND, select: Sequence[str] = (), ignore: Sequence[str] = (),
                 scale_lr: bool = False, fp16_allreduce: bool = False, adasum: bool = False, seed_per_rank: bool = False,
                 bf16: bool = False, standalone: bool = False, positions: bool = True, max_bytes: int = 2 * 1024 * 1024,
                 project_root: Optional[str] = None, exclude: Sequence[str] = ()) -> None:
        self._set(backend, select, ignore, scale_lr, fp16_allreduce, adasum, seed_per_rank, bf16, standalone, positions,
                  max_bytes, project_root, exclude)

    def selects(self, code: str) -> bool:
        """`--select` / `--ignore` (code prefixes, any case) let the rule `code` run; whether it runs
        with the backend is the rule's own `backends`."""
        return code_selected(code, self.select, self.ignore)


def code_selected(code: str, select: Sequence[str] = (), ignore: Sequence[str] = ()) -> bool:
    """The one reading of `--select DST2` / `--ignore DST30`: prefixes of codes, any case."""

    def matches(prefixes: Sequence[str]) -> bool:
        return any(code.startswith(p.upper()) for p in prefixes)

    return (not select or matches(select)) and not (ignore and matches(ignore))
