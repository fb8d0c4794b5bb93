"""Launcher discovery: turn the environment of a process into ``(rank, world_size, ...)``.

Pure functions over a mapping of environment variables; stdlib only (this module does not even
import torch), so it can be tested with plain dicts.

Precedence, highest first (an explicit, user- or launcher-set generic variable always beats a
value inferred from a scheduler):

1. ``RANK`` / ``WORLD_SIZE`` (torchrun, Kubeflow PyTorchJob, hand-set env:// variables);
2. ``HOROVOD_RANK`` / ``HOROVOD_SIZE`` (``horovodrun --gloo``);
3. ``OMPI_COMM_WORLD_RANK`` / ``OMPI_COMM_WORLD_SIZE`` (OpenMPI ``mpirun``, ``horovodrun`` over MPI).
   OpenMPI wins over Slurm because ``mpirun`` inside an allocation starts its daemons with
   ``srun``: the ranks inherit the *daemon's* ``SLURM_PROCID`` (a node index), not their own rank;
4. Slurm ``srun`` steps (``SLURM_PROCID`` / ``SLURM_STEP_NUM_TASKS`` or ``SLURM_NTASKS``) and
   MPICH/Intel MPI (``PMI_RANK`` / ``PMI_SIZE``): when both are present and disagree, PMI wins (hydra
   starts one proxy per node with ``srun``, so the Slurm values describe proxies); when they agree
   (``srun --mpi=pmi2``) the Slurm reading is used because it can name the master host;
5. nothing: rank 0 of a world of 1, source ``"none"``.

``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` likewise beat ``SLURM_LOCALID``, the first host
of the node list and the port derived from the job id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional

__all__ = ["DistifyEnvError", "Environment", "discover", "expand_nodelist", "first_host"]

SOURCES = ("torchrun", "kubeflow", "slurm", "mpi", "horovod", "none")
DEFAULT_MASTER_PORT = 29500
LOOPBACK_ADDR = "127.0.0.1"

# Slurm sets SLURM_STEP_ID (and the older spelling SLURM_STEPID) for every job step. Real steps
# started by ``srun`` get small sequential ids (0, 1, 2, ...); the step that runs an sbatch script,
# the "extern" step, the interactive step of salloc and friends use reserved ids near 2**32:
#   SLURM_INTERACTIVE_STEP 0xfffffffa, SLURM_BATCH_SCRIPT 0xfffffffb (older Slurm: 0xfffffffe),
#   SLURM_EXTERN_CONT 0xfffffffc, SLURM_PENDING_STEP 0xfffffffd,
# and the batch step usually exports no step id at all. A plain ``python train.py`` inside an sbatch
# script still sees SLURM_PROCID=0 and SLURM_NTASKS=4 (the allocation's size), yet it is ONE process:
# treating that as 4 ranks would wait forever for 3 peers. So Slurm variables describe the process
# only when a step id is present, numeric and below the reserved range; otherwise we ignore Slurm.
_SLURM_RESERVED_STEP_IDS_FROM = 0xFFFFFFF0


class DistifyEnvError(RuntimeError):
    """The launcher environment is inconsistent; the message is one sentence naming the variable."""


@dataclass(frozen=True)
class Environment:
    """Where this process sits in the job, as read from the environment.

    ``master_addr`` / ``master_port`` are ``None`` when no rendezvous is needed (source ``"none"``)
    or when they cannot be inferred (e.g. a multi-node MPI launch without ``MASTER_ADDR``).
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: Optional[str]
    master_port: Optional[int]
    source: str

    @property
    def distributed(self) -> bool:
        """True when a launcher started this process (even a world of one)."""
        return self.source != "none"


# --------------------------------------------------------------------------------------- parsing


def _get(env: Mapping[str, str], name: str) -> Optional[str]:
    """The stripped value of ``name``; empty strings count as unset (Kubernetes loves those)."""
    value = env.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _int(env: Mapping[str, str], name: str, *, minimum: int = 0) -> Optional[int]:
    raw = _get(env, name)
    if raw is None:
        return None
    try:
        value = int(raw, 10)
    except ValueError:
        raise DistifyEnvError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        what = "a positive integer" if minimum == 1 else "a non-negative integer"
        raise DistifyEnvError(f"{name}={value} is not {what}")
    return value


