"""Launch commands for a migrated script: torchrun, horovodrun, SLURM ``srun``, Kubeflow PyTorchJob.

Pure functions from a :class:`LaunchPlan` (script, backend, processes per node, hosts, port) to
command lines and manifest text; stdlib only (no libcst, no torch), so ``distify --launch`` is fast
and every line can be unit-tested.

What each launcher gives the script, and why the commands look the way they do:

* ``torchrun`` exports ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``. One
  machine: ``--standalone`` (a private rendezvous on a free port). Several: the same command on every
  host, a c10d rendezvous on the first host. No ``--node-rank``: the c10d rendezvous numbers the
  nodes itself (torch ignores the flag there, with a warning).
* ``horovodrun`` exports ``HOROVOD_RANK``/``HOROVOD_SIZE``/... . A DDP script reads them through
  ``distify.runtime``, which cannot know rank 0's host when the ranks span several hosts: the DDP
  line therefore sets ``MASTER_ADDR``/``MASTER_PORT``, which horovodrun forwards to every rank.
* ``srun``: ``distify.runtime`` reads ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS``,
  ``SLURM_LOCALID``, takes the first host of the step's node list as ``MASTER_ADDR`` and derives a
  per-job port from ``SLURM_JOB_ID`` unless ``MASTER_PORT`` is set. GPUs are requested per node (not
  per task) because the runtime picks ``cuda:<local rank>`` among the GPUs a task sees. A Horovod
  script under ``srun`` needs Horovod built with MPI (``hvd.init()`` then reads the PMI rank).
* Kubeflow PyTorchJob (training operator, ``kubeflow.org/v1``): every pod gets ``MASTER_ADDR``,
  ``MASTER_PORT``, ``WORLD_SIZE`` = pods x ``nprocPerNode`` and ``RANK`` = the pod's index, plus
  ``PET_NODE_RANK``. One process per pod: ``python train.py`` reads those directly. Several per pod:
  the pod must run ``torchrun`` so that each process gets its own rank.

``hvd.init()`` reads neither torchrun's nor the training operator's variables (each process would
train alone in a world of one), so a Horovod script gets no torchrun or PyTorchJob lines. An FSDP
script is launched exactly like a DDP one (the same process group, the same environment).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from distify.options import BACKENDS, HOROVOD_BACKEND, TORCH_BACKENDS

DEFAULT_PORT = 29500  # torch.distributed's and distify.runtime's default rendezvous port

__all__ = [
    "DEFAULT_PORT",
    "LaunchError",
    "LaunchPlan",
    "Section",
    "detect_gpus",
    "horovodrun_command",
    "kubeflow_manifest",
    "parse_nodes",
    "render",
    "run_hint",
    "sections",
    "srun_command",
    "torchrun_commands",
]


class LaunchError(ValueError):
    """A launch option that cannot describe a job (bad host list, port or process count)."""


@dataclass(frozen=True)
class LaunchPlan:
    """Where and how to start ``script``.

    ``nodes`` empty (or one host) means one machine. ``port`` None means each launcher's own default:
    a free port for ``torchrun --standalone``, :data:`DEFAULT_PORT` for a multi-node rendezvous, a
    per-job port derived from ``SLURM_JOB_ID`` under ``srun``.
    """

    script: str
    backend: str = "ddp"
    nproc: int = 1
    nodes: Tuple[str, ...] = ()
    port: Optional[int] = None
    script_args: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise LaunchError(f"unknown backend {self.backend!r}: choose {', '.join(BACKENDS)}")
        if not isinstance(self.nproc, int) or isinstance(self.nproc, bool) or self.nproc < 1:
            raise LaunchError(f"--nproc must be a positive integer, not {self.nproc!r}")
        if self.port is not None and (
            not isinstance(self.port, int) or isinstance(self.port, bool) or not 1 <= self.port <= 65535
        ):
            raise LaunchError(f"--port must be a port number (1-65535), not {self.port!r}")
        parse_nodes(list(self.nodes))  # validates

    @property
    def multi_node(self) -> bool:
        return len(self.nodes) > 1

    @property
    def total(self) -> int:
        return max(1, len(self.nodes)) * self.nproc

    @property
    def rendezvous_port(self) -> int:
        return self.port if self.port is not None else DEFAULT_PORT

    @property
    def job_name(self) -> str:
        """The script's stem as a Kubernetes name / rendezvous id: ``train.py`` -> ``train``."""
        name = re.sub(r"[^a-z0-9]+", "-", Path(self.script).stem.lower()).strip("-")[:40].strip("-")
        return name or "train"

    def script_argv(self) -> List[str]:
        return [self.script, *self.script_args]


