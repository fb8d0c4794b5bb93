"""Randomness besides torch's generator, for distify verify's probe (this folder is on the runs'
PYTHONPATH; standard library only; numpy and torch are read from ``sys.modules`` when imported).

``--against-original`` compares the ranks' weights with the original's at N x batch: every random
number that shapes a training step must be drawn alike in both. The probe replays the shuffle;
anything else that draws while batches are made (augmentation in a Dataset's ``__getitem__``, a
collate, a transform) or during a step is what makes two correct runs differ. This module tells,
for a stretch of the run, which generators moved:

- torch's global CPU generator, Python's ``random`` and numpy's legacy global generator, by their
  state before and after;
- generator objects: those made by user code with ``random.Random(...)`` or
  ``numpy.random.default_rng(...)`` (registered when built), and those a Dataset holds in its
  attributes or its transforms' (found when a batch is fetched from it).

It also records where user code calls the modules' drawing functions (``random.shuffle``,
``np.random.rand``...): one ``draw`` record per (module, line, phase) -- ``setup`` before training
starts, ``data`` while a batch is fetched, ``train`` after -- with whether the module's global
generator was seeded by then. Which names draw comes from distify's library table
(``$DISTIFY_VERIFY_RANDOM``, written by verify from ``distify.library``).
"""
import hashlib
import json
import os
import pickle
import sys
import threading


_GLOBAL_KEYS = ("torch", "random", "numpy.random")  # fingerprint keys of the global generators


