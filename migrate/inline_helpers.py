"""The inline runtime of ``distify --standalone``: the source of each helper the class may hold,
what each needs, and the class's header. standalone.py writes the class into a script from these.

Plain text for the CLI's side (it imports libcst at most, never torch); tests/test_standalone.py
runs each helper beside distify.runtime and checks they behave alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

VERSION = 1
MARKER = "# distify: standalone runtime (v{version}, {backend})"  # opens the class; found by find_block
_MARKER_RE = re.compile(r"#\s*distify: standalone runtime \(v(\d+), (\w+)\)")

_HEADER = MARKER + ''' -- written by `distify --standalone`.
# Plain torch and os.environ: torchrun, Kubeflow, srun, mpirun and horovodrun tell each process
# its rank; run with plain `python` the script is rank 0 of a world of one.
class runtime:
    """Where this process sits in the job, and the device it trains on."""
'''


@dataclass(frozen=True)
class Helper:
    source: str  # class-level code, indented by 4 spaces, starting with a blank line
    needs: Tuple[str, ...] = ()  # other helpers it calls
    modules: Tuple[str, ...] = ()  # template names it uses: os, torch, dist, hvd


# Template names and the modules they stand for; finish() renames them to the script's spellings.
MODULES = {"os": "os", "torch": "torch", "dist": "torch.distributed", "hvd": "horovod.torch"}

_ENVIRONMENT = Helper(
    '''
    @staticmethod
    def _environment():
        """(rank, world size, local rank) from the launcher's variables; (0, 1, 0) without one."""
        env = os.environ
        launchers = [
            ("RANK", "WORLD_SIZE", "LOCAL_RANK"),  # torchrun, Kubeflow
            ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK"),  # horovodrun --gloo
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI
            ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),  # MPICH, Intel MPI
        ]
        if int(env.get("SLURM_STEP_ID") or 2**32) < 0xFFFFFFF0:  # an srun task, not the batch script
            launchers.append(("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"))
        for rank, size, local_rank in launchers:
            if env.get(rank) and env.get(size):
                local = env.get("LOCAL_RANK") or env.get(local_rank) or 0
                return int(env[rank]), int(env[size]), int(local)
        return 0, 1, int(env.get("LOCAL_RANK") or 0)
''',
    modules=("os",),
)

_RENDEZVOUS = Helper(
    '''
    @staticmethod
    def _rendezvous():
        """Rank 0's address and port: MASTER_ADDR/MASTER_PORT, else Slurm's first node and a port
        per job, else this host (a multi-node mpirun or horovodrun needs MASTER_ADDR exported)."""
        import re

        env = os.environ
        addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if not addr and nodes:  # "gpu[07-10,12],cpu1" -> "gpu07"
            first = re.match(r"(?:[^,\\[]|\\[[^\\]]*\\])+", nodes).group(0)
            addr = re.sub(r"\\[(\\d+)[^\\]]*\\]", r"\\1", first)
        if not port and env.get("SLURM_JOB_ID", "").isdigit():  # every task of the job agrees
            port = str(10000 + int(env["SLURM_JOB_ID"]) % 20000)
        return addr or "127.0.0.1", port or "29500"
''',
    modules=("os",),
)

_ACCELERATOR = Helper(
    '''
    @staticmethod
    def _accelerator():
        """(device type, backend) of the accelerator -- cuda/nccl, xpu/xccl, npu/hccl (torch_npu) --
        or None for the CPU: through torch.accelerator where torch has it (2.7+), else CUDA only."""
        api = getattr(torch, "accelerator", None)
        if hasattr(api, "set_device_index") and hasattr(dist, "get_default_backend_for_device"):
            if not api.is_available():
                return None
            kind = api.current_accelerator().type
            try:
                backend = dist.get_default_backend_for_device(kind)
            except (ValueError, RuntimeError):  # no backend registered for this device
                return None
        elif torch.cuda.is_available():
            kind, backend = "cuda", "nccl"
        else:
            return None
        if kind == "cuda" and not dist.is_nccl_available():
            return kind, "gloo"  # gloo reduces CUDA tensors too
        if backend == "fake" or (backend == "gloo" and kind != "cuda"):  # mps: the CPU
            return None  # "fake" is torch's no-communication test backend, never a real one
        return kind, backend