def _pair(env: Mapping[str, str], rank_var: str, size_var: str) -> Optional[tuple[int, int]]:
    """Read a (rank, size) pair that must be set together; None when neither is set."""
    has_rank = _get(env, rank_var) is not None
    has_size = _get(env, size_var) is not None
    if not has_rank and not has_size:
        return None
    if not has_rank:
        raise DistifyEnvError(f"{size_var} is set but {rank_var} is missing")
    if not has_size:
        raise DistifyEnvError(f"{rank_var} is set but {size_var} is missing")
    rank = _int(env, rank_var)
    size = _int(env, size_var, minimum=1)
    assert rank is not None and size is not None
    if rank >= size:
        raise DistifyEnvError(f"{rank_var}={rank} is not below {size_var}={size}")
    return rank, size


def _local(env: Mapping[str, str], inferred_var: Optional[str], size_var: Optional[str]) -> int:
    """Local rank: explicit LOCAL_RANK, else the launcher's own variable, else 0."""
    for var in ("LOCAL_RANK", inferred_var):
        if var is None:
            continue
        value = _int(env, var)
        if value is not None:
            if var == "LOCAL_RANK":
                size = _int(env, "LOCAL_WORLD_SIZE", minimum=1)
                if size is not None and value >= size:
                    raise DistifyEnvError(f"LOCAL_RANK={value} is not below LOCAL_WORLD_SIZE={size}")
            elif size_var is not None:
                size = _int(env, size_var, minimum=1)
                if size is not None and value >= size:
                    raise DistifyEnvError(f"{var}={value} is not below {size_var}={size}")
            return value
    return 0


def _port(env: Mapping[str, str], default: int) -> int:
    raw = _get(env, "MASTER_PORT")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise DistifyEnvError(f"MASTER_PORT={raw!r} is not a port number")
    return int(raw)


# ------------------------------------------------------------------------- Slurm host lists


def _expand_item(item: str, whole: str, var: str) -> Iterator[str]:
    """Expand one comma-free-at-top-level item such as ``rack[1-2]-n[01-03]`` (cartesian)."""
    bad = DistifyEnvError(f"{var}={whole!r} is not a valid Slurm node list")
    open_at = item.find("[")
    if open_at < 0:
        if "]" in item or not item:
            raise bad
        yield item
        return
    close_at = item.find("]", open_at)
    if close_at < 0:
        raise bad
    prefix, body, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    if "]" in prefix or not body:
        raise bad
    suffixes = list(_expand_item(rest, whole, var)) if rest else [""]
    for part in body.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise bad
        start, stop = int(lo), int(hi) if dash else int(lo)
        if stop < start:
            raise bad
        width = len(lo)  # "01-04" keeps its zero padding; "1-4" has none
        for number in range(start, stop + 1):
            for suffix in suffixes:
                yield f"{prefix}{number:0{width}d}{suffix}"


