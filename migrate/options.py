"""Options shared by the CLI and the rules; import-light (no libcst), so `--help` stays fast."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

DDP_BACKEND = "ddp"
HOROVOD_BACKEND = "horovod"
BACKENDS = (DDP_BACKEND, HOROVOD_BACKEND)


@dataclass(frozen=True)
class Options:
    backend: str = DDP_BACKEND
    select: Sequence[str] = ()
    ignore: Sequence[str] = ()
    scale_lr: bool = False
    fp16_allreduce: bool = False
    adasum: bool = False
    seed_per_rank: bool = False  # re-seed each rank once the models are built (DST403)
    standalone: bool = False  # inline the runtime helpers: the script does not import distify
    positions: bool = True  # report line:col (the CLI turns it off with --quiet)
    max_bytes: int = 2 * 1024 * 1024  # libcst needs ~30 s per MB: refuse what is no training script