''',
    modules=("torch", "dist"),
)

_INIT_KWARGS = Helper(
    '''
    @staticmethod
    def init_kwargs():
        """Arguments for dist.init_process_group: env:// under a launcher, else a group of one. On an
        accelerator its backend (CPU tensors on gloo) and, with torch.accelerator, device_id: NCCL
        connects at init and fails there, clearly. Never a device_id on the CPU: torch rejects it."""
        import atexit
        import datetime
        import socket

        rank, world_size, local_rank = runtime._environment()
        accelerator = runtime._accelerator()
        own_backend = accelerator is not None and accelerator[1] != "gloo"
        kwargs = dict(
            backend="cpu:gloo,%s:%s" % accelerator if own_backend else "gloo",  # CPU tensors on gloo
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(minutes=30),
        )
        api = getattr(torch, "accelerator", None)
        if own_backend and hasattr(api, "set_device_index"):
            api.set_device_index(local_rank)
            kwargs["device_id"] = torch.device(accelerator[0], local_rank)
        atexit.register(runtime.cleanup)
        if world_size > 1 or "TORCHELASTIC_RUN_ID" in os.environ:  # started by a launcher
            addr, port = runtime._rendezvous()
            for name, value in (("MASTER_ADDR", addr), ("MASTER_PORT", port), ("RANK", rank),
                                ("WORLD_SIZE", world_size), ("LOCAL_RANK", local_rank)):
                os.environ.setdefault(name, str(value))
            return dict(kwargs, init_method="env://")
        # plain `python train.py`: an in-memory store, and gloo/NCCL sockets on the loopback only
        loopback = next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)
        if loopback:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
            os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)
        return dict(kwargs, store=dist.HashStore())
''',
    needs=("_environment", "_rendezvous", "_accelerator", "cleanup"),
    modules=("os", "torch", "dist"),
)

_CLEANUP = Helper(
    '''
    @staticmethod
    def cleanup():
        """Destroy the process group at exit, while the interpreter is whole: gloo aborts the process
        if its links to other ranks are torn down during shutdown. DDP models still alive let go of
        it first, also when the script destroyed the group itself. A group of one (plain `python`)
        has no links and skips the costly part."""
        import gc

        if dist.is_initialized() and dist.get_world_size() == 1:
            dist.destroy_process_group()
            return
        if not dist.is_initialized() and os.environ.get("WORLD_SIZE", "1") == "1":
            return
        for obj in gc.get_objects():
            if issubclass(type(obj), torch.nn.parallel.DistributedDataParallel):
                for name in ("reducer", "logger", "process_group", "_comm_hooks"):
                    obj.__dict__.pop(name, None)
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()
''',
    modules=("os", "torch", "dist"),
)


def _rank_helper(name: str, doc: str, index: int, ddp_call: str, hvd_call: str) -> Dict[str, Helper]:
    body = '''
    @staticmethod
    def {name}():
        """{doc}"""
        return {call} if {group}.is_initialized() else runtime._environment()[{index}]
'''
    return {
        "ddp": Helper(
            body.format(name=name, doc=doc, call=f"dist.{ddp_call}()", group="dist", index=index),
            ("_environment",), ("os", "dist"),
        ) if ddp_call else Helper(
            f'''
    @staticmethod
    def {name}():
        """{doc}"""
        return runtime._environment()[{index}]
