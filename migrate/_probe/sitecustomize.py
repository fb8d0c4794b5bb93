"""The probe of ``distify verify``: every Python process that verify starts loads it (this folder
goes first on PYTHONPATH), and it records what the training script does without editing it.

It acts only in the process that runs the script under test (``sys.argv[0]`` is
``$DISTIFY_VERIFY_SCRIPT``): the launchers (torchrun, horovodrun) and helper processes load it and do
nothing. In that process it appends one JSON object per line to ``$DISTIFY_VERIFY_RECORDS/rank<R>.jsonl``:

- ``opt``/``step``: each optimizer (where it was built) and, after each of its steps, a digest of
  its parameters (an FSDP2 DTensor parameter gathered whole first: ranks hold different shards), how
  many of them are sharded, and whether torch's global generator drew during the step (``rng``);
- ``drain``: after ``$DISTIFY_VERIFY_STEPS`` steps of the first optimizer that steps, the rest of the
  script runs with its data passes cut short: the pass in progress ends at its next batch and every
  later pass of every DataLoader yields one batch (only where a for loop, comprehension or generator
  consumes the loader: a bare ``next()`` is never cut), so end-of-training saves, prints and
  evaluation run. ``stop``: when the training goes on regardless (3 steps in a row without a batch,
  or 100 steps while draining) every rank waits at a barrier and exits 0 (``reason`` loop / cap);
  with ``$DISTIFY_VERIFY_AFTER=exit`` (the original of --against-original) it exits at the steps;
- ``loader``/``pass``/``batch``/``end``/``train``: each DataLoader (its sampler, whether it shuffles,
  its length), each pass (the sampler's seed and epoch), the indices it yields, the end of each pass
  (``cut`` when verify ended it), and which loaders fed an optimizer step; ``datarng``: a loader whose
  batches drew from a generator while being made, here or in a worker (augmentation), with which
  (``lib``: torch, random, numpy.random; see ``_distify_random``); a ``step`` says in ``rng`` whether
  torch's generator drew during it and in ``rngs`` which others did;
- ``draw``/``gen``/``gens``: where user code calls Python's ``random`` or ``numpy.random`` to draw
  (with the phase: setup, data, train, and whether that generator was seeded), the generator objects
  it built, and at the end which of them drew (``_distify_random``);
- ``modules``: at the end, the modules of the project (files in the sandbox) the run imported;
- ``write``: every file opened for writing, renamed into place or passed to ``torch.save`` (with
  whether the saved state's keys carry DDP's ``module.`` prefix);
- ``out``: each line the process writes to stdout, with the line of user code that wrote it;
- ``rand``: ``torch.randint``/``torch.randperm`` draws made by user code, per step window;
  ``dropout``: each line of user code that applies dropout in training mode;
- ``coll``: each collective (``dist.all_reduce``, ``all_gather``..., ``hvd.allreduce``...) called from
  outside torch and Horovod, with the user line that led to it;
- ``snapshot`` (with ``$DISTIFY_VERIFY_SNAPSHOT=1``): every optimizer's parameters saved after the
  steps, or at exit when the script ends first, for --against-original. With
  ``$DISTIFY_VERIFY_PERMS`` (loader id -> [seed, epoch] per pass) a RandomSampler of that loader
  draws ``torch.randperm(n)`` from a generator seeded with seed + epoch: the DistributedSampler's order.

Ranks other than 0 initialise their modules differently (to show a missing broadcast of rank 0's
weights) unless ``$DISTIFY_VERIFY_DIVERGE`` is 0: FSDP2's fully_shard keeps each rank's own slice of
its own initial weights, so an FSDP script relies on every rank initialising alike, as torch's own
FSDP2 examples do (one seed).

Writes below the run's sandbox (``$DISTIFY_VERIFY_SANDBOX``) never reach the user's files: the
sandbox links to the user's directory entries, and a link that is about to be written through is
first replaced by a private copy (a directory by a real one holding links, a file by a copy).

On ranks other than 0 of a multi-process run it also draws torch.nn.init's initialisation from a
rank-specific generator (after the normal draw, so the global random stream is unchanged): ranks
then start with different weights unless the script makes them start from rank 0's, as a correct
migration does (DDP's wrap, Horovod's broadcast) whether or not the script seeds.

Only the standard library is imported here; torch is patched right after the script imports it.
"""
import os
import sys