def parse_nodes(values: Sequence[str]) -> Tuple[str, ...]:
    """Host names from ``--nodes`` values (comma-separated, may repeat); order kept, checked."""
    hosts: List[str] = []
    for value in values:
        for host in str(value).split(","):
            host = host.strip()
            if not host:
                continue
            if any(ch.isspace() for ch in host) or ":" in host or "=" in host:
                raise LaunchError(f"--nodes: {host!r} is not a host name")
            if host in hosts:
                raise LaunchError(f"--nodes: {host!r} is listed twice")
            hosts.append(host)
    return tuple(hosts)


def detect_gpus(environ: Optional[Mapping[str, str]] = None, dev: str = "/dev") -> int:
    """GPUs this machine shows, without importing torch: ``CUDA_VISIBLE_DEVICES`` when set, else
    the ``/dev/nvidia<N>`` device files. 0 when none are found."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for item in visible.split(","):
            item = item.strip()
            if not item or item.startswith("-"):  # CUDA stops at the first invalid entry
                break
            count += 1
        return count
    try:
        return sum(1 for name in os.listdir(dev) if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        return 0


# ----------------------------------------------------------------------------- command lines


def _join(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


def _env_prefix(pairs: Sequence[Tuple[str, str]]) -> str:
    return "".join(f"{name}={shlex.quote(value)} " for name, value in pairs)


def torchrun_commands(plan: LaunchPlan) -> List[Tuple[str, str]]:
    """``(host, command)`` pairs, one per node (host ``""`` on a single machine); with several
    nodes every host runs the same command."""
    if not plan.multi_node:
        argv = ["torchrun", "--standalone", "--nproc-per-node", str(plan.nproc), *plan.script_argv()]
        return [(plan.nodes[0] if plan.nodes else "", _join(argv))]
    endpoint = f"{plan.nodes[0]}:{plan.rendezvous_port}"
    argv = [
        "torchrun",
        "--nnodes", str(len(plan.nodes)),
        "--nproc-per-node", str(plan.nproc),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", plan.job_name,
        *plan.script_argv(),
    ]
    return [(host, _join(argv)) for host in plan.nodes]


def horovodrun_command(plan: LaunchPlan) -> str:
    """One ``horovodrun`` for the whole job, started on the first host."""
    hosts = ",".join(f"{h}:{plan.nproc}" for h in plan.nodes) if plan.multi_node else f"localhost:{plan.nproc}"
    env: List[Tuple[str, str]] = []
    if plan.backend in TORCH_BACKENDS:
        if plan.multi_node:
            env = [("MASTER_ADDR", plan.nodes[0]), ("MASTER_PORT", str(plan.rendezvous_port))]
        elif plan.port is not None:
            env = [("MASTER_PORT", str(plan.port))]
    argv = ["horovodrun", "-np", str(plan.total), "-H", hosts, "python", *plan.script_argv()]
    return _env_prefix(env) + _join(argv)


def srun_command(plan: LaunchPlan) -> str:
    """One ``srun`` step for the whole job, run inside an allocation (``salloc``/``sbatch``)."""
    env = [("MASTER_PORT", str(plan.port))] if plan.backend in TORCH_BACKENDS and plan.port is not None else []
    argv = [
        "srun",
        f"--nodes={max(1, len(plan.nodes))}",
        f"--ntasks-per-node={plan.nproc}",
        f"--gpus-per-node={plan.nproc}",
    ]
    if plan.backend == HOROVOD_BACKEND:
        argv.append("--mpi=pmix")
    argv += ["python", *plan.script_argv()]
    return _env_prefix(env) + _join(argv)


def _yaml_list(items: Sequence[str]) -> str:
    # JSON strings are valid YAML flow scalars: every character is quoted and escaped correctly
    return "[" + ", ".join(json.dumps(str(i), ensure_ascii=False) for i in items) + "]"


def kubeflow_manifest(plan: LaunchPlan) -> str:
    """A minimal ``kubeflow.org/v1`` PyTorchJob: one Master pod and ``nodes - 1`` Worker pods."""
    nodes = max(1, len(plan.nodes))
    if plan.nproc == 1:
        command = ["python", *plan.script_argv()]
    else:
        command = [
            "torchrun",
            f"--nnodes={nodes}",
            f"--nproc-per-node={plan.nproc}",
            "--node-rank=$(PET_NODE_RANK)",
            "--master-addr=$(MASTER_ADDR)",
            "--master-port=$(MASTER_PORT)",
            *plan.script_argv(),
        ]

    def replica(kind: str, replicas: int, port: bool) -> List[str]:
        lines = [
            f"    {kind}:",
            f"      replicas: {replicas}",
            "      restartPolicy: OnFailure",
            "      template:",
            "        spec:",
            "          containers:",
            "            - name: pytorch",
            "              image: IMAGE",
            f"              command: {_yaml_list(command)}",
        ]
        if port:
            lines += [
                "              ports:",
                "                - name: pytorchjob-port",
                f"                  containerPort: {plan.rendezvous_port}",
            ]
        lines += [
            "              resources:",
            "                limits:",
            f"                  nvidia.com/gpu: {plan.nproc}",
        ]
        return lines

    lines = [
        "apiVersion: kubeflow.org/v1",
        "kind: PyTorchJob",
        "metadata:",
        f"  name: {plan.job_name}",
        "spec:",
        f'  nprocPerNode: "{plan.nproc}"',
        "  pytorchReplicaSpecs:",
        *replica("Master", 1, plan.port is not None),
    ]
    if nodes > 1:
        lines += replica("Worker", nodes - 1, False)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ output


@dataclass(frozen=True)
class Section:
    """One launcher: comment lines (without ``#``) and the text to run."""

    launcher: str
    comments: Tuple[str, ...]
    body: str


def _where(plan: LaunchPlan) -> str:
    return plan.nodes[0] if plan.nodes else "this machine"


def _torchrun_section(plan: LaunchPlan, recommended: bool) -> Section:
    title = "torchrun" + (f" (recommended for --backend {plan.backend})" if recommended else "")
    commands = torchrun_commands(plan)
    if not plan.multi_node:
        return Section("torchrun", (f"{title}: on {_where(plan)}",), commands[0][1])
    hosts = ", ".join(host for host, _ in commands)
    return Section("torchrun", (f"{title}: the same command on each of {hosts}",), commands[0][1])


def _horovodrun_section(plan: LaunchPlan, recommended: bool) -> Section:
    title = "horovodrun" + (" (recommended for --backend horovod)" if recommended else "")
    if plan.multi_node:
        where = f"once, on {plan.nodes[0]} (horovodrun reaches the other hosts over passwordless ssh)"
    else:
        where = f"on {_where(plan)}"
    return Section("horovodrun", (f"{title}: {where}",), horovodrun_command(plan))


def _srun_section(plan: LaunchPlan) -> Section:
    nodes = max(1, len(plan.nodes))
    alloc = f"inside an allocation of {nodes} node{'s' if nodes != 1 else ''} (salloc, or an sbatch script)"
    if plan.backend == HOROVOD_BACKEND:
        comments = (f"SLURM: {alloc}; needs Horovod built with MPI",)
    else:
        port = "MASTER_PORT as set here" if plan.port is not None else "a port derived from SLURM_JOB_ID"
        comments = (
            f"SLURM: {alloc}.",
            "distify.runtime reads SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, and uses the step's",
            f"first host as MASTER_ADDR with {port}",
        )
    return Section("srun", comments, srun_command(plan))


def _kubeflow_section(plan: LaunchPlan) -> Section:
    return Section(
        "kubeflow",
        ("Kubeflow PyTorchJob: replace IMAGE with an image holding the script, torch and distify",),
        "kubectl apply -f - <<'EOF'\n" + kubeflow_manifest(plan) + "EOF",
    )


def sections(plan: LaunchPlan) -> List[Section]:
    """The launchers that can start ``plan.script``, the recommended one first."""
    if plan.backend == HOROVOD_BACKEND:
        return [
            _horovodrun_section(plan, recommended=True),
            _srun_section(plan),
            Section(
                "note",
                (
                    "torchrun and a Kubeflow PyTorchJob do not start Horovod: hvd.init() would see a world",
                    "of one in every process. On Kubernetes run the horovodrun line from an MPIJob",
                    "(mpi-operator), or migrate with --backend ddp.",
                ),
                "",
            ),
        ]
    return [
        _torchrun_section(plan, recommended=True),
        _horovodrun_section(plan, recommended=False),
        _srun_section(plan),
        _kubeflow_section(plan),
    ]


def render(plan: LaunchPlan) -> str:
    """Everything ``distify --launch`` prints: comment lines start with ``#``, the rest runs as is."""
    blocks = []
    for section in sections(plan):
        lines = [f"# {c}" for c in section.comments]
        if section.body:
            lines.append(section.body)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def run_hint(plan: LaunchPlan) -> str:
    """The one command to suggest right after a rewrite: the recommended single-machine launch."""
    if plan.backend == HOROVOD_BACKEND:
        return horovodrun_command(plan)
    return torchrun_commands(plan)[0][1]
