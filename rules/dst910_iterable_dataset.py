"""DST910 a training DataLoader over an IterableDataset: each rank reads its share of the stream."""

from __future__ import annotations

from distify.data_sources import is_iterable_dataset, reads_shared_stream, splits_itself
from distify.rules.base import Context, Rule


class IterableDatasetShare(Rule):
    """Give each rank its share of a training DataLoader's ``IterableDataset``.

    What it does:
        Wraps the stream in ``runtime.ShareStream``: of every N consecutive items each rank keeps
        its own (the rank-th), and a last group of fewer than N items is left out, so every rank
        makes the same number of steps. In DataLoader workers each worker's stream is shared out
        the same way, so a dataset that splits itself among its workers
        (``torch.utils.data.get_worker_info()``) keeps doing so. A stream whose class in this file
        asks for the rank or the world size already chooses its own share: it is left as it is,
        with a warning. DST201 adds no sampler to it.

    Why:
        A DataLoader over an IterableDataset takes no sampler (and the stream may have no length to
        split by). Unshared, every rank trains on the same items and N processes do the work of
        one; dealt out item by item, as ``split_dataset_by_node`` and sharding filters do, the ranks
        together read the stream once, in its order.

    Example:
        loader = DataLoader(TokenStream(files), batch_size=32)

        becomes

        loader = DataLoader(runtime.ShareStream(TokenStream(files)), batch_size=32)
    """

    code = "DST910"
    name = "iterable-dataset"
    summary = "each rank reads its share of a training loader's IterableDataset"

    def apply(self, ctx: Context) -> None:
        for loader in ctx.anatomy.loaders:
            if loader.role != "train" or not is_iterable_dataset(ctx.anatomy, loader):
                continue
            if reads_shared_stream(ctx.anatomy, loader):
                continue  # an earlier run's share
            if splits_itself(ctx.anatomy, loader.dataset):
                ctx.warn(
                    self.code,
                    loader.call.call,
                    "the IterableDataset asks for the rank itself: assumed to yield this rank's share; left as it is",
                )
                continue
            ctx.edits.call_around(loader.dataset, f"{ctx.runtime}.ShareStream")
            ctx.plan.shared.append(loader)
            ctx.report(
                self.code,
                loader.call.call,
                f"{loader.target or 'the training DataLoader'} reads its share of the IterableDataset "
                "(runtime.ShareStream: every N-th item, per worker; a last incomplete group is left out)",
            )


RULE = IterableDatasetShare()