class Randomness:
    def __init__(self, emit, emit_once, user_site, sandbox):
        spec = json.loads(os.environ.get("DISTIFY_VERIFY_RANDOM") or "{}")
        self.modules = spec.get("modules", {})  # module -> how a user names it
        self.not_draws = set(spec.get("not_draws", ()))
        self.generators = spec.get("generators", {})  # constructor -> module
        self._emit, self._emit_once, self._user_site, self._sandbox = emit, emit_once, user_site, sandbox
        self.tracked = []  # [module, generator, fingerprint when built, seeded, site]; numpy's are not weak-referenceable
        self.seeded = {}  # module -> its global generator was seeded (or its state set) by the script
        self.training = False  # set by the probe at the first batch or optimizer step
        self._local = threading.local()
        self._mark = None

    # --- where user code draws --------------------------------------------------------------

    def phase(self):
        return "data" if getattr(self._local, "fetching", 0) else "train" if self.training else "setup"

    def fetching(self, on):
        self._local.fetching = getattr(self._local, "fetching", 0) + (1 if on else -1)

    def _from_user(self, frame):
        return frame.f_code.co_filename.startswith(self._sandbox + os.sep)

    def patch(self, name, module):
        """Wrap the drawing functions of `module` (one of self.modules), its seeding functions and
        its generator constructors."""
        for fn in getattr(module, "__all__", ()):
            qual, real = f"{name}.{fn}", getattr(module, fn, None)
            if not callable(real) or isinstance(real, type):
                continue
            if qual in self.generators:
                setattr(module, fn, self._constructor(name, real))
            elif fn in ("seed", "setstate", "set_state"):
                setattr(module, fn, self._seeder(name, real, fn == "seed"))
            elif qual not in self.not_draws:
                setattr(module, fn, self._drawer(name, fn, real))
        if name == "random" and "random.Random" in self.generators:
            cls = module.Random
            real_init = cls.__init__
            randomness = self

            def init(self, *args, **kwargs):
                real_init(self, *args, **kwargs)
                if type(self) is not getattr(module, "SystemRandom", None) and randomness._from_user(sys._getframe(1)):
                    seed = args[0] if args else kwargs.get("x")
                    randomness.register(name, self, seed is not None, sys._getframe(1))

            cls.__init__ = init

    def _drawer(self, name, fn, real):
        randomness = self

        def drawn(*args, **kwargs):
            site = randomness._user_site(sys._getframe(1))
            if site is not None:
                phase = randomness.phase()
                randomness._emit_once(("draw", name, tuple(site), phase), k="draw", lib=name, fn=fn, site=site,
                                      phase=phase, seeded=randomness.seeded.get(name, False))
            return real(*args, **kwargs)

        drawn.__wrapped__ = real
        drawn.__name__ = getattr(real, "__name__", fn)
        drawn.__doc__ = getattr(real, "__doc__", None)
        return drawn

    def _seeder(self, name, real, is_seed):
        randomness = self

        def seeder(*args, **kwargs):
            if randomness._user_site(sys._getframe(1)) is not None:
                value = args[0] if args else next(iter(kwargs.values()), None)
                randomness.seeded[name] = value is not None or not is_seed
            return real(*args, **kwargs)

        seeder.__wrapped__ = real
        seeder.__doc__ = getattr(real, "__doc__", None)
        return seeder

    def _constructor(self, name, real):
        randomness = self

        def construct(*args, **kwargs):
            obj = real(*args, **kwargs)
            frame = sys._getframe(1)
            if randomness._from_user(frame):
                seed = args[0] if args else next(iter(kwargs.values()), None)
                randomness.register(name, obj, seed is not None, frame)
            return obj

        construct.__wrapped__ = real
        construct.__doc__ = getattr(real, "__doc__", None)
        return construct

    def register(self, name, obj, seeded, frame):
        if len(self.tracked) < 4096 and not any(g is obj for _, g, *_ in self.tracked):
            site = self._user_site(frame)
            self.tracked.append([name, obj, _fingerprint(obj), seeded, site])
            self._emit_once(("gen", name, tuple(site or ()), seeded), k="gen", lib=name, site=site, seeded=seeded,
                            phase=self.phase())

    # --- which generators moved --------------------------------------------------------------

    def fingerprints(self, holder=None):
        """{key: (module, fingerprint)} of every generator known now (and those `holder` -- a
        Dataset -- keeps in its attributes or one level down)."""
        out = {}
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "random"):
            out["torch"] = ("torch", hashlib.sha1(torch.random.get_rng_state().numpy().tobytes()).digest())
        rnd = sys.modules.get("random")
        if rnd is not None and "random" in self.modules:
            out["random"] = ("random", _fingerprint(rnd))
        nprandom = sys.modules.get("numpy.random")
        if nprandom is not None and "numpy.random" in self.modules:
            out["numpy.random"] = ("numpy.random", _fingerprint(nprandom))
        for name, obj, *_ in self.tracked:
            out[id(obj)] = (name, _fingerprint(obj))
        if holder is not None:
            for name, obj in _held(holder):
                out.setdefault(id(obj), (name, _fingerprint(obj)))
        return out

    def moved(self, before, after):
        """The modules ("torch", "random", "numpy.random") whose generators drew between two
        fingerprints; a generator built in between is compared with its state when built."""
        built = {id(obj): fp for _, obj, fp, *_ in self.tracked}
        out = set()
        for key, (name, fp) in after.items():
            old = before.get(key, (name, built.get(key, fp)))[1]
            if fp is not None and old != fp:
                out.add(name)
        return out

    # --- the same numbers for the same sample in every run (--against-original) ------------------

    def per_sample(self, fetcher, index):
        """The fetcher reads a map-style dataset one integer index at a time (no batched
        ``__getitems__`` of the dataset's own; a Subset's is followed to its dataset)."""
        torch = sys.modules.get("torch")
        if torch is None or not getattr(fetcher, "auto_collation", False):
            return False
        if not all(isinstance(i, int) or (hasattr(i, "__index__") and not isinstance(i, bool)) for i in index):
            return False
        dataset, subset = fetcher.dataset, torch.utils.data.Subset
        while getattr(type(dataset), "__getitems__", None) is not None:
            if not (isinstance(dataset, subset) and type(dataset).__getitems__ is subset.__getitems__):
                return False
            dataset = dataset.dataset
        return True

    def aligned_fetch(self, fetcher, index):
        """Make a batch sample by sample, each sample drawing from torch's, Python's and numpy's
        global generators seeded by its index, then restore the generators: a run at N
        ranks and the original at N x batch then draw the same numbers for the same sample, whatever
        process or order fetches it. Returns (the batch, {module: aligned}): aligned is False for a
        module whose draws the seeding does not reach (a generator object, a draw in the collate)."""
        if "numpy" in sys.modules and "numpy.random" not in sys.modules:
            import numpy.random  # noqa: F401 - numpy imports it on first use of np.random: seed it before that use
        saved = self._globals()
        start = self.fingerprints(fetcher.dataset)
        global_drew, data = set(), []
        self.fetching(True)
        try:
            try:
                for i in index:
                    self._seed((0x9E3779B1 * (int(i) + 1)) % (1 << 32))
                    seeded = self.fingerprints()
                    data.append(fetcher.dataset[i])
                    global_drew |= self.moved(seeded, self.fingerprints())
                ended = self.fingerprints(fetcher.dataset)
            finally:
                self._restore(saved)
            restored = self.fingerprints(fetcher.dataset)
            batch = fetcher.collate_fn(data)
        finally:
            self.fetching(False)
        objects = lambda fps: {k: v for k, v in fps.items() if k not in _GLOBAL_KEYS}  # noqa: E731
        unaligned = self.moved(objects(start), objects(ended)) | self.moved(restored, self.fingerprints(fetcher.dataset))
        return batch, {**{lib: True for lib in global_drew}, **{lib: False for lib in unaligned}}

    def _real(self, module, fn):
        f = getattr(module, fn)
        return getattr(f, "__wrapped__", f)

    def _globals(self):
        out = {}
        torch, rnd, nprandom = (sys.modules.get(m) for m in ("torch", "random", "numpy.random"))
        if torch is not None:
            out["torch"] = torch.random.get_rng_state()
        if rnd is not None:
            out["random"] = rnd.getstate()
        if nprandom is not None:
            out["numpy.random"] = nprandom.get_state()
        return out

    def _seed(self, seed):
        torch, rnd, nprandom = (sys.modules.get(m) for m in ("torch", "random", "numpy.random"))
        if torch is not None:
            torch.random.default_generator.manual_seed(seed)
        if rnd is not None:
            self._real(rnd, "seed")(seed)
        if nprandom is not None:
            self._real(nprandom, "seed")(seed)

    def _restore(self, saved):
        torch, rnd, nprandom = (sys.modules.get(m) for m in ("torch", "random", "numpy.random"))
        if "torch" in saved:
            torch.random.set_rng_state(saved["torch"])
        if "random" in saved:
            self._real(rnd, "setstate")(saved["random"])
        if "numpy.random" in saved:
            self._real(nprandom, "set_state")(saved["numpy.random"])

    def report(self):
        """A ``gens`` record: the generator objects user code built that have drawn so far."""
        drew = {(name, tuple(site or ()), seeded) for name, obj, fp, seeded, site in self.tracked if _fingerprint(obj) != fp}
        self._emit(k="gens", drew=[[name, list(site) or None, seeded] for name, site, seeded in sorted(drew)])

    def mark(self):
        """The modules whose generators drew since the last mark; marks now."""
        now = self.fingerprints()
        before, self._mark = self._mark, now
        return set() if before is None else self.moved(before, now)


