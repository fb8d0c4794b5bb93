"""DST910 IterableDataset loaders are not sharded automatically."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import dotted
from distify.rules.base import Context, Rule

ITERABLE = {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}


class IterableDatasetAdvisory(Rule):
    """Warn about a training DataLoader over an ``IterableDataset``; it is left unsharded.

    What it does:
        Reports the loader; DST201 adds no sampler to it.

    Why:
        A DataLoader over an IterableDataset takes no sampler (and the dataset has no length to
        shard by): the stream itself must yield a different part on each rank, e.g. by skipping
        items with ``itertools.islice(stream, runtime.rank(), None, runtime.world_size())`` in
        ``__iter__`` (and per DataLoader worker). Unsharded, every rank trains on the same items.

    Example:
        loader = DataLoader(TokenStream(files), batch_size=32)   # DST910: shard in __iter__
    """

    code = "DST910"
    name = "iterable-dataset"
    summary = "IterableDataset loader not sharded automatically"

    def apply(self, ctx: Context) -> None:
        for loader in ctx.anatomy.loaders:
            if loader.role == "train" and is_iterable_dataset(ctx, loader):
                ctx.warn(
                    self.code,
                    loader.call.call,
                    "DataLoader over an IterableDataset: not sharded; make __iter__ skip by runtime.rank()/world_size()",
                )


def iterable_classes(ctx: Context) -> set:
    """Classes of the module deriving (directly or through each other) from IterableDataset."""
    a = ctx.anatomy
    found = set()
    changed = True
    while changed:
        changed = False
        for name, cls in a.classes.items():
            if name in found:
                continue
            for base in cls.bases:
                if a.qualname(base.value) in ITERABLE or dotted(base.value) in found:
                    found.add(name)
                    changed = True
    return found


def is_iterable_dataset(ctx: Context, loader) -> bool:
    ds = loader.dataset
    if ds is None:
        return False
    names = iterable_classes(ctx)
    if isinstance(ds, cst.Call):
        return dotted(ds.func) in names
    name = dotted(ds)
    if name is None:
        return False
    for stmt in ctx.anatomy.stmt_parent:
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign):
            small = stmt.body[0]
            if any(dotted(t.target) == name for t in small.targets) and isinstance(small.value, cst.Call):
                if dotted(small.value.func) in names:
                    return True
    return False


RULE = IterableDatasetAdvisory()
