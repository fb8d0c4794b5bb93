"""distify.runtime: the small shim that migrated training scripts import.

It hides environment plumbing only; the distributed calls stay visible in the user's script::

    dist.init_process_group(**runtime.init_kwargs())
    device = runtime.device()
    model = runtime.DDP(Net().to(device), device_ids=runtime.device_ids())
    if runtime.is_main_process():
        torch.save(runtime.unwrap(model).state_dict(), "model.pt")

Imports torch and the standard library only (never libcst, typer or rich). ``import torch``
already loads ``torch.distributed``, so nothing here adds a heavy import.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import itertools
import os
import random
import sys
import threading
from typing import Any, Iterator, List, Mapping, Optional, Union

import torch

from ._env import DistifyEnvError, Environment, discover, expand_nodelist, first_host

__all__ = [
    "DDP",
    "DistifyEnvError",
    "Environment",
    "ShardSampler",
    "ShareSampler",
    "ShareStream",
    "agree",
    "agree_all",
    "all_reduce",
    "all_reduce_sum",
    "barrier",
    "broadcast_module",
    "broadcast_object",
    "choose_backend",
    "cleanup",
    "device",
    "device_ids",
    "discover",
    "expand_nodelist",
    "first_host",
    "init_kwargs",
    "is_main_process",
    "local_rank",
    "rank",
    "reduce_mean",
    "shard_loader",
    "shard_nodes",
    "shared_seed",
    "unwrap",
    "world_size",
]

BACKENDS = ("nccl", "gloo", "mpi", "ucc", "xccl", "hccl")
DEFAULT_TIMEOUT_S = 1800.0  # torch's default for gloo; NCCL gets the same instead of its 10 min
CLEANUP_JOIN_S = 5.0

_state_lock = threading.Lock()
_atexit_registered = False
# set by init_kwargs() for a group with peers, cleared once cleanup() has let go of it
_peers_to_release = False
_cleanup_thread: Optional[threading.Thread] = None
_device_cache: dict[bool, torch.device] = {}


# ------------------------------------------------------------------------------ helpers


def _dist() -> Any:
    """torch.distributed if it is usable in this build, else None."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return None
    return dist


def _group_ready() -> bool:
    dist = _dist()
    return dist is not None and dist.is_initialized()


def _horovod() -> Any:
    """``horovod.torch`` if the script already imported AND initialised it; never imports it."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is None:
        return None
    try:
        return hvd if hvd.is_initialized() else None
    except Exception:  # an old or half-imported horovod: treat as absent
        return None


def _fail(error: DistifyEnvError) -> SystemExit:
    return SystemExit(f"distify: {error}")


def _loopback_ifname() -> Optional[str]:
    """Name of the loopback interface ("lo" on Linux, "lo0" on macOS/BSD), None if not found."""
    import socket

    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):  # Windows without if_nameindex, sandboxes
        return None
    for name in names:  # Linux: trust the kernel's IFF_LOOPBACK flag over the name
        try:
            with open(f"/sys/class/net/{name}/flags") as fh:
                if int(fh.read().strip(), 16) & 0x8:
                    return name
        except (OSError, ValueError):
            break
    for candidate in ("lo", "lo0"):
        if candidate in names:
            return candidate
    return next((n for n in names if n.startswith("lo")), None)


def _accelerator_api() -> Any:
    """``torch.accelerator`` where torch has it with the distributed lookup that goes with it
    (torch >= 2.6), else None: older torch takes the CUDA-or-CPU path. So does a script that
    imported ``horovod.torch``: Horovod reduces CPU and CUDA tensors only."""
    api = getattr(torch, "accelerator", None)
    dist = _dist()
    if api is None or dist is None or not hasattr(dist, "get_default_backend_for_device"):
        return None
    if "horovod.torch" in sys.modules:
        return None
    if not all(hasattr(api, name) for name in ("is_available", "current_accelerator", "device_count")):
        return None
    return api


def _accelerator() -> Optional[tuple]:
    """``(device type, collective backend)`` of the accelerator this process trains on, or None
    for the CPU.

    With torch.accelerator (torch >= 2.6): whichever accelerator torch found -- ``("cuda",
    "nccl")``, ``("xpu", "xccl")``, ``("npu", "hccl")`` once ``torch_npu`` is imported -- with the
    backend ``torch.distributed.get_default_backend_for_device`` names for it. Without it (and
    under Horovod): CUDA or nothing. CUDA without NCCL (Windows builds) keeps the GPU and reduces
    on gloo, which handles CUDA tensors; any other accelerator without a backend of its own
    (``mps`` maps to gloo, which cannot reduce its tensors) trains on the CPU, as it did before.
    """
    dist = _dist()
    api = _accelerator_api()
    if api is None:
        if not torch.cuda.is_available():
            return None
        kind, backend = "cuda", "nccl"
    else:
        if not api.is_available():
            return None
        kind = api.current_accelerator().type
        try:
            backend = dist.get_default_backend_for_device(kind)
        except (ValueError, RuntimeError):  # an accelerator no backend is registered for
            return None
    if backend == "fake":
        # torch's test backend, which communicates nothing: torch 2.14 makes it hpu's default once
        # torch.distributed.fsdp is imported. Training on it would skip every reduction silently.
        return None
    if kind == "cuda" and backend == "nccl" and (dist is None or not dist.is_nccl_available()):
        return kind, "gloo"
    if backend == "gloo" and kind != "cuda":
        return None
    return kind, backend


def _device_count() -> int:
    api = _accelerator_api()
    if api is not None:
        return int(api.device_count())
    return torch.cuda.device_count()


def _set_device(index: int) -> None:
    api = _accelerator_api()
    setter = None
    if api is not None:
        # set_device_index since torch 2.7; torch 2.6 spelled it set_device_idx
        setter = getattr(api, "set_device_index", None) or getattr(api, "set_device_idx", None)
    (setter or torch.cuda.set_device)(index)


def _local_index(kind: str) -> int:
    """This process's local rank, checked against the devices of ``kind`` it can see."""
    lr = local_rank()
    count = _device_count()
    if lr >= count:
        noun = "device is" if count == 1 else "devices are"
        raise DistifyEnvError(f"LOCAL_RANK={lr} but only {count} {kind.upper()} {noun} visible")
    return lr