def _split_top_level(text: str, whole: str, var: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise DistifyEnvError(f"{var}={whole!r} is not a valid Slurm node list")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise DistifyEnvError(f"{var}={whole!r} is not a valid Slurm node list")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise DistifyEnvError(f"{var}={whole!r} is not a valid Slurm node list")
    items.append(text[start:])
    return items


def expand_nodelist(nodelist: str, var: str = "SLURM_JOB_NODELIST") -> Iterator[str]:
    """Yield the host names of a compressed Slurm node list, lazily, in order.

    ``"gpu[01-04,07],cpu5"`` -> gpu01 gpu02 gpu03 gpu04 gpu07 cpu5. The whole string is validated
    before the first name is produced. Raises :class:`DistifyEnvError` naming ``var`` if malformed.
    """
    text = nodelist.strip()
    if not text or any(ch.isspace() for ch in text):
        raise DistifyEnvError(f"{var}={nodelist!r} is not a valid Slurm node list")
    items = _split_top_level(text, nodelist, var)
    for item in items:  # validate everything first (cheap: no expansion)
        if not item:
            raise DistifyEnvError(f"{var}={nodelist!r} is not a valid Slurm node list")
        next(iter(_expand_item(item, nodelist, var)))
        for group in item.split("[")[1:]:
            for part in group.split("]")[0].split(","):
                lo, dash, hi = part.partition("-")
                if not lo.isdigit() or (dash and (not hi.isdigit() or int(hi) < int(lo))):
                    raise DistifyEnvError(f"{var}={nodelist!r} is not a valid Slurm node list")

    def generate() -> Iterator[str]:
        for item in items:
            yield from _expand_item(item, nodelist, var)

    return generate()


def first_host(nodelist: str, var: str = "SLURM_JOB_NODELIST") -> str:
    """First host of a compressed Slurm node list (the conventional rendezvous host)."""
    return next(expand_nodelist(nodelist, var))


# -------------------------------------------------------------------------------- discovery


def _slurm_step(env: Mapping[str, str]) -> bool:
    """True when this process is a task of an ``srun`` step (see the comment at the top)."""
    step = _get(env, "SLURM_STEP_ID") or _get(env, "SLURM_STEPID")
    return step is not None and step.isdigit() and int(step) < _SLURM_RESERVED_STEP_IDS_FROM


def _slurm(env: Mapping[str, str]) -> Optional[Environment]:
    if _get(env, "SLURM_PROCID") is None or not _slurm_step(env):
        return None
    size_var = "SLURM_STEP_NUM_TASKS" if _get(env, "SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
    if _get(env, size_var) is None and _get(env, "SLURM_NPROCS") is not None:
        size_var = "SLURM_NPROCS"
    if _get(env, size_var) is None:  # srun always sets one of them; be lenient: one task
        rank, world = _int(env, "SLURM_PROCID") or 0, 1
        if rank:
            raise DistifyEnvError(f"SLURM_PROCID={rank} is set but SLURM_NTASKS is missing")
    else:
        pair = _pair(env, "SLURM_PROCID", size_var)
        assert pair is not None
        rank, world = pair
    local_rank = _local(env, "SLURM_LOCALID", None)
    master = _get(env, "MASTER_ADDR")
    if master is None:
        if world == 1:
            master = LOOPBACK_ADDR
        else:
            for var in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
                nodelist = _get(env, var)
                if nodelist is not None:
                    master = first_host(nodelist, var)
                    break
    job_id = _get(env, "SLURM_JOB_ID") or _get(env, "SLURM_JOBID")
    # Deterministic per job so that every task agrees without talking, and in 10000-29999:
    # unprivileged and below Linux's ephemeral range (32768+), so it rarely hits a client socket.
    default_port = 10000 + int(job_id) % 20000 if job_id and job_id.isdigit() else DEFAULT_MASTER_PORT
    return Environment(rank, world, local_rank, master, _port(env, default_port), "slurm")


def _mpi_like(
    env: Mapping[str, str],
    rank_var: str,
    size_var: str,
    local_var: str,
    local_size_var: str,
    source: str,
) -> Optional[Environment]:
    pair = _pair(env, rank_var, size_var)
    if pair is None:
        return None
    rank, world = pair
    local_rank = _local(env, local_var, local_size_var)
    master = _get(env, "MASTER_ADDR")
    if master is None:
        local_size = _int(env, local_size_var, minimum=1)
        # Everyone on one host: loopback is right. Several hosts: rank 0's host is unknowable
        # without communicating, so leave it to MASTER_ADDR (init_kwargs reports it).
        if world == 1 or local_size == world:
            master = LOOPBACK_ADDR
    return Environment(rank, world, local_rank, master, _port(env, DEFAULT_MASTER_PORT), source)


def _env_style(env: Mapping[str, str]) -> Optional[Environment]:
    pair = _pair(env, "RANK", "WORLD_SIZE")
    if pair is None:
        return None
    rank, world = pair
    # torchrun (torch.distributed.run) always exports LOCAL_WORLD_SIZE and TORCHELASTIC_RUN_ID; the
    # Kubeflow training operator injects only RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (one process
    # per pod, hence local rank 0). A hand-set LOCAL_RANK without the torchrun markers is the old
    # torch.distributed.launch --use-env style: label it torchrun too.
    torchrun = any(
        _get(env, v) is not None for v in ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE", "LOCAL_RANK")
    )
    local_rank = _local(env, None, None)
    master = _get(env, "MASTER_ADDR")
    if master is None and world == 1:
        master = LOOPBACK_ADDR
    return Environment(
        rank, world, local_rank, master, _port(env, DEFAULT_MASTER_PORT),
        "torchrun" if torchrun else "kubeflow",
    )


def discover(environ: Optional[Mapping[str, str]] = None) -> Environment:
    """Read rank, world size, local rank and rendezvous address from the environment.

    Pure: reads ``environ`` (default ``os.environ``) and changes nothing. Raises
    :class:`DistifyEnvError` when the variables contradict each other.
    """
    env = os.environ if environ is None else environ

    found = _env_style(env)
    if found is not None:
        return found
    found = _mpi_like(
        env, "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "horovod"
    )
    if found is not None:
        return found
    found = _mpi_like(
        env,
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "mpi",
    )
    if found is not None:
        return found
    slurm = _slurm(env)
    pmi = _mpi_like(env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "mpi")
    if pmi is not None and (
        slurm is None or (slurm.rank, slurm.world_size) != (pmi.rank, pmi.world_size)
    ):
        return pmi
    if slurm is not None:
        return slurm
    return Environment(0, 1, _local(env, None, None), None, None, "none")