''',
            ("_environment",), ("os",),
        ),
        "horovod": Helper(
            body.format(name=name, doc=doc, call=f"hvd.{hvd_call}()", group="hvd", index=index),
            ("_environment",), ("os", "hvd"),
        ),
    }


_RANK = _rank_helper("rank", "Global rank of this process (0 without a launcher).", 0, "get_rank", "rank")
_WORLD_SIZE = _rank_helper("world_size", "Number of processes in the job.", 1, "get_world_size", "size")
_LOCAL_RANK = _rank_helper("local_rank", "Index of this process on its host (its GPU).", 2, "", "local_rank")

_IS_MAIN_PROCESS = Helper(
    '''
    @staticmethod
    def is_main_process():
        """True on rank 0, the process that prints and saves."""
        return runtime.rank() == 0
''',
    needs=("rank",),
)

_DEVICE = {
    "ddp": Helper(
        '''
    _last_device = None  # the device device() picked last

    @staticmethod
    def device(use_cuda=True):
        """<accelerator>:<local rank> (cuda, xpu, npu), made the current device, when one is usable
        and use_cuda; else the CPU."""
        accelerator = runtime._accelerator() if use_cuda else None
        runtime._last_device = torch.device("cpu")
        if accelerator is not None:
            runtime._last_device = torch.device(accelerator[0], runtime.local_rank())
            api = getattr(torch, "accelerator", None)
            if hasattr(api, "set_device_index"):
                api.set_device_index(runtime.local_rank())
            else:
                torch.cuda.set_device(runtime.local_rank())
        return runtime._last_device
''',
        needs=("local_rank", "_accelerator"),
        modules=("torch",),
    ),
    "horovod": Helper(
        '''
    _last_device = None  # the device device() picked last

    @staticmethod
    def device(use_cuda=True):
        """cuda:<local rank>, made the current device, when CUDA is usable; else the CPU (Horovod
        reduces CPU and CUDA tensors only)."""
        if use_cuda and torch.cuda.is_available():
            torch.cuda.set_device(runtime.local_rank())
            runtime._last_device = torch.device("cuda", runtime.local_rank())
        else:
            runtime._last_device = torch.device("cpu")
        return runtime._last_device
''',
        needs=("local_rank",),
        modules=("torch",),
    ),
}

_DEVICE_IDS = Helper(
    '''
    @staticmethod
    def device_ids():
        """DDP's device_ids: [the index of the accelerator device() picked], None on the CPU."""
        device = runtime._last_device or runtime.device()
        return [device.index] if device.type != "cpu" else None
''',
    needs=("device",),
)

_BARRIER = {
    "ddp": Helper(
        '''
    @staticmethod
    def barrier():
        """Wait for every rank (nothing to wait for without a process group)."""
        if dist.is_initialized():
            dist.barrier()
''',
        modules=("dist",),
    ),
    "horovod": Helper(
        '''
    @staticmethod
    def barrier():
        """Wait for every rank (nothing to wait for before hvd.init())."""
        if hvd.is_initialized():
            hvd.barrier()
''',
        modules=("hvd",),
    ),
}

_BROADCAST_OBJECT = {
    "ddp": Helper(
        '''
    @staticmethod
    def broadcast_object(obj):
        """Rank 0's obj (any picklable object) on every rank; obj itself without a process group."""
        if not dist.is_initialized():
            return obj
        holder = [obj]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]
''',
        modules=("dist",),
    ),
    "horovod": Helper(
        '''
    @staticmethod
    def broadcast_object(obj):
        """Rank 0's obj (any picklable object) on every rank; obj itself before hvd.init(). One
        collective name on every rank: Horovod's default names it after type(obj), which differs
        between rank 0's object and the others' None."""
        if not hvd.is_initialized():
            return obj
        return hvd.broadcast_object(obj, root_rank=0, name="distify.broadcast_object")