# ---------------------------------------------------------------------------- public API


def choose_backend(environ: Optional[Mapping[str, str]] = None) -> str:
    """The collective backend of this machine's accelerator (nccl for CUDA, xccl for Intel XPU,
    hccl for Ascend NPU), else "gloo"; ``DISTIFY_BACKEND`` overrides."""
    env = os.environ if environ is None else environ
    override = (env.get("DISTIFY_BACKEND") or "").strip()
    if override:
        if override.lower() not in BACKENDS:
            raise DistifyEnvError(
                f"DISTIFY_BACKEND={override!r} is not one of {', '.join(BACKENDS)}"
            )
        return override.lower()
    accelerator = _accelerator()
    return accelerator[1] if accelerator is not None else "gloo"


def _timeout(timeout: Optional[float], environ: Mapping[str, str]) -> datetime.timedelta:
    if timeout is None:
        raw = (environ.get("DISTIFY_INIT_TIMEOUT") or "").strip()
        if raw:
            try:
                timeout = float(raw)
            except ValueError:
                timeout = -1.0
            if not timeout > 0 or timeout == float("inf"):
                raise DistifyEnvError(
                    f"DISTIFY_INIT_TIMEOUT={raw!r} is not a positive number of seconds"
                )
        else:
            timeout = DEFAULT_TIMEOUT_S
    elif not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return datetime.timedelta(seconds=timeout)


def init_kwargs(timeout: Optional[float] = None) -> dict:
    """Keyword arguments for ``torch.distributed.init_process_group`` in this environment.

    * Under a launcher (torchrun, Kubeflow, srun, mpirun, horovodrun): exports what ``env://``
      needs (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK; existing values are kept) and
      returns ``backend, init_method="env://", rank, world_size, timeout``. torchrun always gets
      ``env://``: its agent already serves the store on MASTER_PORT.
    * Without one (plain ``python train.py``), or a non-torchrun world of one: a one-process group
      on an in-memory ``HashStore`` -- no rendezvous socket at all -- and gloo/NCCL pinned to the
      loopback interface, so nothing listens beyond 127.0.0.1.

    On an accelerator the backend is ``"cpu:gloo,<device>:<its backend>"`` (CPU tensors still
    reduce), and with torch.accelerator (torch >= 2.6) ``device_id`` names this process's device,
    made current: NCCL then connects at init, so a bad GPU or network fails there, clearly. Never
    on the CPU (torch rejects a CPU ``device_id``), nor when ``DISTIFY_BACKEND`` picks a backend
    other than the accelerator's.

    An inconsistent environment exits with one line, ``distify: <sentence>``.
    """
    global _atexit_registered, _peers_to_release
    try:
        env = discover()
        backend = choose_backend()
        accelerator = _accelerator()
        device_id = None
        if accelerator is not None and backend == accelerator[1] != "gloo":
            if not (os.environ.get("DISTIFY_BACKEND") or "").strip():
                # NCCL (xccl, hccl) for accelerator tensors, gloo for CPU ones: a script that keeps
                # the model on the CPU (a --no-cuda flag) or reduces CPU metrics still works.
                backend = f"cpu:gloo,{accelerator[0]}:{backend}"
            if _accelerator_api() is not None:
                device_id = torch.device(accelerator[0], _local_index(accelerator[0]))
        td = _timeout(timeout, os.environ)
        if env.source == "torchrun" or env.world_size > 1:
            if env.master_addr is None:
                raise DistifyEnvError(
                    f"MASTER_ADDR is not set and cannot be inferred for this {env.source} launch "
                    f"across several hosts (world size {env.world_size})"
                )
            os.environ.setdefault("MASTER_ADDR", env.master_addr)
            os.environ.setdefault("MASTER_PORT", str(env.master_port))
            os.environ.setdefault("RANK", str(env.rank))
            os.environ.setdefault("WORLD_SIZE", str(env.world_size))
            os.environ.setdefault("LOCAL_RANK", str(env.local_rank))
            if env.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
                # rank 0 will serve the rendezvous store on MASTER_PORT (torchrun's agent already
                # does that itself): say so in one line if the port is taken, not in a traceback
                _check_port_free(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
            kwargs: dict = {
                "backend": backend,
                "init_method": "env://",
                "rank": env.rank,
                "world_size": env.world_size,
                "timeout": td,
            }
        else:
            dist = _dist()
            if dist is None:
                raise DistifyEnvError("torch.distributed is not available in this torch build")
            lo = _loopback_ifname()
            if lo is not None:
                # Gloo binds its pair listener to the address the host name resolves to (a public
                # NIC on most machines) unless told otherwise; NCCL's bootstrap prefers non-lo NICs.
                os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
                os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)
            kwargs = {
                "backend": backend,
                "store": dist.HashStore(),
                "rank": 0,
                "world_size": 1,
                "timeout": td,
            }
        if device_id is not None:
            _set_device(device_id.index)
            kwargs["device_id"] = device_id
    except DistifyEnvError as error:
        raise _fail(error) from None
    with _state_lock:
        _peers_to_release = kwargs["world_size"] > 1
        if not _atexit_registered:
            atexit.register(cleanup)
            _atexit_registered = True
    return kwargs


