"""Does the training input depend on the rank? (part of the fact layer, see facts.py)

Data parallelism pays only when each rank trains on its own data. A script's training input differs
between ranks when a loader feeds its training loop (the rules shard every such loader, and the
audit checks it: DST951), or when the loop draws its batches or its data from a random stream that
differs between ranks: a seed call that reads the rank (``torch.manual_seed(seed + rank)``), or a
draw with a ``generator=`` of its own, or a script that never seeds (torch 2.13, ``random`` and
NumPy seed each process from the OS). Otherwise every rank computes the same step on the same
input: full-batch training on one graph, LBFGS over one tensor, batches generated from the global
stream the script seeds alike on every rank (``torch.manual_seed(0)``). Read-only; the audit asks it (DST959 for index draws, DST963 for the rest).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import libcst as cst

from distify.parallel import feeding_loaders
from distify.data_sources import foreign_loaders, untraced_sources
from distify.facts import training_call
from distify.syntax import all_nodes, arg
from distify.training import distribution_draw
from distify.values import Value

if TYPE_CHECKING:
    from distify.anatomy import Anatomy

# draws that pick which samples a batch holds
INDEX_DRAWS = frozenset({
    "torch.randint", "torch.randperm", "numpy.random.randint", "numpy.random.choice",
    "numpy.random.permutation", "random.sample", "random.randint", "random.choice", "random.randrange",
})
# draws that make the data itself (a generated batch, a synthetic regression target)
VALUE_DRAWS = frozenset({
    "torch.randn", "torch.rand", "torch.normal", "torch.bernoulli", "torch.multinomial",
    "numpy.random.randn", "numpy.random.rand", "numpy.random.normal", "numpy.random.uniform",
    "random.random", "random.gauss", "random.uniform", "random.shuffle",
})
SEEDS = frozenset({
    "torch.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "numpy.random.seed", "random.seed",
})


class TrainingInput(Value):
    """Whether the training input differs between ranks, and how (``training_input``)."""

    __slots__ = ("varies", "how", "node")
    varies: bool  # the input differs between ranks (or may: "unknown")
    how: str  # loader | per-rank seed | own generator | unseeded | unknown | no training loop | drawn alike | fixed
    node: Optional[cst.CSTNode]  # for drawn alike: the first draw; for fixed: the first training call

    def __init__(self, varies: bool, how: str, node: Optional[cst.CSTNode] = None) -> None:
        self._set(varies, how, node)


def seeded_per_rank(a: "Anatomy") -> bool:
    """Some seed call reads the rank: the global random streams differ between ranks."""
    return any(a.mentions_rank(c.call) for c in a.calls_to(SEEDS))


def training_draws(a: "Anatomy", names=INDEX_DRAWS | VALUE_DRAWS) -> List[cst.Call]:
    """The random draws of `names`, and of torch.distributions objects (a policy's
    `Categorical(probs).sample()`), on the training path (in a loop that trains, or a function it
    calls), in source order."""
    return [
        c.call for c in a.calls
        if (c.qualname in names or distribution_draw(a, c) is not None) and a.on_training_path(c.stmt)
    ]


def training_input(a: "Anatomy") -> TrainingInput:
    """What makes the training input of this script differ between ranks, if anything."""
    if feeding_loaders(a):
        return TrainingInput(True, "loader")
    draws = training_draws(a)
    if draws:
        if seeded_per_rank(a):
            return TrainingInput(True, "per-rank seed")
        alike = [d for d in draws if arg(d, None, "generator") is None]
        if not alike:
            return TrainingInput(True, "own generator")
        if not a.calls_to(SEEDS):
            # never seeded: torch (2.13), random and numpy seed each process from the OS
            return TrainingInput(True, "unseeded")
        return TrainingInput(False, "drawn alike", alike[0])
    if any(bl.trains for bl in a.batch_loops) or foreign_loaders(a) or untraced_sources(a):
        return TrainingInput(True, "unknown")  # batches from an iterable no fact traces: DST951's to report
    for loop in a.facts.training_loops():
        site = next((n for n in all_nodes(loop) if training_call(n)), None)
        return TrainingInput(False, "fixed", site if site is not None else loop)
    return TrainingInput(True, "no training loop")
