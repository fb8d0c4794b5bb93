"""Each rank's share of a sampler the script chose, and of a stream (``distify.runtime``).

``ShareSampler`` wraps any sampler or batch sampler (``WeightedRandomSampler``,
``SubsetRandomSampler``, a class-balanced or curriculum sampler of the script, a bucketing
``batch_sampler``): every rank draws the wrapped sampler's whole sequence with the same seed and
keeps every N-th element, so the weighting and the order the script asked for hold on every rank
and the ranks' shares are disjoint draws of one sequence. ``ShareStream`` wraps an
``IterableDataset``: each rank keeps every N-th item of the stream.

Imports torch and the standard library only.
"""

from __future__ import annotations

import contextlib
import random
import sys
from typing import Any, Iterator, List, Optional

import torch


def _replicas_and_rank(num_replicas: Optional[int], index: Optional[int]) -> tuple:
    from . import rank, world_size  # the package's own functions (the process group, Horovod, the launcher)

    replicas = world_size() if num_replicas is None else int(num_replicas)
    me = rank() if index is None else int(index)
    if replicas < 1 or not 0 <= me < replicas:
        raise ValueError(f"distify.runtime: rank {me} is not in [0, {replicas})")
    return replicas, me


@contextlib.contextmanager
def _seeded(seed: int, generator: Any) -> Iterator[None]:
    """Run a draw from a known state and put every random state back afterwards: the sampler's own
    torch generator if it has one, else torch's default CPU generator, and Python's and NumPy's global
    ones (a sampler written in the script may draw from either). CUDA generators are not touched."""
    np = sys.modules.get("numpy")
    saved_py = random.getstate()
    saved_np = np.random.get_state() if np is not None else None
    own = isinstance(generator, torch.Generator)
    saved_gen = generator.get_state() if own else None
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        if np is not None:
            np.random.seed(seed % 2**32)
        if own:
            generator.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(saved_py)
            if np is not None:
                np.random.set_state(saved_np)
            if own:
                generator.set_state(saved_gen)


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

    def sequence(self) -> List[Any]:
        """The wrapped sampler's whole sequence for this pass, the same on every rank (counts a pass)."""
        epoch = self._passes if self.epoch is None else self.epoch
        self._passes += 1
        if self.seed is None:
            from . import broadcast_object

            seed = broadcast_object(int(torch.randint(0, 2**62, (), dtype=torch.int64)))
        else:
            seed = self.seed + epoch
        with _seeded(seed, getattr(self.sampler, "generator", None)):
            return list(self.sampler)

    def _share(self, drawn: List[Any]) -> List[Any]:
        replicas, me = _replicas_and_rank(self.num_replicas, self.rank)
        if self.drop_last:
            total = len(drawn) - len(drawn) % replicas
        else:
            total = -(-len(drawn) // replicas) * replicas
            while drawn and len(drawn) < total:
                drawn = drawn + drawn[: total - len(drawn)]
        return drawn[me:total:replicas]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._share(self.sequence()))

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