''',
        modules=("hvd",),
    ),
}

_ALL_REDUCE_HEAD = '''
    @staticmethod
    def all_reduce(value, op="sum"):
        """value reduced over all ranks with op "sum", "mean", "max" or "min"; a tensor gives a new
        tensor, a number a number."""
        if torch.is_tensor(value):
            tensor = value.detach().clone()
        else:
            floating = isinstance(value, float) or op == "mean"
            tensor = torch.tensor(value, dtype=torch.float64 if floating else torch.int64)
        if op == "mean" and not tensor.is_floating_point():
            tensor = tensor.double()
'''
_ALL_REDUCE = {
    "ddp": Helper(
        _ALL_REDUCE_HEAD
        + '''\
        if dist.is_initialized():
            ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                   "min": dist.ReduceOp.MIN}
            dist.all_reduce(tensor, op=ops[op])
            if op == "mean":
                tensor = tensor / dist.get_world_size()
        return tensor if torch.is_tensor(value) else tensor.item()
''',
        modules=("torch", "dist"),
    ),
    "horovod": Helper(
        _ALL_REDUCE_HEAD
        + '''\
        if hvd.is_initialized():
            ops = {"sum": hvd.Sum, "mean": hvd.Average, "max": hvd.Max, "min": hvd.Min}
            tensor = hvd.allreduce(tensor, op=ops[op])
        return tensor if torch.is_tensor(value) else tensor.item()
''',
        modules=("torch", "hvd"),
    ),
}

_REDUCE_MEAN = Helper(
    '''
    @staticmethod
    def reduce_mean(value):
        """The average of value over all ranks (a loss, an accuracy)."""
        return runtime.all_reduce(value, "mean")
''',
    needs=("all_reduce",),
)

_ALL_REDUCE_SUM = Helper(
    '''
    @staticmethod
    def all_reduce_sum(*values):
        """Each value summed over all ranks (evaluation counts): one result, or a tuple for several.
        Numbers travel together as float64, so the ranks agree even where one holds 0 and another 0.0."""
        numbers = [float(value) for value in values if not torch.is_tensor(value)]
        if numbers:
            numbers = runtime.all_reduce(torch.tensor(numbers, dtype=torch.float64)).tolist()
        totals = iter(numbers)
        sums = []
        for value in values:
            if torch.is_tensor(value):
                sums.append(runtime.all_reduce(value))
            else:
                total = next(totals)
                sums.append(int(total) if isinstance(value, int) else total)
        return sums[0] if len(sums) == 1 else tuple(sums)
''',
    needs=("all_reduce",),
    modules=("torch",),
)

_SHARD_SAMPLER = Helper(
    '''
    class ShardSampler(torch.utils.data.Sampler):
        """This rank's share of an evaluation set: samples rank, rank + N, ... Never padded nor
        shuffled, so sums over the shards of all ranks equal the single-process sums."""

        def __init__(self, dataset):
            self.dataset = dataset

        def __iter__(self):
            return iter(range(runtime.rank(), len(self.dataset), runtime.world_size()))

        def __len__(self):
            return len(range(runtime.rank(), len(self.dataset), runtime.world_size()))
