"""What distify knows about other people's code, as data: one row per library object.

A fact asks this table, through the qualified name ``distify.names`` resolves a call's callee to
(``from tqdm.auto import tqdm as bar`` -> ``tqdm.auto.tqdm``), never through how the script spells
the name. Adding a library is adding rows here, with a fixture that shows the migration they allow.

Kinds of rows:
- ``loader``: builds batches a migration must shard; ``shard`` says how: ``sampler`` (the loader
  takes ``sampler=``: give it a ``DistributedSampler`` where it is built), ``input_nodes`` (PyG's
  neighbour samplers: split the seed nodes by rank), ``none`` (nothing a sampler can split).
- ``wrapper``: iterating the call yields the items of the iterables it is handed, in order
  (``items``: ``first``, its first argument; ``all``, every positional argument). A wrapper is never
  the loader: a fact follows it to the loader it wraps (``pbar = tqdm(loader)``: ``loader``).
- ``counter``: iterating it counts (epochs, steps); it reads no data.
- ``framework``: a training framework that distributes the script itself; ``launch`` says how the
  script is started on N processes. distify leaves such a script as it is and says so.
- ``model``: builds a model in another library (its class is not in the script).
- ``container``: a module that only holds other modules and has no forward of its own (torch's
  ``ModuleList``, ``ModuleDict``); ``modules`` says how its modules are reached: ``iter`` (iterating
  it), ``values`` (its ``.values()``). FSDP's ``fully_shard`` refuses such a module: what it holds is
  sharded instead.
- ``copy``: copies the module it is handed, or averages it into a copy (``copy.deepcopy``, an EMA or
  SWA model, ``torch.save`` pickling it whole); ``argument`` is the module's position. The copy must
  be of the module, not of a DDP wrapper.
- ``stream``: the base class of datasets that are streams (``IterableDataset``): no sampler can split
  them; each rank must read its own share.
- ``rank``: its value differs between the processes of one run (``dist.get_rank()``,
  ``hvd.local_rank()``, ``os.getpid()``): conditions on it run on some ranks, files named from it
  are per rank. ``process``: this process's device or id, no rank number (a file named from it is
  per process, a condition on it is no rank condition).
- ``print``: writes a line to the terminal as ``print`` does (``tqdm.write``, ``sys.stdout.write``,
  ``pprint.pprint``): every rank would write it, so it runs on rank 0 (DST302, DST956).
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, Optional

from distify.values import Value


class Known(Value):
    """One row of the table: what a library object is for a migration."""

    __slots__ = ("name", "kind", "shard", "items", "title", "launch", "endless", "modules", "argument")
    name: str  # qualified name, as distify.names resolves it
    kind: str  # loader | wrapper | counter | framework | model | container | copy | stream | rank | process | print
    shard: str  # loader: sampler | input_nodes | none
    items: str  # wrapper: first | all
    title: str  # framework: how a user names it
    launch: str  # framework: the command that starts the script on N processes
    endless: bool  # wrapper/counter: iterating it never ends (a loop over it is a loop around passes)
    modules: str  # container: iter | values
    argument: int  # copy: the position of the module it copies

    def __init__(self, name: str, kind: str, shard: str = "", items: str = "", title: str = "", launch: str = "",
                 endless: bool = False, modules: str = "", argument: int = 0) -> None:
        self._set(name, kind, shard, items, title, launch, endless, modules, argument)


# exports of a module: a TorchScript / ONNX / torch.export program holds its own copy of the weights
EXPORTS: FrozenSet[str] = frozenset({"torch.jit.trace", "torch.jit.script", "torch.onnx.export", "torch.export.export"})


def _rows(kind: str, names: Iterable[str], **kw) -> Dict[str, Known]:
    return {n: Known(n, kind, **kw) for n in names}


_TORCH_LOADERS = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")
# PyG's DataLoader subclasses torch's and takes sampler=; its neighbour samplers are sharded
# through the seed nodes they are given (input_nodes), which no DistributedSampler splits
_PYG_LOADERS = ("torch_geometric.loader.DataLoader", "torch_geometric.loader.dataloader.DataLoader")
_PYG_NODE_LOADERS = (
    "torch_geometric.loader.NeighborLoader",
    "torch_geometric.loader.neighbor_loader.NeighborLoader",
    "torch_geometric.loader.HGTLoader",
)

_TQDM = (
    "tqdm.tqdm", "tqdm.std.tqdm", "tqdm.auto.tqdm", "tqdm.autonotebook.tqdm", "tqdm.notebook.tqdm",
    "tqdm.rich.tqdm", "tqdm.asyncio.tqdm", "tqdm.contrib.tenumerate",
    "torch.hub.tqdm",  # torch re-exports tqdm's class (pytorch/examples vision_transformer imports it from there)
)
_TRANGE = ("tqdm.trange", "tqdm.std.trange", "tqdm.auto.trange", "tqdm.autonotebook.trange", "tqdm.notebook.trange", "tqdm.rich.trange")

TABLE: Dict[str, Known] = {
    **_rows("loader", _TORCH_LOADERS, shard="sampler"),
    **_rows("loader", _PYG_LOADERS, shard="sampler"),
    **_rows("loader", _PYG_NODE_LOADERS, shard="input_nodes"),
    **_rows("wrapper", _TQDM, items="first"),
    **_rows(
        "wrapper",
        ("builtins.enumerate", "builtins.iter", "builtins.reversed", "itertools.islice",
         "more_itertools.peekable", "more_itertools.seekable", "more_itertools.chunked", "more_itertools.ichunked",
         "more_itertools.islice_extended"),
        items="first",
    ),
    **_rows(
        "wrapper",
        ("builtins.zip", "itertools.chain", "itertools.zip_longest", "itertools.product", "tqdm.contrib.tzip",
         "more_itertools.zip_equal", "more_itertools.interleave", "more_itertools.roundrobin"),
        items="all",
    ),
    **_rows(
        "counter",
        ("builtins.range", *_TRANGE, "torch.arange", "numpy.arange"),
    ),
    **_rows("wrapper", ("itertools.cycle",), items="first", endless=True),
    **_rows("counter", ("itertools.count", "itertools.repeat"), endless=True),
    **_rows("framework", ("accelerate.Accelerator", "accelerate.accelerator.Accelerator"),
            title="Hugging Face Accelerate", launch="accelerate launch {script}"),
    **_rows(
        "framework",
        ("lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer"),
        title="Lightning Trainer",
        launch="python {script} with Trainer(devices=N, strategy=\"ddp\"), or torchrun --nproc-per-node N {script}",
    ),
    **_rows("framework", ("lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric"),
            title="Lightning Fabric", launch="fabric run --devices N {script}, or torchrun --nproc-per-node N {script}"),
    **_rows(
        "framework",
        ("transformers.Trainer", "transformers.Seq2SeqTrainer", "transformers.trainer.Trainer",
         "trl.SFTTrainer", "trl.DPOTrainer", "trl.RewardTrainer"),
        title="Hugging Face Trainer", launch="torchrun --nproc-per-node N {script} (or accelerate launch {script})",
    ),
    **_rows("framework", ("deepspeed.initialize",), title="DeepSpeed", launch="deepspeed {script}"),
    **_rows(
        "framework",
        ("ignite.distributed.Parallel", "ignite.distributed.auto_model", "ignite.distributed.auto_dataloader"),
        title="PyTorch Ignite (idist)", launch="torchrun --nproc-per-node N {script}",
    ),
    **_rows(
        "framework",
        ("ray.train.torch.TorchTrainer", "ray.train.torch.prepare_model", "ray.train.torch.prepare_data_loader"),
        title="Ray Train", launch="python {script} (Ray starts the workers: ScalingConfig(num_workers=N))",
    ),
    **_rows("model", ("timm.create_model", "torch.hub.load")),
    **_rows("container", ("torch.nn.ModuleList", "torch.nn.modules.container.ModuleList"), modules="iter"),
    **_rows("container", ("torch.nn.ModuleDict", "torch.nn.modules.container.ModuleDict"), modules="values"),
    **_rows("copy", ("copy.deepcopy", "copy.copy", "torch.save", "torch.optim.swa_utils.AveragedModel",
                     "timm.utils.ModelEma", "timm.utils.ModelEmaV2", "timm.utils.ModelEmaV3",
                     "timm.utils.model_ema.ModelEma", "timm.utils.model_ema.ModelEmaV2",
                     "timm.utils.model_ema.ModelEmaV3")),
    **_rows("copy", ("torch.optim.swa_utils.update_bn",), argument=1),
    # exports: a TorchScript / ONNX / exported program holds its own copy of the module's weights
    **_rows("copy", EXPORTS),
    **_rows("stream", ("torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset")),
    # calls whose value differs between the processes of one run: a rank, a flag made from one, this
    # process's device or id (distify.rank_flow follows them through the script's names)
    **_rows(
        "rank",
        ("torch.distributed.get_rank", "torch.distributed.distributed_c10d.get_rank", "torch.distributed.get_node_local_rank",
         "horovod.torch.rank", "horovod.torch.local_rank", "horovod.torch.cross_rank",
         "horovod.torch.mpi_ops.rank", "horovod.torch.mpi_ops.local_rank",
         "distify.runtime.rank", "distify.runtime.local_rank", "distify.runtime.is_main_process",
         "torch.cuda.current_device",
         "torch_xla.core.xla_model.get_ordinal", "torch_xla.core.xla_model.get_local_ordinal",
         "torch_xla.core.xla_model.is_master_ordinal"),
    ),
    # objects and ids of this process that are no rank number (a condition on them is not a rank
    # condition), but a file or log line named from one is per process
    **_rows("process", ("distify.runtime.device", "distify.runtime.device_ids", "os.getpid", "socket.gethostname")),
    # a progress bar's own print: a log line like print()'s
    **_rows("print", ("tqdm.write", *(f"{t}.write" for t in _TQDM if ".contrib." not in t))),
    # the other routes to the terminal (PyTorch-GAN's progress lines are sys.stdout.write)
    **_rows("print", ("sys.stdout.write", "sys.stderr.write", "sys.stdout.writelines", "sys.stderr.writelines",
                      "sys.__stdout__.write", "sys.__stderr__.write", "pprint.pprint", "pprint.pp")),
}

# every progress bar (DST303 turns them off on ranks other than 0)
PROGRESS_BARS: FrozenSet[str] = frozenset(_TQDM + _TRANGE + ("tqdm.contrib.tzip",))

# iterables of consecutive integers whose last item is their stop minus one (`range(n)`, `range(a, b)`,
# tqdm's trange): a loop over one of them can tell its last iteration from its variable (DST402's
# micro-step loops, distify.micro_steps)
COUNTING_RANGES: FrozenSet[str] = frozenset(("builtins.range",) + _TRANGE)

# functions that read or rescale the gradients of the parameters (or tensors) they are handed: with
# Horovod they must see the averaged gradients, so the optimizer synchronizes before them (DST113)
GRADIENT_READERS: FrozenSet[str] = frozenset({
    "torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_norm",
    "torch.nn.utils.clip_grad.clip_grad_value_", "torch.nn.utils.clip_grads_with_norm_",
    "torch.nn.utils.clip_grad.clip_grads_with_norm_", "torch.nn.utils.get_total_norm",
    "torch.nn.utils.clip_grad.get_total_norm",
})

# methods of Hugging Face's models, tokenizers, configs and processors that write them to disk (or
# upload them): a checkpoint, one writer (rank 0); and methods of other libraries' objects that write
# a file (matplotlib's Figure.savefig, pandas' DataFrame.to_csv, a torchvision/PIL-style save_image).
# A class of the script that defines one of these methods overrides it (distify.writes).
SAVE_METHODS: FrozenSet[str] = frozenset({"save_pretrained", "push_to_hub"})
FILE_METHODS: FrozenSet[str] = frozenset({"savefig", "to_csv", "save_image"})

# layers that normalise with statistics of the batch they see: under data parallelism each rank
# sees its own shard of the batch (distify.model_build.batch_norm; SyncBatchNorm is the opt-in)
BATCH_NORM: FrozenSet[str] = frozenset({
    "torch.nn.BatchNorm1d", "torch.nn.BatchNorm2d", "torch.nn.BatchNorm3d",
    "torch.nn.LazyBatchNorm1d", "torch.nn.LazyBatchNorm2d", "torch.nn.LazyBatchNorm3d",
})

# the number of processes of the run (an lr already scaled by one is not scaled again: DST401)
WORLD_SIZE: FrozenSet[str] = frozenset({
    "torch.distributed.get_world_size", "horovod.torch.size", "distify.runtime.world_size",
})

# how a training loss grows with the batch (distify.loss_scale): the calls that keep one entry per
# sample of a tensor (a layer's output squashed, a log-probability picked per sample, batches joined),
# so that a later ``.sum()`` adds up over samples and ``.mean()`` averages over them. A matrix product
# (``z @ z.T``) pairs samples with each other and is none of these
ELEMENTWISE_FUNCTIONS: FrozenSet[str] = frozenset(
    [f"torch.{f}" for f in (
        "exp", "log", "log1p", "log2", "abs", "pow", "sqrt", "rsqrt", "square", "sigmoid", "tanh", "relu",
        "clamp", "clip", "neg", "where", "maximum", "minimum", "erf", "sin", "cos", "softmax", "log_softmax",
        "cat", "stack", "flatten", "lgamma", "digamma", "expm1", "reciprocal", "sign", "gather",
        "randn_like", "rand_like", "zeros_like", "ones_like",
    )]
    + [f"torch.nn.functional.{f}" for f in (
        "relu", "leaky_relu", "gelu", "silu", "elu", "softplus", "logsigmoid", "sigmoid", "tanh", "softmax",
        "log_softmax", "dropout", "normalize", "one_hot",
    )]
)
ELEMENTWISE_METHODS: FrozenSet[str] = frozenset({
    "exp", "log", "log1p", "log2", "abs", "pow", "sqrt", "rsqrt", "square", "sigmoid", "tanh", "relu", "clamp",
    "clip", "neg", "float", "double", "half", "to", "type_as", "clone", "contiguous", "squeeze", "unsqueeze",
    "view", "reshape", "flatten", "softmax", "log_softmax", "gather", "expm1", "reciprocal", "detach", "cpu",
    "cuda", "masked_fill", "lgamma", "sign", "sub", "add", "mul", "div", "t", "transpose", "permute", "flip",
})
# products that pair every sample of one batch with every sample of another (a similarity matrix
# ``z @ z.T``, distances): a loss over them compares the batch's samples with each other, as
# contrastive losses (SimCLR's NT-Xent, CLIP's InfoNCE) do with their negatives
PAIRWISE_FUNCTIONS: FrozenSet[str] = frozenset({
    "torch.mm", "torch.matmul", "torch.cdist", "torch.inner", "torch.outer", "torch.bmm",
})
PAIRWISE_METHODS: FrozenSet[str] = frozenset({"mm", "matmul", "inner", "outer"})
# a torch layer's forward keeps the samples of its input apart (a loss class of MEAN_LOSSES does not)
TORCH_LAYER_PREFIX = "torch.nn."
# mixed precision's loss scaler: ``scaler.scale(loss)`` multiplies the loss by a constant
GRAD_SCALERS: FrozenSet[str] = frozenset({
    "torch.amp.GradScaler", "torch.cuda.amp.GradScaler", "torch.amp.grad_scaler.GradScaler",
    "torch.cpu.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler",
})

# methods of a torch.distributions object that draw from torch's global generator (they take no
# generator=): a policy's `Categorical(probs).sample()` picks the actions that make an RL rollout,
# the data the policy then trains on (distify.training.distribution_draw)
DISTRIBUTIONS = "torch.distributions."
DISTRIBUTION_DRAWS: FrozenSet[str] = frozenset({"sample", "rsample", "sample_n"})

# losses that average over the batch unless told otherwise (``reduction="mean"`` is their default):
# a per-batch value, not a per-sample sum (distify.sums)
_LOSS_CLASSES = (
    "L1Loss", "MSELoss", "CrossEntropyLoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss", "HuberLoss",
    "SmoothL1Loss", "KLDivLoss", "PoissonNLLLoss", "GaussianNLLLoss", "SoftMarginLoss", "MultiLabelSoftMarginLoss",
    "MultiLabelMarginLoss", "MultiMarginLoss", "HingeEmbeddingLoss", "CosineEmbeddingLoss", "MarginRankingLoss",
    "TripletMarginLoss",
)
_LOSS_FUNCTIONS = (
    "l1_loss", "mse_loss", "cross_entropy", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
    "huber_loss", "smooth_l1_loss", "kl_div", "poisson_nll_loss", "gaussian_nll_loss", "soft_margin_loss",
    "multilabel_soft_margin_loss", "multilabel_margin_loss", "multi_margin_loss", "hinge_embedding_loss",
    "cosine_embedding_loss", "margin_ranking_loss", "triplet_margin_loss",
)
MEAN_LOSSES: FrozenSet[str] = frozenset(
    [f"torch.nn.{c}" for c in _LOSS_CLASSES] + [f"torch.nn.modules.loss.{c}" for c in _LOSS_CLASSES]
    + [f"torch.nn.functional.{f}" for f in _LOSS_FUNCTIONS]
)

# calls that make a tensor to add up into (distify.sums): a name bound to one before a loop and
# only added to in it (``correct = torch.zeros(())`` ... ``correct += (pred == y).sum()``) is a
# counter, as one bound to ``0`` is. ZERO_TENSORS start from zeros whatever their arguments;
# NUMBER_TENSORS hold the number literal they are handed first (``torch.tensor(0.0)``).
ZERO_TENSORS: FrozenSet[str] = frozenset({"torch.zeros", "torch.zeros_like"})
NUMBER_TENSORS: FrozenSet[str] = frozenset({"torch.tensor", "torch.as_tensor", "torch.scalar_tensor"})
# methods that only move or convert a tensor (``torch.zeros(()).to(device)``): it holds the same number
TENSOR_MOVES: FrozenSet[str] = frozenset({"to", "cuda", "cpu", "float", "double", "long", "int"})

# loggers: calls of these modules, and the objects these factories return, write log records
LOGGING_MODULES = ("logging.", "loguru.")
LOGGER_FACTORIES: FrozenSet[str] = frozenset({"logging.getLogger", "logging.Logger", "logging.LoggerAdapter"})

# nn.Module's and FSDPModule's own methods (torch 2.13): they run no forward of the module (nothing
# for FSDP to gather around them)
MODULE_METHODS: FrozenSet[str] = frozenset({
    "add_module", "apply", "bfloat16", "buffers", "children", "compile", "cpu", "cuda", "double",
    "eval", "extra_repr", "float", "get_buffer", "get_extra_state", "get_parameter",
    "get_submodule", "half", "ipu", "load_state_dict", "modules", "mtia", "named_buffers",
    "named_children", "named_modules", "named_parameters", "parameters", "requires_grad_",
    "set_extra_state", "set_submodule", "share_memory", "state_dict", "to", "to_empty", "train",
    "type", "xpu", "zero_grad", "reshard", "unshard",
})
# the housekeeping methods of other libraries' model classes (Hugging Face's save_pretrained,
# resize_token_embeddings, gradient_checkpointing_enable ...), by the prefixes of their names: they
# run no forward. Only for methods a class of the script does not define (the script's own methods
# are judged by what they do: distify.forward_methods)
MODEL_HOUSEKEEPING = (
    "register_", "set_", "_", "save", "load", "from_", "push_", "resize_", "get_", "gradient_checkpointing",
    "tie_", "init_", "post_init", "num_", "enable_", "disable_", "print_", "prepare_", "can_", "merge_",
    "add_", "freeze", "unfreeze",
)

# calls that only touch the file system, format values or read them: a project helper made of these,
# file writes and prints (``save_checkpoint(state, is_best, filename)``: torch.save, shutil.copyfile)
# may run on the main process alone without the other ranks missing anything (distify.helper_effects)
FILE_SYSTEM_MODULES = ("os.", "shutil.", "json.", "pathlib.", "csv.", "time.", "datetime.")
PURE_BUILTINS: FrozenSet[str] = frozenset({
    "open", "print", "sorted", "vars", "str", "repr", "int", "float", "bool", "len", "max", "min", "range",
    "enumerate", "zip", "dict", "list", "tuple", "isinstance", "format", "round", "abs", "sum",
})
# methods that read their receiver (a dict, a string, a module's or optimizer's state) and change nothing
READ_METHODS: FrozenSet[str] = frozenset({
    "items", "keys", "values", "get", "format", "join", "split", "strip", "startswith", "endswith", "lower",
    "upper", "state_dict",
})

# building by name: these calls import a module whose name is a value (`importlib.import_module("models." +
# name + "_model")`), and a call handed one of these modules builds one of its classes by name
# (`config.init_obj('optimizer', torch.optim, params)`: an optimizer). What such code builds is known
# only when it runs (distify.by_name).
IMPORTS_BY_NAME: FrozenSet[str] = frozenset({"importlib.import_module", "builtins.__import__"})
OPTIMIZER_MODULES: FrozenSet[str] = frozenset({"torch.optim"})
SCHEDULER_MODULES: FrozenSet[str] = frozenset({"torch.optim.lr_scheduler"})
# schedulers whose step(metric) decides from a value the script measures (cut the learning rate when
# it stops improving): each rank must hand them the same value, or the ranks' learning rates part
METRIC_SCHEDULERS: FrozenSet[str] = frozenset({
    "torch.optim.lr_scheduler.ReduceLROnPlateau",
})

# model constructors known by a method name on any receiver, or by the module that holds them
MODEL_METHODS: FrozenSet[str] = frozenset({"from_pretrained", "from_config"})
MODEL_MODULES = ("torchvision.models.", "timm.models.", "transformers.")


def known(qualname: Optional[str]) -> Optional[Known]:
    """The row of a qualified name (None: distify knows nothing about it)."""
    if not qualname:
        return None
    row = TABLE.get(qualname)
    if row is not None:
        return row
    if qualname.startswith(MODEL_MODULES[:2]) and qualname.rsplit(".", 1)[-1][:1].islower():
        return Known(qualname, "model")  # torchvision.models.resnet18, timm.models.vit_base_...
    if qualname.rsplit(".", 1)[-1] in MODEL_METHODS and qualname.startswith(MODEL_MODULES):
        return Known(qualname, "model")  # transformers.AutoModel.from_pretrained
    return None


def names_of(kind: str, **match: str) -> FrozenSet[str]:
    """The qualified names of every row of `kind` (and the given field values)."""
    return frozenset(
        n for n, r in TABLE.items() if r.kind == kind and all(getattr(r, k) == v for k, v in match.items())
    )


# --- randomness a run cannot share with another run ---------------------------------------------
# `distify verify --against-original` compares the weights of the ranks with the original's at N x
# batch: both must draw the same random numbers for the same samples. Besides torch's generator (the
# probe replays the shuffle), these modules draw from a global generator in their functions, and
# these constructors build generator objects whose methods draw. Which code draws is asked through
# qualified names (`from numpy.random import default_rng as mk` -> numpy.random.default_rng).
RANDOM_MODULES: Dict[str, str] = {"random": "Python's random", "numpy.random": "numpy.random"}
# constructors of generator objects: the module the draws are reported under
RANDOM_GENERATORS: Dict[str, str] = {
    "random.Random": "random", "random.SystemRandom": "random",
    "numpy.random.default_rng": "numpy.random", "numpy.random.Generator": "numpy.random",
    "numpy.random.RandomState": "numpy.random", "numpy.random.mtrand.RandomState": "numpy.random",
}
# functions of RANDOM_MODULES that set, read or build state: not draws
RANDOM_NOT_DRAWS: FrozenSet[str] = frozenset({
    "random.seed", "random.getstate", "random.setstate",
    "numpy.random.seed", "numpy.random.get_state", "numpy.random.set_state", "numpy.random.get_bit_generator",
    "numpy.random.set_bit_generator", "numpy.random.SeedSequence", "numpy.random.BitGenerator",
    "numpy.random.MT19937", "numpy.random.PCG64", "numpy.random.PCG64DXSM", "numpy.random.Philox", "numpy.random.SFC64",
    *RANDOM_GENERATORS,
})


def random_draw(qualname: Optional[str]) -> Optional[str]:
    """The module (a key of RANDOM_MODULES) whose global generator a call of `qualname` draws from:
    ``numpy.random.rand`` -> ``numpy.random``; None for anything else (``random.seed`` included)."""
    if not qualname or qualname in RANDOM_NOT_DRAWS:
        return None
    module, _, fn = qualname.rpartition(".")
    return module if module in RANDOM_MODULES and fn[:1].isalpha() else None


# --- draws that split or order a dataset, and how each is given a seed --------------------------
# A DistributedSampler shards the dataset each rank built: a split drawn from an unseeded generator
# is another split on every rank (distify.split_draws, DST208, DST965). Per draw: the seed call that
# seeds the global generator it reads, and how the draw is given a seed of its own that every rank
# shares (runtime.shared_seed()): ``generator`` passes a torch.Generator seeded with it as that
# keyword (or at `position`), ``seed`` passes the seed itself, ``local`` calls the method of the
# same name of a generator object built from it (``random.Random(seed).shuffle(files)``: Python's
# and NumPy's global functions are bound methods of one hidden such object, so the arguments and the
# result are the same, and the global stream is left as it was). Draws that make values (randn
# data, randint labels) are not here: generated data stands in for data read from disk.


class SplitDraw(Value):
    """How one draw that splits or orders a dataset is seeded."""

    __slots__ = ("name", "seeded_by", "how", "keyword", "position", "local")
    name: str  # qualified name of the draw
    seeded_by: str  # the seed call of the global generator it draws from (rank_input.SEEDS)
    how: str  # generator | seed | local
    keyword: str  # generator / seed: the argument that takes it
    position: int  # ... and its position when it may be passed positionally (-1: keyword only)
    local: str  # local: the generator class whose method of the draw's name draws alike

    def __init__(self, name: str, seeded_by: str, how: str, keyword: str = "", position: int = -1,
                 local: str = "") -> None:
        self._set(name, seeded_by, how, keyword, position, local)


def _draws(seeded_by: str, how: str, names: Iterable[str], **kw) -> Dict[str, SplitDraw]:
    return {n: SplitDraw(n, seeded_by, how, **kw) for n in names}


SPLIT_DRAWS: Dict[str, SplitDraw] = {
    **_draws("torch.manual_seed", "generator", ("torch.utils.data.random_split", "torch.utils.data.dataset.random_split"),
             keyword="generator", position=2),
    **_draws("torch.manual_seed", "generator", ("torch.randperm",), keyword="generator"),
    **_draws("numpy.random.seed", "local", ("numpy.random.permutation", "numpy.random.choice", "numpy.random.shuffle"),
             local="numpy.random.RandomState"),
    **_draws("random.seed", "local", ("random.shuffle", "random.sample"), local="random.Random"),
    # scikit-learn draws from NumPy's global generator when random_state is None
    **_draws("numpy.random.seed", "seed", ("sklearn.model_selection.train_test_split",), keyword="random_state"),
}
# draws that shuffle the list they are handed in place (``random.shuffle(files)`` before a split)
SHUFFLES_IN_PLACE: FrozenSet[str] = frozenset({"random.shuffle", "numpy.random.shuffle"})


# contexts in which torch records no graph (the evaluation plans, distify.retained_graph)
NO_GRAD = frozenset({
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.no_grad",
    "torch.autograd.inference_mode",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.grad_mode.inference_mode",
})


class FilePath(Value):
    """Where a library call that writes or reads one file takes the file: its position and keyword."""

    __slots__ = ("name", "writes", "position", "keyword")
    name: str
    writes: bool  # True: it writes the file; False: it reads it
    position: int
    keyword: str

    def __init__(self, name: str, writes: bool, position: int, keyword: str) -> None:
        self._set(name, writes, position, keyword)


def _paths(writes: bool, position: int, keyword: str, names: Iterable[str]) -> Dict[str, FilePath]:
    return {n: FilePath(n, writes, position, keyword) for n in names}


# Calls that write or read one file named by an argument: a file rank 0 alone writes and every rank
# then reads needs a barrier between the two (DST306). The builtin open() is read from its mode.
FILE_PATHS: Dict[str, FilePath] = {
    **_paths(True, 1, "f", ("torch.save",)),
    **_paths(True, 0, "file", ("numpy.save", "numpy.savez", "numpy.savez_compressed")),
    **_paths(True, 0, "fname", ("numpy.savetxt",)),
    **_paths(False, 0, "f", ("torch.load",)),
    **_paths(False, 0, "file", ("numpy.load",)),
    **_paths(False, 0, "fname", ("numpy.loadtxt", "numpy.genfromtxt")),
    **_paths(False, 0, "filepath_or_buffer", ("pandas.read_csv", "pandas.read_pickle", "pandas.read_table")),
    **_paths(True, 1, "f", ("torch.jit.save", "torch.export.save")),
    **_paths(True, 2, "f", ("torch.onnx.export",)),
    **_paths(False, 0, "f", ("torch.jit.load", "torch.export.load")),
}


# Calls that write a result file on every rank that runs them (DST304 gives them to rank 0; torch.save
# is DST301's): arrays, JSON and pickles, figures, images and sounds, tables, exported models.
FILE_WRITES: FrozenSet[str] = frozenset({
    "numpy.save", "numpy.savetxt", "numpy.savez", "numpy.savez_compressed",
    "json.dump", "pickle.dump", "yaml.dump", "yaml.safe_dump", "matplotlib.pyplot.savefig",
    # images and other result files (the VAE, DCGAN and WGAN examples write samples every epoch)
    "torchvision.utils.save_image", "imageio.imwrite", "imageio.v2.imwrite", "imageio.v3.imwrite",
    "cv2.imwrite", "scipy.io.savemat", "torchaudio.save", "soundfile.write", "pandas.DataFrame.to_csv",
    # exported models: TorchScript, ONNX, torch.export programs
    "torch.jit.save", "torch.onnx.export", "torch.export.save",
})
# What builds a TorchScript module, whose own .save(path) writes a file
SCRIPTED_MODULES: FrozenSet[str] = frozenset({
    "torch.jit.trace", "torch.jit.script", "torch.jit.load", "torch.jit.freeze", "torch.jit.optimize_for_inference",
})

# modules whose parameters are made by their first forward (a dry run before the optimizer); a
# wrapper built before it holds uninitialised parameters (DDP and fully_shard refuse them)
LAZY_MODULES: FrozenSet[str] = frozenset(
    f"torch.nn.{n}" for n in (
        "LazyLinear", "LazyConv1d", "LazyConv2d", "LazyConv3d", "LazyConvTranspose1d", "LazyConvTranspose2d",
        "LazyConvTranspose3d", "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "LazyInstanceNorm1d",
        "LazyInstanceNorm2d", "LazyInstanceNorm3d",
    )
)