def _chain_shadowed_sitecustomize():
    """Run the sitecustomize this file hides (a distribution's or the user's), if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    _chain_shadowed_sitecustomize()
except Exception as _error:  # noqa: BLE001 - the shadowed file's own failure, reported as Python would
    sys.stderr.write(f"distify verify: the shadowed sitecustomize failed: {_error!r}\n")

_SCRIPT = os.environ.get("DISTIFY_VERIFY_SCRIPT")
_ACTIVE = bool(_SCRIPT and os.environ.get("DISTIFY_VERIFY_RECORDS") and sys.argv and sys.argv[0]
               and os.path.abspath(sys.argv[0]) == _SCRIPT)


def _rank_world():
    for rank, size in (("RANK", "WORLD_SIZE"), ("HOROVOD_RANK", "HOROVOD_SIZE"),
                       ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if os.environ.get(rank, "").strip():
            return int(os.environ[rank]), int(os.environ.get(size) or 1)
    return 0, 1


if _ACTIVE:
    import json
    import threading
    import weakref

    _RANK, _WORLD = _rank_world()
    _RECORDS = os.path.realpath(os.environ["DISTIFY_VERIFY_RECORDS"])
    _SANDBOX = os.path.realpath(os.environ.get("DISTIFY_VERIFY_SANDBOX") or os.path.dirname(_SCRIPT))
    _STEPS = int(os.environ.get("DISTIFY_VERIFY_STEPS") or 20)
    _LOCK = threading.RLock()
    _GUARD = threading.local()  # set while the probe itself opens/links files (no recursion)
    _fd = os.open(os.path.join(_RECORDS, f"rank{_RANK}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    _LOG = os.fdopen(_fd, "a", buffering=1)

    def _emit(**record):
        with _LOCK:
            _LOG.write(json.dumps(record, default=str) + "\n")

    _emit(k="start", rank=_RANK, world=_WORLD, pid=os.getpid())

    def _user_site(frame):
        """(path relative to the sandbox, line) of the innermost frame of user code, or None."""
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(_SANDBOX + os.sep):
                return [os.path.relpath(name, _SANDBOX), frame.f_lineno]
            frame = frame.f_back
        return None

    # --- writes: record them, and keep them inside the sandbox ---------------------------------

    def _private(path):
        """Before `path` (absolute, not resolved) is written: replace every link on the way to it
        that leads out of the sandbox by a private copy, so the write lands in the sandbox."""
        if not path.startswith(_SANDBOX + os.sep):
            return
        parts = os.path.relpath(path, _SANDBOX).split(os.sep)
        current = _SANDBOX
        for index, part in enumerate(parts):
            if part in ("", os.curdir, os.pardir):
                return
            current = os.path.join(current, part)
            if not os.path.islink(current):
                if not os.path.isdir(current):
                    return
                continue
            target = os.path.realpath(current)
            if target == _SANDBOX or target.startswith(_SANDBOX + os.sep):
                continue
            last = index == len(parts) - 1
            os.unlink(current)
            if os.path.isdir(target):
                os.mkdir(current)
                for entry in os.listdir(target):
                    os.symlink(os.path.join(target, entry), os.path.join(current, entry))
            elif last and os.path.isfile(target):
                import shutil

                shutil.copyfile(target, current)  # appends and r+ keep the old content
            if last:
                return

    def _before_write(path, how, prefixed=None, frame=None):
        if getattr(_GUARD, "busy", False):
            return
        _GUARD.busy = True
        try:
            try:
                path = os.path.abspath(os.fsdecode(os.fspath(path)))
            except TypeError:
                return
            if path.startswith(_RECORDS + os.sep) or path.startswith(("/dev/", "/proc/")):
                return
            try:
                _private(path)
            except OSError:
                pass
            record = dict(k="write", path=os.path.realpath(path), how=how, site=_user_site(frame or sys._getframe(2)))
            if prefixed is not None:
                record["prefixed"] = prefixed
            _emit(**record)
        finally:
            _GUARD.busy = False

    _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def _audit(event, args):
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int) or path is None:
                return
            writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE_FLAGS)
            if writing:
                _before_write(path, "open", frame=sys._getframe(1))
        elif event == "os.rename":
            _before_write(args[1], "rename", frame=sys._getframe(1))
        elif event == "os.mkdir":
            if not getattr(_GUARD, "busy", False) and not isinstance(args[0], int):
                try:
                    _private(os.path.dirname(os.path.abspath(os.fsdecode(os.fspath(args[0])))))
                except (OSError, TypeError):
                    pass

    sys.addaudithook(_audit)

    # --- stdout: one record per line, with the user code that printed it -----------------------

    class _Tee:
        def __init__(self, stream):
            self._stream = stream
            self._pending = ""
            self._site = None

        def write(self, text):
            if isinstance(text, str) and text:
                with _LOCK:
                    if not self._pending:
                        self._site = _user_site(sys._getframe(1))
                    self._pending += text
                    while "\n" in self._pending:
                        line, self._pending = self._pending.split("\n", 1)
                        _emit(k="out", text=line, site=self._site)
                        self._site = _user_site(sys._getframe(1)) if self._pending else None
            return self._stream.write(text)

        def flush_pending(self):
            with _LOCK:
                if self._pending:
                    _emit(k="out", text=self._pending, site=self._site)
                    self._pending = ""

        def __getattr__(self, name):
            return getattr(self._stream, name)

    if sys.stdout is not None:
        sys.stdout = _Tee(sys.stdout)

    # --- the batch argument of --against-original ----------------------------------------------

    _SCALE = os.environ.get("DISTIFY_VERIFY_SCALE")  # "dest:factor": scale an argparse default
    if _SCALE:
        import argparse

        _scale_dest, _scale_factor = _SCALE.rsplit(":", 1)
        _real_parse_known = argparse.ArgumentParser.parse_known_args
        _scaled = []

        def _parse_known_args(self, *args, **kwargs):
            namespace, rest = _real_parse_known(self, *args, **kwargs)
            value = getattr(namespace, _scale_dest, None)
            if not _scaled and isinstance(value, int) and not isinstance(value, bool):
                setattr(namespace, _scale_dest, value * int(_scale_factor))
                _scaled.append(value)
                _emit(k="scaled", dest=_scale_dest, before=value, after=value * int(_scale_factor))
            return namespace, rest

        argparse.ArgumentParser.parse_known_args = _parse_known_args

    # --- torch ---------------------------------------------------------------------------------

    # After the steps: "drain" lets the script run on to its end with every data pass cut short (the
    # pass in progress ends, each later pass yields one batch), so its saves, prints and evaluation
    # run; "exit" (the original of --against-original, which is only compared) leaves at once.
    _AFTER = os.environ.get("DISTIFY_VERIFY_AFTER", "drain")
    _DRAIN_STEPS = int(os.environ.get("DISTIFY_VERIFY_DRAIN_STEPS") or 100)
    _UNFED_STEPS = 3  # steps in a row, while draining, that took no batch from a DataLoader
    _SNAPSHOT = os.environ.get("DISTIFY_VERIFY_SNAPSHOT") == "1"
    _PERMS = json.loads(os.environ.get("DISTIFY_VERIFY_PERMS") or "{}")  # loader id -> [[seed, epoch] per pass]
    _TORCH_DIR = None  # set once torch is imported: collectives torch makes itself are not the script's

    _state = dict(first_opt=None, last_loader=None, depth=0, stopping=False, draining=False, drain_steps=0,
                  unfed=0, fed=False, snapshot=False, rng_pending=set())
    _opt_ids = {}
    _opt_refs = {}
    _opt_steps = {}
    _train_pairs = set()
    _loader_passes = {}
    _dataset_loader = {}  # id(dataset) -> the loader id that reads it (the last one built)
    _once = set()

    def _emit_once(key, **record):
        if key not in _once:
            _once.add(key)
            _emit(**record)

    def _opt_id(optimizer):
        key = id(optimizer)
        if key not in _opt_ids:
            _opt_ids[key] = len(_opt_ids)
            _opt_refs[_opt_ids[key]] = weakref.ref(optimizer)
            _emit(k="opt", id=_opt_ids[key], cls=type(optimizer).__name__,
                  site=getattr(optimizer, "_distify_verify_site", None))
        return _opt_ids[key]

    def _prefixed(obj, depth=0):
        """True when a state_dict in obj (or one or two levels down) has only `module.` keys."""
        import torch

        if isinstance(obj, dict):
            tensor_keys = [k for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)]
            if tensor_keys and all(k.startswith("module.") for k in tensor_keys):
                return True
            if depth < 2:
                return any(_prefixed(v, depth + 1) for v in obj.values())
        return False

    def _for_loop(frame):
        """The iterator's caller is a for loop (or a comprehension, enumerate, zip, a generator such as
        tqdm's) or a ``yield from`` (a disabled tqdm): a StopIteration ends it cleanly. A next() call
        would raise it in user code."""
        import dis

        try:
            return frame.f_code.co_code[frame.f_lasti] in _LOOP_OPS
        except (AttributeError, IndexError):
            return False

    import dis as _dis

    _LOOP_OPS = {_dis.opmap[name] for name in ("FOR_ITER", "SEND", "YIELD_FROM") if name in _dis.opmap}

    from _distify_random import Randomness

    _RANDOM = Randomness(_emit, _emit_once, _user_site, _SANDBOX)

    def _rng_moved(torch=None):
        """The generators (torch's, Python's random, numpy's, generator objects) that drew since the
        last mark, as a set of module names; marks now."""
        return _RANDOM.mark()

    def _training_starts():
        _RANDOM.training = True

    def _patch_torch(torch):
        import hashlib

        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        from torch.utils.data import dataloader as dl
        from torch.utils.data import sampler as samplers

        global _TORCH_DIR
        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            prefixed = _prefixed(obj)
            if isinstance(f, (str, bytes, os.PathLike)):
                _before_write(f, "torch.save", prefixed, sys._getframe(1))
            elif isinstance(getattr(f, "name", None), str):
                _emit(k="write", path=os.path.realpath(f.name), how="torch.save", prefixed=prefixed,
                      site=_user_site(sys._getframe(1)), again=True)
            return real_save(obj, f, *args, **kwargs)

        save.__wrapped__ = real_save
        torch.save = save

        real_opt_init = torch.optim.Optimizer.__init__

        def opt_init(self, *args, **kwargs):
            if not hasattr(self, "_distify_verify_site"):
                object.__setattr__(self, "_distify_verify_site", _user_site(sys._getframe(1)))
            return real_opt_init(self, *args, **kwargs)

        torch.optim.Optimizer.__init__ = opt_init

        def digest(optimizer):
            sha = hashlib.sha1()
            total = 0.0
            sharded = 0
            with torch.no_grad():
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        sharded += _is_shard(p)
                        t = _full(p.detach()).cpu().contiguous()
                        sha.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
                        total += float(t.double().abs().sum())
            return sha.hexdigest(), total, sharded

        def pre_hook(optimizer, args, kwargs):
            _state["depth"] += 1

        def post_hook(optimizer, args, kwargs):
            _state["depth"] -= 1
            if _state["depth"] > 0 or _state["stopping"]:
                return  # an optimizer subclass stepping through its base class: count it once
            oid = _opt_id(optimizer)
            n = _opt_steps[oid] = _opt_steps.get(oid, 0) + 1
            sha, total, sharded = digest(optimizer)
            _training_starts()
            drew = _rng_moved(torch) | _state["rng_pending"]
            _emit(k="step", opt=oid, n=n, sha=sha, abs=total, sharded=sharded, rng="torch" in drew,
                  rngs=sorted(drew - {"torch"}), drain=_state["draining"])
            _state["rng_pending"] = set()
            loader = _state["last_loader"]
            if loader is not None and (loader, oid) not in _train_pairs:
                _train_pairs.add((loader, oid))
                _emit(k="train", loader=loader, opt=oid)
            if _state["first_opt"] is None:
                _state["first_opt"] = oid
            if oid != _state["first_opt"]:
                return
            if _state["draining"]:
                _state["drain_steps"] += 1
                _state["unfed"] = 0 if _state["fed"] else _state["unfed"] + 1
                _state["fed"] = False
                if _state["unfed"] >= _UNFED_STEPS:
                    _stop(torch, "loop")
                elif _state["drain_steps"] >= _DRAIN_STEPS:
                    _stop(torch, "cap")
            elif n >= _STEPS:
                if _SNAPSHOT:
                    _snapshot(torch, n)
                if _AFTER == "exit":
                    _stop(torch, "steps")
                _state["draining"] = True
                _emit(k="drain", n=n)

        register_optimizer_step_pre_hook(pre_hook)
        register_optimizer_step_post_hook(post_hook)

        real_loader_init = dl.DataLoader.__init__

        def loader_init(self, *args, **kwargs):
            real_loader_init(self, *args, **kwargs)
            lid = len(_loader_passes)
            _loader_passes[lid] = 0
            object.__setattr__(self, "_distify_verify_id", lid)
            _dataset_loader[id(self.dataset)] = lid
            sampler = getattr(self, "sampler", None)
            name = type(sampler).__name__
            shuffles = None
            if hasattr(sampler, "shuffle") and isinstance(getattr(sampler, "shuffle"), bool):
                shuffles = sampler.shuffle
            elif name in ("RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler"):
                shuffles = True
            elif name == "SequentialSampler":
                shuffles = False
            try:
                length = len(self.dataset)
            except TypeError:
                length = None
            try:
                sampler_len = len(sampler)
            except TypeError:
                sampler_len = None
            _emit(k="loader", id=lid, site=_user_site(sys._getframe(1)), sampler=name, shuffle=shuffles,
                  len=length, sampler_len=sampler_len, batch_size=self.batch_size, drop_last=self.drop_last,
                  replicas=getattr(sampler, "num_replicas", None))
            if str(lid) in _PERMS and isinstance(sampler, samplers.RandomSampler) and not sampler.replacement \
                    and length is not None and sampler.num_samples == length:
                _align(sampler, _PERMS[str(lid)])
                _emit(k="aligned", loader=lid)

        dl.DataLoader.__init__ = loader_init

        def pass_start(self, loader):
            lid = getattr(loader, "_distify_verify_id", None)
            if lid is not None:
                self._distify_verify_pass = (lid, _loader_passes[lid])
                self._distify_verify_budget = 1 if _state["draining"] else None
                self._distify_verify_cut = False
                _loader_passes[lid] += 1
                sampler = getattr(loader, "sampler", None)
                _emit(k="pass", loader=lid, p=self._distify_verify_pass[1], seed=getattr(sampler, "seed", None),
                      epoch=getattr(sampler, "epoch", None))
            _rng_moved(torch)  # the iterator drew its base seed: not the training step's randomness

        real_iter_init = dl._BaseDataLoaderIter.__init__

        def iter_init(self, loader, *args, **kwargs):
            real_iter_init(self, loader, *args, **kwargs)
            pass_start(self, loader)

        dl._BaseDataLoaderIter.__init__ = iter_init

        real_reset = dl._BaseDataLoaderIter._reset

        def reset(self, loader, first_iter=False):
            real_reset(self, loader, first_iter)
            if not first_iter and hasattr(self, "_distify_verify_pass"):
                pass_start(self, loader)  # persistent workers: the same iterator, a new pass

        dl._BaseDataLoaderIter._reset = reset

        real_next_index = dl._BaseDataLoaderIter._next_index

        def next_index(self):
            where = getattr(self, "_distify_verify_pass", None)
            try:
                index = real_next_index(self)
            except StopIteration:
                if where is not None:
                    _emit(k="end", loader=where[0], p=where[1])
                raise
            if where is not None:
                try:
                    values = [int(i) for i in index] if hasattr(index, "__iter__") else [int(index)]
                except (TypeError, ValueError):
                    values = None
                if values is not None:
                    _emit(k="batch", loader=where[0], p=where[1], i=values)
            return index

        dl._BaseDataLoaderIter._next_index = next_index

        real_next = dl._BaseDataLoaderIter.__next__

        def loader_next(self):
            where = getattr(self, "_distify_verify_pass", None)
            if where is not None and _state["draining"]:
                budget = self._distify_verify_budget
                if not budget and _for_loop(sys._getframe(1)):
                    if not self._distify_verify_cut:
                        self._distify_verify_cut = True
                        _emit(k="end", loader=where[0], p=where[1], cut=True)
                    raise StopIteration
                self._distify_verify_budget = (budget or 0) - 1
                _state["fed"] = True
            if where is not None:
                _state["last_loader"] = where[0]
                _training_starts()
                _state["rng_pending"] = _rng_moved(torch) | _state["rng_pending"]
            data = real_next(self)
            if where is not None:
                _rng_moved(torch)  # what the fetch drew is the data's randomness (see fetch below), not the step's
            return data

        dl._BaseDataLoaderIter.__next__ = loader_next

        from torch.utils.data._utils import fetch as fetchers

        for fetcher in (fetchers._MapDatasetFetcher, fetchers._IterableDatasetFetcher):
            real_fetch = fetcher.fetch

            def fetch(self, index, _real=real_fetch, _by_index=fetcher is fetchers._MapDatasetFetcher):
                """A batch made from the dataset, in this process or in a worker (forked: the probe and
                the record file came with it): did making it draw from torch's generator (augmentation)?"""
                lid = _dataset_loader.get(id(self.dataset))
                if _SNAPSHOT and _by_index and lid is not None and _RANDOM.per_sample(self, index):  # --against-original
                    data, drew = _RANDOM.aligned_fetch(self, index)
                else:
                    before = _RANDOM.fingerprints(self.dataset)
                    _RANDOM.fetching(True)
                    try:
                        data = _real(self, index)
                    finally:
                        _RANDOM.fetching(False)
                    drew = dict.fromkeys(_RANDOM.moved(before, _RANDOM.fingerprints(self.dataset)), False)
                for lib, aligned in sorted(drew.items()):
                    _emit_once(("datarng", lid, lib, aligned), k="datarng", loader=lid, lib=lib, aligned=aligned)
                return data

            fetcher.fetch = fetch

        for fn_name in ("randint", "randperm"):
            real_fn = getattr(torch, fn_name)

            def drawn(*args, _real=real_fn, _name=fn_name, **kwargs):
                out = _real(*args, **kwargs)
                caller = sys._getframe(1)
                if caller.f_code.co_filename.startswith(_SANDBOX + os.sep) and isinstance(out, torch.Tensor):
                    window = _opt_steps.get(_state["first_opt"], 0) if _state["first_opt"] is not None else 0
                    sha = hashlib.sha1(out.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
                    _emit(k="rand", fn=_name, site=_user_site(caller), w=window, sha=sha.hexdigest())
                return out

            setattr(torch, fn_name, drawn)

        functional = torch.nn.functional
        for fn_name in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"):
            real_fn = getattr(functional, fn_name, None)
            if real_fn is None:
                continue

            def dropped(*args, _real=real_fn, _name=fn_name, **kwargs):
                p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
                training = kwargs.get("training", args[2] if len(args) > 2 else True)
                if training and p:
                    site = _user_site(sys._getframe(1))
                    _emit_once(("dropout", tuple(site or ())), k="dropout", fn=_name, p=float(p), site=site)
                return _real(*args, **kwargs)

            setattr(functional, fn_name, dropped)

        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available():
            _wrap_collectives(dist, ("all_reduce", "reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
                                     "gather", "gather_object", "reduce_scatter", "reduce_scatter_tensor"))

        if _WORLD > 1 and _RANK != 0 and os.environ.get("DISTIFY_VERIFY_DIVERGE", "1") != "0":
            _diverge_init(torch)

    def _align(sampler, perms):
        """The original of --against-original: its RandomSampler draws, pass after pass, the permutation the
        ranks' DistributedSampler drew (torch.randperm(n) from a generator seeded with seed + epoch), so
        the ranks' k-th batches together hold the samples of its k-th batch."""
        import torch

        count = [0]

        def order():
            p = count[0]
            count[0] += 1
            if p < len(perms):
                return perms[p]
            seed, epoch = perms[-1]
            return [seed, epoch + p - len(perms) + 1]

        def aligned_iter():
            seed, epoch = order()
            generator = torch.Generator()
            generator.manual_seed(int(seed) + int(epoch))
            yield from torch.randperm(len(sampler.data_source), generator=generator).tolist()

        object.__setattr__(sampler, "_distify_verify_iter", aligned_iter)  # read by the patched class method below
        cls = type(sampler)
        if not getattr(cls, "_distify_verify_aligned", False):
            real_iter = cls.__iter__

            def class_iter(self):
                own = self.__dict__.get("_distify_verify_iter")
                return own() if own is not None else real_iter(self)

            cls.__iter__ = class_iter
            cls._distify_verify_aligned = True

    def _wrap_collectives(module, names):
        """Record the collectives the script (or a library it calls, not torch or Horovod themselves)
        makes: an evaluation over sharded data must reduce what it measured."""
        here = os.path.dirname(os.path.abspath(__file__)) + os.sep
        for name in names:
            real_fn = getattr(module, name, None)
            if real_fn is None:
                continue

            def collective(*args, _real=real_fn, _name=name, **kwargs):
                caller = sys._getframe(1).f_code.co_filename
                if not (caller.startswith(here) or (_TORCH_DIR and caller.startswith(_TORCH_DIR))
                        or f"{os.sep}horovod{os.sep}" in caller):
                    _emit(k="coll", fn=_name, site=_user_site(sys._getframe(1)))
                return _real(*args, **kwargs)

            setattr(module, name, collective)

    def _patch_horovod(hvd):
        _wrap_collectives(hvd, ("allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather",
                                "allgather_object", "reducescatter"))

    def _diverge_init(torch):
        import inspect

        generator = torch.Generator().manual_seed(7919 * (_RANK + 1))
        init = torch.nn.init
        for fn_name in ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
                        "xavier_uniform_", "xavier_normal_", "orthogonal_", "sparse_"):
            real_fn = getattr(init, fn_name, None)
            if real_fn is None:
                continue
            try:
                params = inspect.signature(real_fn).parameters
            except (TypeError, ValueError):
                continue
            if "generator" not in params:
                continue

            def redrawn(tensor, *args, _real=real_fn, **kwargs):
                out = _real(tensor, *args, **kwargs)
                if kwargs.get("generator") is None:
                    _real(tensor, *args, **dict(kwargs, generator=generator))
                return out

            setattr(init, fn_name, redrawn)

    def _is_shard(p):
        """An FSDP2 parameter: a DTensor, each rank holding a slice."""
        return callable(getattr(p, "full_tensor", None))

    def _full(p):
        """The whole parameter: an FSDP2 DTensor gathered from every rank's shard (a collective: every
        rank digests the same optimizer after the same step), any other tensor as it is."""
        return p.full_tensor() if _is_shard(p) else p

    def _snapshot(torch, n):
        """Every optimizer's parameters (whole) after n steps of the first, for --against-original."""
        _state["snapshot"] = True
        params = {}
        for oid, ref in _opt_refs.items():
            opt = ref()
            if opt is not None:
                params[oid] = [_full(p.detach()).cpu().clone() for g in opt.param_groups for p in g["params"]]
        _GUARD.busy = True
        try:
            torch.save.__wrapped__(params, os.path.join(_RECORDS, f"params.rank{_RANK}.pt"))
        finally:
            _GUARD.busy = False
        _emit(k="snapshot", n=n)

    def _modules():
        """The modules of the project the run imported: files below the sandbox, relative to it."""
        found = {os.path.relpath(_SCRIPT, _SANDBOX)} if _SCRIPT.startswith(_SANDBOX + os.sep) else set()
        for module in list(sys.modules.values()):  # (__main__ has lost its __file__ by exit)
            name = getattr(module, "__file__", None)
            if isinstance(name, str) and name.startswith(_SANDBOX + os.sep) and name.endswith(".py"):
                found.add(os.path.relpath(name, _SANDBOX))
        _emit(k="modules", paths=sorted(found))
        _RANDOM.report()

    def _at_exit():
        _modules()
        out = sys.stdout
        if isinstance(out, _Tee):
            out.flush_pending()
        torch = sys.modules.get("torch")
        if _SNAPSHOT and torch is not None and not _state["snapshot"] and _state["first_opt"] is not None:
            try:
                opts = [ref() for ref in _opt_refs.values()]
                sharded = any(_is_shard(p) for opt in opts if opt is not None for g in opt.param_groups for p in g["params"])
                if sharded and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
                    _emit(k="snapshot_error", error="the process group was destroyed before the end: no gathered snapshot")
                else:
                    _snapshot(torch, _opt_steps.get(_state["first_opt"], 0))
            except Exception as error:  # noqa: BLE001 - report it; the run itself is judged on its own
                _emit(k="snapshot_error", error=repr(error))
        _emit(k="exit")
        _flush()

    import atexit

    atexit.register(_at_exit)

    def _stop(torch, reason):
        """Every rank is here right after the same optimizer step: wait for the others, exit 0 without
        tearing the interpreter (and the process group) down. `reason`: steps (the original of
        --against-original, compared only), loop (a training loop that the data passes do not end),
        cap (too many steps while draining)."""
        _state["stopping"] = True
        try:
            out = sys.stdout
            if isinstance(out, _Tee):
                out.flush_pending()
            _modules()
            _emit(k="stop", steps=_opt_steps.get(_state["first_opt"], 0), reason=reason)
            _synchronise(torch)
        except BaseException as error:  # noqa: BLE001 - report, then still leave
            _emit(k="stop_error", error=repr(error))
            _flush()
            os._exit(3)
        _flush()
        os._exit(0)

    def _synchronise(torch):
        import datetime

        hvd = sys.modules.get("horovod.torch")
        if hvd is not None and hvd.is_initialized():
            hvd.barrier()
            hvd.shutdown()
            return
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=120))
            else:
                dist.barrier()

    def _flush():
        for stream in (sys.stdout, sys.stderr, _LOG):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass

    from _distify_import_hook import after_import

    for _name in _RANDOM.modules:
        after_import(_name, lambda module, _name=_name: _RANDOM.patch(_name, module))
    after_import("torch", _patch_torch)
    after_import("horovod.torch", _patch_horovod)