def _check_port_free(addr: str, port: int) -> None:
    import socket

    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except OSError:
        return  # not resolvable here: torch reports it
    family, _, _, _, sockaddr = infos[0]
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.bind(sockaddr)
    except OSError as error:
        import errno

        if error.errno == errno.EADDRINUSE:
            raise DistifyEnvError(
                f"MASTER_PORT={port} is already in use on {addr}: pick a free port for MASTER_PORT"
            ) from None
        # EADDRNOTAVAIL: the master address belongs to another host; nothing to check here
    finally:
        probe.close()


def device(enabled: bool = True) -> torch.device:
    """The accelerator's device ``<type>:<local_rank>`` (made current) when one is usable and
    ``enabled`` -- ``cuda``, ``xpu``, ``npu``, whichever torch.accelerator finds (CUDA only on
    torch < 2.6) -- else cpu. ``enabled`` is the script's own switch (``device(use_cuda)``).

    Cached per process. A local rank with no matching visible device exits with one line.
    """
    enabled = bool(enabled)
    cached = _device_cache.get(enabled)
    if cached is not None:
        return cached
    accelerator = _accelerator() if enabled else None
    if accelerator is not None:
        kind = accelerator[0]
        try:
            lr = _local_index(kind)
        except DistifyEnvError as error:
            raise _fail(error) from None
        _set_device(lr)
        result = torch.device(kind, lr)
    else:
        result = torch.device("cpu")
    _device_cache[enabled] = result
    global _last_device
    _last_device = result
    return result


_last_device: Optional[torch.device] = None


def device_ids() -> Optional[list]:
    """What ``DistributedDataParallel(device_ids=...)`` wants: ``[local_rank]`` on an accelerator,
    else None.

    It follows the device the script picked last with :func:`device` – ``device(use_cuda)`` with
    ``use_cuda=False`` on a GPU machine gives ``None`` – and the default device otherwise.
    """
    dev = _last_device if _last_device is not None else device()
    return [dev.index] if dev.type != "cpu" else None


def rank() -> int:
    """Global rank: the process group's, else Horovod's (if initialised), else the environment's."""
    if _group_ready():
        return torch.distributed.get_rank()
    hvd = _horovod()
    if hvd is not None:
        return int(hvd.rank())
    return discover().rank


def world_size() -> int:
    """Number of processes: the process group's, else Horovod's, else the environment's."""
    if _group_ready():
        return torch.distributed.get_world_size()
    hvd = _horovod()
    if hvd is not None:
        return int(hvd.size())
    return discover().world_size


def local_rank() -> int:
    """Rank on this host: Horovod's if initialised, else the environment's (0 without launcher)."""
    hvd = _horovod()
    if hvd is not None and not _group_ready():
        return int(hvd.local_rank())
    return discover().local_rank