def _held(holder, depth=0):
    """(module, generator object) pairs among `holder`'s attributes, two levels deep."""
    out = []
    try:
        values = list(vars(holder).values())
    except TypeError:
        return out
    for value in values:
        kind = _kind(value)
        if kind:
            out.append((kind, value))
        elif depth < 1 and hasattr(value, "__dict__") and not isinstance(value, type):
            out += _held(value, depth + 1)
        elif depth < 1 and isinstance(value, (list, tuple)):
            for item in value[:16]:
                if _kind(item):
                    out.append((_kind(item), item))
                elif hasattr(item, "__dict__") and not isinstance(item, type):
                    out += _held(item, depth + 1)
    return out


def _kind(obj):
    cls = type(obj)
    module = getattr(cls, "__module__", "") or ""
    if module.startswith("numpy.random") and hasattr(obj, "bit_generator" if cls.__name__ == "Generator" else "get_state"):
        return "numpy.random"
    rnd = sys.modules.get("random")
    if rnd is not None and isinstance(obj, rnd.Random) and not isinstance(obj, rnd.SystemRandom):
        return "random"
    return None


def _fingerprint(obj):
    """A digest of a generator's state (a module: its global generator), None when it has none."""
    try:
        if hasattr(obj, "getstate"):  # Python's random module or a random.Random
            return hash(obj.getstate())
        if hasattr(obj, "get_state"):  # numpy's legacy global generator (the numpy.random module) or a RandomState
            state = obj.get_state(legacy=False)
        else:  # a numpy Generator
            state = obj.bit_generator.state
        return hashlib.sha1(pickle.dumps(state)).digest()
    except Exception:  # noqa: BLE001 - a generator without readable state (SystemRandom): not comparable
        return None