''',
    needs=("rank", "world_size"),
    modules=("torch",),
)

_SHARD_NODES = Helper(
    '''
    @staticmethod
    def shard_nodes(nodes):
        """This rank's part of a neighbour-sampling loader's seed nodes (a mask, an index tensor or a
        (node_type, nodes) pair), split as DistributedSampler splits a dataset: ceil(n / N) each,
        the first ones repeated to pad, so every rank makes the same number of steps per pass."""
        if isinstance(nodes, tuple) and len(nodes) == 2 and isinstance(nodes[0], str):
            return (nodes[0], runtime.shard_nodes(nodes[1]))
        if nodes is None:
            raise TypeError("shard_nodes: input_nodes=None means every node; pass torch.arange(data.num_nodes)")
        index = torch.as_tensor(nodes)
        if index.dtype == torch.bool:
            index = index.nonzero().view(-1)
        replicas = runtime.world_size()
        total = -(-index.numel() // replicas) * replicas
        if index.numel() and total > index.numel():
            index = torch.cat([index, index[: total - index.numel()]])
        return index[runtime.rank():total:replicas]
''',
    needs=("rank", "world_size"),
    modules=("torch",),
)

_SHARD_LOADER = Helper(
    '''
    @staticmethod
    def shard_loader(loader, num_replicas=None, rank=None):
        """The same DataLoader over this rank's shard: rebuilt over its dataset with a
        DistributedSampler (shuffling when the original shuffled), every other argument kept.
        Refuses what a sampler cannot split: no plain DataLoader, an IterableDataset, a custom
        sampler or batch_sampler."""
        data = torch.utils.data
        if isinstance(getattr(loader, "sampler", None), data.distributed.DistributedSampler):
            return loader
        where = "build it with sampler=DistributedSampler(dataset) where it is made"
        if type(loader) is not data.DataLoader:
            raise TypeError(f"shard_loader: cannot rebuild a {type(loader).__name__}; {where}")
        if isinstance(loader.dataset, data.IterableDataset):
            raise TypeError("shard_loader: an IterableDataset cannot be split by a sampler; split it by rank inside")
        batches, sampler = loader.batch_sampler, loader.sampler
        if batches is not None and type(batches) is not data.BatchSampler:
            raise ValueError(f"shard_loader: a custom batch_sampler cannot be sharded; {where}")
        if type(sampler) is data.RandomSampler and not sampler.replacement and sampler._num_samples is None:
            shuffle, generator = True, sampler.generator
        elif type(sampler) is data.SequentialSampler:
            shuffle, generator = False, None
        else:
            raise ValueError(f"shard_loader: a custom sampler ({type(sampler).__name__}) cannot be sharded; {where}")
        shard = data.distributed.DistributedSampler(
            loader.dataset,
            num_replicas=runtime.world_size() if num_replicas is None else num_replicas,
            rank=runtime.rank() if rank is None else rank,
            shuffle=shuffle,
            seed=generator.initial_seed() if generator is not None else 0,
        )
        import inspect

        names = ("batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn",
                 "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers",
                 "pin_memory_device", "in_order")
        accepted = inspect.signature(inspect.unwrap(data.DataLoader.__init__)).parameters
        if any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
            accepted = names  # __init__ wrapped by a patch: the loader's own attributes decide
        kwargs = {n: getattr(loader, n) for n in names if n in accepted and hasattr(loader, n)}
        if batches is None:
            kwargs["batch_size"] = None  # no automatic batching
        out = data.DataLoader(loader.dataset, sampler=shard, **kwargs)
        if (out.batch_size, out.drop_last) != (loader.batch_size, loader.drop_last):
            raise RuntimeError("shard_loader: the rebuilt loader would batch differently from the original")
        return out
''',
    needs=("rank", "world_size"),
    modules=("torch",),
)

_UNWRAP_SOURCE = '''
    @staticmethod
    def unwrap(model):
        """The plain module inside DDP and torch.compile wrappers."""
        while True:
            if isinstance(model, {ddp}):
                model = model.module
            elif hasattr(model, "_orig_mod"):  # torch.compile
                model = model._orig_mod
            else:
                return model
'''
_UNWRAP = {
    # runtime.DDP: torch's wrapper and the one-process one
    "ddp": Helper(_UNWRAP_SOURCE.format(ddp="runtime.DDP"), needs=("DDP",)),
    "horovod": Helper(_UNWRAP_SOURCE.format(ddp="torch.nn.parallel.DistributedDataParallel"), modules=("torch",)),
}

_DDP_TYPE = Helper(
    '''
    class _DDPType(type):
        """DDP(...) below is torch's DistributedDataParallel(...) when the job has peers, and
        isinstance(model, DDP) holds for both wrappers."""

        def __call__(cls, *args, **kwargs):
            if not dist.is_initialized() or dist.get_world_size(kwargs.get("process_group")) > 1:
                return torch.nn.parallel.DistributedDataParallel(*args, **kwargs)
            return super().__call__(*args, **kwargs)

        def __instancecheck__(cls, obj):
            return type.__instancecheck__(cls, obj) or isinstance(obj, torch.nn.parallel.DistributedDataParallel)
''',
    modules=("torch", "dist"),
)

_DDP = Helper(
    '''
    class DDP(torch.nn.Module, metaclass=_DDPType):
        """In a world of one (plain `python`) there is nobody to average gradients with, and DDP's
        reducer would still copy every gradient each step: this wrapper keeps DDP's .module, its
        state_dict keys, no_sync() and register_comm_hook(), and does nothing else."""

        def __init__(self, module, device_ids=None, *args, **kwargs):
            super().__init__()
            self.module = module
            self.device_ids = device_ids

        def forward(self, *inputs, **kwargs):
            return self.module(*inputs, **kwargs)

        def no_sync(self):
            import contextlib

            return contextlib.nullcontext()

        def join(self, *args, **kwargs):
            import contextlib

            return contextlib.nullcontext()

        def register_comm_hook(self, state, hook):
            pass
''',
    needs=("_DDPType",),
    modules=("torch",),
)


def _both(helper: Helper) -> Dict[str, Helper]:
    return {"ddp": helper, "horovod": helper}


# name -> backend -> helper, in the order they appear in the class (a helper before its users)
HELPERS: Dict[str, Dict[str, Helper]] = {
    "_environment": _both(_ENVIRONMENT),
    "_rendezvous": {"ddp": _RENDEZVOUS},
    "_accelerator": {"ddp": _ACCELERATOR},
    "init_kwargs": {"ddp": _INIT_KWARGS},
    "cleanup": {"ddp": _CLEANUP},
    "rank": _RANK,
    "world_size": _WORLD_SIZE,
    "local_rank": _LOCAL_RANK,
    "is_main_process": _both(_IS_MAIN_PROCESS),
    "device": _DEVICE,
    "device_ids": _both(_DEVICE_IDS),
    "barrier": _BARRIER,
    "broadcast_object": _BROADCAST_OBJECT,
    "all_reduce": _ALL_REDUCE,
    "reduce_mean": _both(_REDUCE_MEAN),
    "all_reduce_sum": _both(_ALL_REDUCE_SUM),
    "ShardSampler": _both(_SHARD_SAMPLER),
    "shard_loader": _both(_SHARD_LOADER),
    "shard_nodes": _both(_SHARD_NODES),
    "_DDPType": {"ddp": _DDP_TYPE},
    "DDP": {"ddp": _DDP},
    "unwrap": _UNWRAP,
}


# FSDP2 runs on the process group DDP uses (init_process_group, torchrun's environment): its inline
# helpers are DDP's. The sharding itself is torch's own fully_shard, written in the script.
for _variants in HELPERS.values():
    if "ddp" in _variants:
        _variants.setdefault("fsdp", _variants["ddp"])
del _variants


def closure(names, backend: str) -> List[str]:
    """The helpers `names` need, dependencies included, in class order. Unknown names are skipped."""
    todo, found = [n for n in names if backend in HELPERS.get(n, {})], set()
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += HELPERS[name][backend].needs
    return [n for n in HELPERS if n in found]


def source(names: Sequence[str], backend: str, header: bool = True) -> str:
    """The code of the class holding `names` and the helpers they need; without header, the code
    of exactly those helpers (to append to a class that has the others)."""
    parts = [_HEADER.format(version=VERSION, backend=backend)] if header else []
    chosen = closure(names, backend) if header else [n for n in HELPERS if n in names]
    parts += [HELPERS[n][backend].source for n in chosen]
    return "".join(parts)


def modules_for(names: Sequence[str], backend: str) -> List[str]:
    """Template module names (os, torch, dist, hvd) the helpers use, in a stable order."""
    used = {m for n in closure(names, backend) for m in HELPERS[n][backend].modules}
    return [m for m in MODULES if m in used]