def is_main_process() -> bool:
    """True on global rank 0 (and in a plain single-process run)."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank; a no-op without a process group or Horovod."""
    if _group_ready():
        torch.distributed.barrier()
        return
    hvd = _horovod()
    if hvd is not None:
        hvd.barrier()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (any picklable object); `obj` itself without peers.

    For what only rank 0 can read, such as a file in rank 0's own temporary directory:
    ``state = runtime.broadcast_object(torch.load(path, map_location="cpu") if
    runtime.is_main_process() else None)``."""
    if _group_ready():
        holder = [obj]
        torch.distributed.broadcast_object_list(holder, src=0)
        return holder[0]
    hvd = _horovod()
    if hvd is not None:
        # one name on every rank: Horovod names the collective after type(obj) by default, which
        # differs between rank 0's object and the others' None (and the job hangs)
        return hvd.broadcast_object(obj, root_rank=0, name="distify.broadcast_object")
    return obj


def shared_seed() -> int:
    """A fresh seed, the same on every rank: rank 0 draws it from the OS and every rank receives
    rank 0's value (one small collective, after the process group or ``hvd.init()``).

    For a random draw every rank must make alike, such as the train / validation split a
    DistributedSampler then shards: ``random_split(full, [n, m],
    generator=torch.Generator().manual_seed(runtime.shared_seed()))``. Each run still splits
    anew, as the unseeded original did. Without peers (plain ``python``) a fresh seed; always in
    [0, 2**32), which every generator accepts (NumPy's and scikit-learn's included)."""
    seed = int.from_bytes(os.urandom(4), "little")
    if not _group_ready() and _horovod() is None:
        return seed
    return int(all_reduce(seed if rank() == 0 else 0, "sum"))


def broadcast_module(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank, in place: after a load that only rank 0 may
    have done (a checkpoint on rank 0's disk), once the module is wrapped. A no-op without peers."""
    tensors = [*module.parameters(), *module.buffers()]
    if _group_ready():
        dist = torch.distributed
        with torch.no_grad():
            for tensor in tensors:
                dist.broadcast(tensor.data, src=0)
        return
    hvd = _horovod()
    if hvd is not None:
        hvd.broadcast_parameters(module.state_dict(), root_rank=0)


_OPS = ("sum", "mean", "max", "min")


def all_reduce(value: Union[int, float, torch.Tensor], op: str = "sum") -> Any:
    """Reduce ``value`` over all ranks and return the result; the input is never modified.

    Numbers come back as numbers (``int`` for integer sum/max/min, ``float`` otherwise), tensors as
    a new tensor on the input's device. Uses the torch.distributed group if initialised, else
    Horovod if initialised, else (one process) returns the value as is.
    """
    if op not in _OPS:
        raise ValueError(f"op must be one of {', '.join(_OPS)}, got {op!r}")
    is_tensor = isinstance(value, torch.Tensor)
    if not is_tensor and not isinstance(value, (int, float)):
        raise TypeError(f"all_reduce takes a number or a tensor, got {type(value).__name__}")

    if is_tensor:
        tensor = value.detach().clone()
        integral = not (tensor.is_floating_point() or tensor.is_complex())
    else:
        integral = isinstance(value, int) and op != "mean"
        tensor = torch.tensor(value, dtype=torch.int64 if integral else torch.float64)
    if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
        tensor = tensor.to(torch.float64)

    if _group_ready():
        dist = torch.distributed
        home = tensor.device
        work = tensor
        if dist.get_backend() in ("nccl", "xccl", "hccl") and home.type == "cpu":
            work = tensor.to(device())
        red = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM,
               "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        dist.all_reduce(work, op=red)
        if op == "mean":
            work = work / dist.get_world_size()
        tensor = work.to(home)
    else:
        hvd = _horovod()
        if hvd is not None:
            red = {"sum": hvd.Sum, "mean": hvd.Sum, "max": hvd.Max, "min": hvd.Min}[op]
            tensor = hvd.allreduce(tensor, op=red)
            if op == "mean":
                tensor = tensor / hvd.size()

    if is_tensor:
        return tensor
    return int(tensor.item()) if integral else float(tensor.item())


def agree(flag: Any) -> bool:
    """One decision for every rank: True on each rank when `flag` is true on any rank, so that an
    early stop taken on a value each rank computes from its own shard (``if
    runtime.agree(loss.item() < tol): break``) is taken by all ranks at once, and none waits in a
    collective the others have left. ``bool(flag)`` without peers."""
    if not _group_ready() and _horovod() is None:
        return bool(flag)
    return all_reduce(1 if flag else 0, "max") == 1


def agree_all(flag: Any) -> bool:
    """The other half of ``agree``: True on each rank only when `flag` is true on every rank, for
    the test of a loop that trains (``while runtime.agree_all(not done):``), so that the loop ends
    on every rank as soon as it would end on one. ``bool(flag)`` without peers."""
    if not _group_ready() and _horovod() is None:
        return bool(flag)
    return all_reduce(1 if flag else 0, "min") == 1


def reduce_mean(value: Union[int, float, torch.Tensor]) -> Any:
    """``all_reduce(value, "mean")``: the average over ranks (e.g. of a loss or an accuracy)."""
    return all_reduce(value, "mean")


def reduce_each(values: Any, op: str = "mean") -> list:
    """Reduce a list entry by entry over all ranks: entry i becomes the mean (or the sum) over the
    ranks of their entry i (``losses = runtime.reduce_each(losses)``). A list with one loss per
    batch then holds, batch by batch, the loss of the big batch the ranks make together, as the
    single process at N times the batch would record it. Every rank must hold as many entries
    (DistributedSampler gives every rank as many batches): lists of different lengths stop every
    rank with an error instead of a mismatched collective. Numbers come back as numbers, tensors
    as tensors; without a process group or Horovod (one process) the list comes back as it is."""
    if op not in ("mean", "sum"):
        raise ValueError(f"op must be mean or sum, got {op!r}")
    items = list(values)
    if not _group_ready() and _horovod() is None:
        return items
    n = len(items)
    if all_reduce(n, "max") != all_reduce(n, "min"):
        raise RuntimeError(
            f"reduce_each: the ranks hold lists of different lengths (this rank: {n}); each rank must add "
            "one entry per batch and run as many batches as the others"
        )
    if any(isinstance(v, torch.Tensor) for v in items):
        return list(all_reduce(torch.stack([torch.as_tensor(v) for v in items]), op).unbind(0)) if items else []
    out = all_reduce(torch.tensor([float(v) for v in items], dtype=torch.float64), op).tolist()
    if op == "sum" and all(isinstance(v, int) for v in items):
        return [int(v) for v in out]
    return out


