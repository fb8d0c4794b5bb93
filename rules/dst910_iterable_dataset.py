"""DST910 IterableDataset loaders are not sharded automatically."""

from __future__ import annotations

from distify.data_sources import is_iterable_dataset
from distify.rules.base import Context, Rule


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
            if loader.role == "train" and is_iterable_dataset(ctx.anatomy, loader):
                ctx.warn(
                    self.code,
                    loader.call.call,
                    "DataLoader over an IterableDataset: not sharded; make __iter__ skip by runtime.rank()/world_size()",
                )


RULE = IterableDatasetAdvisory()