def all_reduce_sum(*values: Union[int, float, torch.Tensor]) -> Any:
    """Sum each value over all ranks: one result for one argument, else a tuple in argument order.

    Meant for evaluation metrics accumulated over a shard (``correct, total =
    runtime.all_reduce_sum(correct, total)``). Numbers come back as numbers of their own kind
    (``int`` stays ``int``) and travel together in one float64 collective, so every rank sends the
    same message whatever the local kinds; tensors are reduced one by one into new tensors. Without
    a process group or Horovod (one process) the values come back unchanged.
    """
    if not values:
        raise TypeError("all_reduce_sum needs at least one value")
    for value in values:
        if not isinstance(value, (int, float, torch.Tensor)):
            raise TypeError(f"all_reduce_sum takes numbers or tensors, got {type(value).__name__}")
    if not _group_ready() and _horovod() is None:
        return values[0] if len(values) == 1 else tuple(values)
    out = list(values)
    numbers = [i for i, v in enumerate(values) if not isinstance(v, torch.Tensor)]
    if numbers:
        packed = torch.tensor([float(values[i]) for i in numbers], dtype=torch.float64)
        summed = all_reduce(packed, "sum").tolist()
        for i, total in zip(numbers, summed):
            out[i] = int(total) if isinstance(values[i], int) else total
    for i, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            out[i] = all_reduce(value, "sum")
    return out[0] if len(out) == 1 else tuple(out)


class _DDPType(type):
    """Metaclass of :class:`DDP`: picks torch's wrapper or the one-process one when called, and makes
    ``isinstance(x, runtime.DDP)`` true for both."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        dist = _dist()
        if dist is None or not dist.is_initialized() or dist.get_world_size(kwargs.get("process_group")) > 1:
            # peers to average with (or no group at all: let torch say so)
            return torch.nn.parallel.DistributedDataParallel(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return type.__instancecheck__(cls, obj) or isinstance(obj, torch.nn.parallel.DistributedDataParallel)

    def __subclasscheck__(cls, sub: type) -> bool:
        return type.__subclasscheck__(cls, sub) or issubclass(sub, torch.nn.parallel.DistributedDataParallel)


class DDP(torch.nn.Module, metaclass=_DDPType):
    """``DistributedDataParallel``, except in a world of one.

    When the process group has peers, ``runtime.DDP(model, device_ids=...)`` returns torch's
    ``DistributedDataParallel(model, device_ids=...)`` itself. In a one-process run (plain
    ``python train.py``, or a launcher with one process) there is nobody to average gradients
    with, and DDP's reducer would still copy every gradient into its buckets and back each step
    (about 14 % of a 3 ms CPU step in bench P4). The call then returns this wrapper instead: the
    same ``.module``, the same ``state_dict`` keys (with the ``module.`` prefix), and ``no_sync()``,
    ``join()`` and ``register_comm_hook()`` accepted and doing nothing. ``isinstance(x, runtime.DDP)``
    is true for both wrappers; :func:`unwrap` unwraps both.

    Unlike torch's wrapper, this one does not move the inputs to ``device_ids[0]``: the script
    moves them itself, as it did before it was distributed.
    """

    def __init__(self, module: torch.nn.Module, device_ids: Optional[list] = None, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.module = module
        self.device_ids = device_ids

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)

    def no_sync(self) -> Any:
        """Nothing to hold back: gradients accumulate as they would without DDP."""
        return contextlib.nullcontext()

    def join(self, *args: Any, **kwargs: Any) -> Any:
        """Nothing to join: there are no other ranks to wait for."""
        return contextlib.nullcontext()

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        """Accepted and unused: a one-process run communicates nothing."""


class ShardSampler(torch.utils.data.Sampler):
    """This rank's share of a map-style dataset for evaluation: indices ``rank, rank + N, ...``.

    Unlike ``DistributedSampler`` it never pads (repeats samples) and never shuffles, so the shards
    of all ranks cover the dataset exactly once and sums over them (correct predictions, summed
    losses, sample counts) add up to the single-process values. Rank and world size are read when
    iterating (the process group's, else Horovod's, else the launcher environment's) unless given.
    """

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None, rank: Optional[int] = None) -> None:
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank

    def _indices(self) -> range:
        replicas = world_size() if self.num_replicas is None else int(self.num_replicas)
        index = rank() if self.rank is None else int(self.rank)
        if replicas < 1 or not 0 <= index < replicas:
            raise ValueError(f"ShardSampler: rank {index} is not in [0, {replicas})")
        return range(index, len(self.dataset), replicas)

    def __iter__(self):
        return iter(self._indices())

    def __len__(self) -> int:
        return len(self._indices())


# DataLoader arguments shard_loader carries over to the rebuilt loader, where this torch has them
_LOADER_ARGS = (
    "batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn",
    "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order",
)


def _process_rank() -> int:
    return rank()  # shard_loader's parameter `rank` hides the module's function


def shard_loader(loader: Any, num_replicas: Optional[int] = None, rank: Optional[int] = None) -> Any:
    """The same DataLoader, reading this rank's shard: a loader built where distify cannot rewrite it
    (a function of another module) is rebuilt over the same dataset with a ``DistributedSampler``.

    Every argument of the original is kept (batch size, ``drop_last``, workers, ``collate_fn``,
    pinning, ``worker_init_fn``, ``generator``, prefetching, timeout ...). The sampler shuffles when
    the original shuffled (a ``RandomSampler``), seeded from the loader's generator when it was
    given one, else with ``DistributedSampler``'s seed 0, so every rank draws the same permutation;
    call ``loader.sampler.set_epoch(epoch)`` on each pass. Rank and world size are the process
    group's (else Horovod's, else the launcher's) unless given. A loader that already has a
    ``DistributedSampler`` is returned as it is.

    Refuses (``TypeError`` / ``ValueError``) what it cannot translate without changing what the
    script reads: no DataLoader, a DataLoader subclass, an ``IterableDataset``, a custom
    ``sampler``/``batch_sampler``, a ``RandomSampler`` drawing with replacement or a sample count.
    """
    data = torch.utils.data
    where = "build it with sampler=DistributedSampler(dataset) where it is made"
    if not isinstance(loader, data.DataLoader):
        raise TypeError(f"shard_loader: expected a torch DataLoader, got {type(loader).__name__}; {where}")
    if isinstance(loader.sampler, data.distributed.DistributedSampler):
        return loader
    if type(loader) is not data.DataLoader:
        raise TypeError(f"shard_loader: cannot rebuild a {type(loader).__name__} (a DataLoader subclass); {where}")
    if isinstance(loader.dataset, data.IterableDataset):
        raise TypeError(
            "shard_loader: the loader reads an IterableDataset, which no sampler can split; give each rank "
            "its own part inside the dataset (torch.utils.data.get_worker_info() and the rank)"
        )
    batch_sampler, sampler = loader.batch_sampler, loader.sampler
    if batch_sampler is not None and type(batch_sampler) is not data.BatchSampler:
        raise ValueError(f"shard_loader: a custom batch_sampler ({type(batch_sampler).__name__}) cannot be sharded; {where}")
    generator = None
    if type(sampler) is data.RandomSampler:
        if sampler.replacement or sampler._num_samples is not None:
            raise ValueError(f"shard_loader: a RandomSampler with replacement or num_samples cannot be sharded; {where}")
        shuffle, generator = True, sampler.generator
    elif type(sampler) is data.SequentialSampler:
        shuffle = False
    else:
        raise ValueError(f"shard_loader: a custom sampler ({type(sampler).__name__}) cannot be sharded; {where}")
    seed = int(generator.initial_seed()) if generator is not None else 0
    replicas = world_size() if num_replicas is None else int(num_replicas)
    index = _process_rank() if rank is None else int(rank)
    shard = data.distributed.DistributedSampler(
        loader.dataset, num_replicas=replicas, rank=index, shuffle=shuffle, seed=seed
    )
    import inspect

    accepted = inspect.signature(inspect.unwrap(data.DataLoader.__init__)).parameters
    if any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        accepted = _LOADER_ARGS  # __init__ wrapped by a profiler or a patch: the loader's attributes decide
    kwargs = {name: getattr(loader, name) for name in _LOADER_ARGS if name in accepted and hasattr(loader, name)}
    if batch_sampler is None:
        kwargs["batch_size"] = None  # no automatic batching: one sample at a time
    shard_loader = data.DataLoader(loader.dataset, sampler=shard, **kwargs)
    if (shard_loader.batch_size, shard_loader.drop_last) != (loader.batch_size, loader.drop_last):
        raise RuntimeError(  # never train at another batch size without a word
            f"shard_loader: the rebuilt loader batches {shard_loader.batch_size} (drop_last={shard_loader.drop_last}), "
            f"the original {loader.batch_size} (drop_last={loader.drop_last}); {where}"
        )
    return shard_loader


# ------------------------------------------------------------------------------ shares of samplers and streams


def _replicas_and_rank(num_replicas: Optional[int], index: Optional[int]) -> tuple:
    replicas = world_size() if num_replicas is None else int(num_replicas)
    me = _process_rank() if index is None else int(index)
    if replicas < 1 or not 0 <= me < replicas:
        raise ValueError(f"distify.runtime: rank {me} is not in [0, {replicas})")
    return replicas, me


_DRAW_CHUNK = 4096  # elements per rank a ShareSampler draws at a time


class _DrawState:
    """The random state one pass of a sampler draws in, kept apart from the script's: entering puts
    the pass's state in (seeded from `seed` the first time), leaving keeps it for the next entry and
    puts the script's back. Covered: the sampler's own torch generator if it has one, else torch's
    default CPU generator, and Python's and NumPy's global ones (a sampler written in the script may
    draw from either). CUDA generators are not touched. A pass can so be drawn a chunk at a time,
    with the script's own draws between chunks, and still be the one sequence a single draw makes."""

    def __init__(self, seed: int, generator: Any) -> None:
        self.seed = seed
        self.generator = generator if isinstance(generator, torch.Generator) else None
        self.kept: Optional[tuple] = None
        self.saved: Optional[tuple] = None

    def _states(self) -> tuple:
        np = sys.modules.get("numpy")
        return (torch.get_rng_state(), random.getstate(), np.random.get_state() if np is not None else None,
                self.generator.get_state() if self.generator is not None else None)

    def _put(self, states: tuple) -> None:
        torch_state, py_state, np_state, own_state = states
        torch.set_rng_state(torch_state)
        random.setstate(py_state)
        np = sys.modules.get("numpy")
        if np is not None and np_state is not None:
            np.random.set_state(np_state)
        if own_state is not None:
            self.generator.set_state(own_state)

    def __enter__(self) -> "_DrawState":
        self.saved = self._states()
        np = sys.modules.get("numpy")
        if self.kept is None or (np is not None and self.kept[2] is None):
            torch.default_generator.manual_seed(self.seed)
            random.seed(self.seed)
            if np is not None:
                np.random.seed(self.seed % 2**32)
            if self.generator is not None:
                self.generator.manual_seed(self.seed)
        if self.kept is not None:
            self._put(self.kept)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kept = self._states()
        self._put(self.saved)


class ShareSampler(torch.utils.data.Sampler):
    """This rank's share of ``sampler`` (a sampler or a batch sampler): every N-th element of the
    sequence the sampler draws, drawn from the same seed on every rank.

    The seed of a pass: ``seed + epoch`` when ``seed`` is given, or when the sampler has its own
    ``generator`` (``seed`` is then its initial seed: the first pass draws what the original drew).
    The epoch is the one given to ``set_epoch``, else the number of passes so far (every rank makes
    the same passes). Otherwise the sampler drew from torch's global generator, and still does in
    effect: each pass takes a seed from rank 0's global generator and broadcasts it (one small
    collective when the pass starts, on every rank), so a script seeded with ``torch.manual_seed``
    draws reproducibly, every pass draws anew, and a sampler rebuilt every epoch (a DataLoader made
    inside the epoch loop) does not repeat its first draw.

    Every rank takes the same number of elements, so every rank makes the same number of steps:
    with ``drop_last=False`` (the default, as ``DistributedSampler``) the sequence is padded with its
    own first elements to a multiple of N (up to N - 1 samples appear twice in a pass); with
    ``drop_last=True`` its last ``len % N`` elements are left out.
    """

    def __init__(self, sampler: Any, num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 seed: Optional[int] = None, drop_last: bool = False) -> None:
        self.sampler = sampler
        self.num_replicas = num_replicas
        self.rank = rank
        generator = getattr(sampler, "generator", None)
        if seed is None and isinstance(generator, torch.Generator):
            seed = int(generator.initial_seed())
        self.seed = None if seed is None else int(seed)
        self.drop_last = bool(drop_last)
        self.epoch: Optional[int] = None
        self._passes = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def _pass_seed(self) -> int:
        """The seed of this pass, the same on every rank (counts a pass)."""
        epoch = self._passes if self.epoch is None else self.epoch
        self._passes += 1
        if self.seed is None:
            return broadcast_object(int(torch.randint(0, 2**62, (), dtype=torch.int64)))
        return self.seed + epoch

    def __iter__(self) -> Iterator[Any]:
        """Of every N consecutive elements the sampler draws, the rank's own, drawn a chunk at a time
        (a sampler of 10**10 draws with replacement is never held whole); the last group of fewer than
        N is padded with the pass's first elements, or left out with ``drop_last``."""
        replicas, me = _replicas_and_rank(self.num_replicas, self.rank)
        state = _DrawState(self._pass_seed(), getattr(self.sampler, "generator", None))
        drawn: Optional[Iterator[Any]] = None
        first: List[Any] = []
        group: List[Any] = []
        while True:
            with state:
                if drawn is None:
                    drawn = iter(self.sampler)
                chunk = list(itertools.islice(drawn, _DRAW_CHUNK * replicas))
            for item in chunk:
                if len(first) < replicas:
                    first.append(item)
                group.append(item)
                if len(group) == replicas:
                    yield group[me]
                    group = []
            if len(chunk) < _DRAW_CHUNK * replicas:
                break
        if group and not self.drop_last:
            padded = group + list(itertools.islice(itertools.cycle(first), replicas - len(group)))
            yield padded[me]

    def __len__(self) -> int:
        replicas, _ = _replicas_and_rank(self.num_replicas, self.rank)
        n = len(self.sampler)
        return n // replicas if self.drop_last else -(-n // replicas)


class ShareStream(torch.utils.data.IterableDataset):
    """This rank's share of an ``IterableDataset``: of every N consecutive items of the stream, the
    rank's own (``rank``-th); a last group of fewer than N items is left out, so every rank yields the
    same number of items and makes the same number of steps.

    In DataLoader workers each worker's stream is shared out the same way: a dataset that splits
    itself among the workers (``torch.utils.data.get_worker_info()``) keeps doing so, one that does
    not gives every worker the whole stream, as it did in the original script. Attributes other than
    the stream are the dataset's (``stream.vocab`` is ``dataset.vocab``).
    """

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None, rank: Optional[int] = None) -> None:
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank

    def __iter__(self) -> Iterator[Any]:
        replicas, me = _replicas_and_rank(self.num_replicas, self.rank)
        group: List[Any] = []
        for item in self.dataset:
            group.append(item)
            if len(group) == replicas:
                yield group[me]
                group = []

    def __len__(self) -> int:
        """The dataset's length shared out (a TypeError, as before, when the dataset has none)."""
        replicas, _ = _replicas_and_rank(self.num_replicas, self.rank)
        return len(self.dataset) // replicas

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "num_replicas", "rank") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def shard_nodes(nodes: Any, num_replicas: Optional[int] = None, rank: Optional[int] = None) -> Any:
    """This rank's part of the seed nodes a neighbour-sampling loader is given (PyG's
    ``NeighborLoader(data, input_nodes=...)``): a boolean mask or an index tensor (also a
    ``(node_type, nodes)`` pair), split as ``DistributedSampler`` splits a dataset. Every rank gets
    ``ceil(n / N)`` node indices – the first ones repeated to pad – so that every rank makes the same
    number of steps per pass (a rank with one step more would wait for the others' gradients forever).
    """
    if isinstance(nodes, tuple) and len(nodes) == 2 and isinstance(nodes[0], str):
        return (nodes[0], shard_nodes(nodes[1], num_replicas, rank))
    if nodes is None:
        raise TypeError("shard_nodes: input_nodes=None means every node; pass torch.arange(data.num_nodes)")
    index = torch.as_tensor(nodes)
    if index.dtype == torch.bool:
        index = index.nonzero().view(-1)
    replicas = world_size() if num_replicas is None else int(num_replicas)
    me = _process_rank() if rank is None else int(rank)
    total = -(-index.numel() // replicas) * replicas
    if index.numel() and total > index.numel():
        index = torch.cat([index, index[: total - index.numel()]])
    return index[me:total:replicas]


def unwrap(model: Any) -> Any:
    """The plain module inside DDP / DataParallel / ``torch.compile`` wrappers (recursively)."""
    parallel = torch.nn.parallel
    wrappers = (DDP, parallel.DataParallel)  # DDP: torch's wrapper and the one-process one
    seen = 0
    while seen < 64:  # wrappers nest a few levels at most; never loop forever on odd objects
        seen += 1
        if isinstance(model, wrappers):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            break
    return model


def cleanup() -> None:
    """Destroy the default process group if one exists. Idempotent; registered at exit.

    If the script already destroyed a group with peers itself (``dist.destroy_process_group()`` as
    its last line), DDP models still alive hold on to it: cleanup makes them let go (see _destroy).

    The work runs in a daemon thread joined for a few seconds, so a wedged peer (a rank that
    died, an NCCL communicator stuck on a dead link) cannot hang the exit of a finished script.
    """
    global _cleanup_thread, _peers_to_release
    with _state_lock:
        if _cleanup_thread is not None and _cleanup_thread.is_alive():
            return  # a destroy is already under way (or wedged): do not pile up threads
        if not (_group_ready() or _peers_to_release):
            return
        _peers_to_release = False
        worker = _cleanup_thread = threading.Thread(
            target=_destroy, name="distify-cleanup", daemon=True
        )
    worker.start()
    worker.join(CLEANUP_JOIN_S)


def _destroy() -> None:
    try:
        dist = torch.distributed
        ready = dist.is_initialized()  # False when the script destroyed its group itself
        if ready and dist.get_world_size() == 1:
            # a group of one has no connections to other ranks to tear down (see below): skip the
            # scan of every live object and the full collection, ~0.2 s once torch._dynamo is
            # loaded, which any optimizer does (P4 in bench/RESULTS.md)
            dist.destroy_process_group()
            return
        _release_ddp_wrappers()
        if ready:
            dist.destroy_process_group()
        # drop the last references now, while the interpreter is alive: a gloo process group whose
        # connections to other ranks are torn down during interpreter finalisation aborts the
        # process ("terminate called without an active exception"), and torchrun reports the job
        # failed
        import gc

        gc.collect()
    except Exception:  # exiting anyway: never turn a finished run into a traceback
        pass


def _release_ddp_wrappers() -> None:
    """Let DistributedDataParallel wrappers still alive at exit (module-level models) drop their
    reducer and process group, so the group can be freed before the interpreter shuts down."""
    import gc

    from torch.nn.parallel import DistributedDataParallel

    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads obj.__class__, and some torch objects (the
        # deprecated torch.distributed.reduce_op) warn when touched
        if issubclass(type(obj), DistributedDataParallel):
            for name in ("reducer", "logger", "process_group", "_comm_hooks"):
                obj.__dict__.pop(name, None)

