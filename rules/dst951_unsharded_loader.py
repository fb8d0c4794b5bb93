"""DST951 a loader that feeds training without a distributed sampler."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import Anatomy
from distify.data_sources import foreign_loaders, untraced_sources, is_iterable_dataset, resharded_at_its_calls, switched_on
from distify.syntax import dotted
from distify.parallel import feeding_loaders, sampler_of
from distify.rules.base import AuditCheck, Context
from distify.helper_effects import loaders_handed_to_training


class UnshardedLoader(AuditCheck):
    """Every loader whose batches reach training must give each rank its own shard.

    What it does:
        Part of the output audit (and of ``distify lint``). In a distributed script, reports each
        DataLoader iterated by a loop that reaches ``backward()`` or an optimizer ``step()`` –
        directly, zipped with another loader, through a progress bar, a dict of loaders by phase
        or a function parameter – that has neither a ``sampler=`` nor a ``batch_sampler=`` and
        whose dataset is not already split by rank. Loaders over an ``IterableDataset`` are left
        to DST910 (they split inside the dataset). In distify's own output, also a training loader
        built by a function of another module that is not passed through ``runtime.shard_loader``
        (and whose sampler the script never gives an epoch, which would say that module shards it),
        and a training loop whose batches distify cannot trace to any loader at all: a call of an
        unknown function iterated in place (``for x, y in utils.get_loader(...)``), an endless
        generator fed such a call, a collection the script builds itself.

    Why:
        Without a distributed sampler every rank reads the whole dataset in the same order: N
        processes do the work of one, each epoch is N times longer than it should be, and the
        result is the single-process run at N times the batch size, not N times the data.

    Example:
        train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
        for x, y in train_loader:          # DST951 in a DDP script
            ...

        fix: train_loader = DataLoader(train_set, batch_size=64, sampler=DistributedSampler(train_set))
    """

    code = "DST951"
    name = "unsharded-loader"
    summary = "audit: a training loader every rank reads whole"

    def check(self, ctx: Context, a: Anatomy) -> None:
        feeding = feeding_loaders(a)
        for loader in feeding:
            has_sampler, _ = sampler_of(a, loader)
            if has_sampler or is_iterable_dataset(ctx.anatomy, loader) or resharded_at_its_calls(a, loader):
                continue
            if loader.dataset is not None and a.mentions_rank(loader.dataset):
                continue  # split by hand: Subset(ds, range(rank, len(ds), world)), split_dataset_by_node
            name = loader.target or "this DataLoader"
            ctx.warn(
                self.code,
                loader.call.call,
                f"{name} feeds a training loop but has no distributed sampler: every rank reads "
                "the whole dataset; pass sampler=DistributedSampler(dataset) and call its set_epoch(epoch) each epoch",
            )
        if a.migrated_by_distify or ctx.plan.distify_output:
            # distify's output (a Horovod one imports no runtime): what another module builds, or
            # what no fact traces, was not sharded by distify; a hand-written script may shard it there
            self._foreign(ctx, a)
            self._untraced(ctx, a)
        self._handed(ctx, a, feeding, own=a.migrated_by_distify or ctx.plan.distify_output)

    def _handed(self, ctx: Context, a: Anatomy, feeding, own: bool) -> None:
        """A loader of the script handed to a function of the project that trains
        (``simclr.train(train_loader)``, read through the program model) must be sharded like one the
        script's own loops read: in distify's output (`own`) always, in a script distributed by hand
        when a training loop of that function iterates the parameter the loader binds."""
        seen = set()
        for loader, call, target, direct in loaders_handed_to_training(a, ctx.plan.script_path, ctx.options):
            if not (own or direct):
                continue  # the helper may build its own sharded loader from it
            if loader in feeding or id(loader) in seen or sampler_of(a, loader)[0] or is_iterable_dataset(a, loader):
                continue
            seen.add(id(loader))
            ctx.warn(
                self.code,
                loader.call.call,
                f"{loader.target or 'this DataLoader'} is handed to {target.qualname.rsplit('.', 1)[-1]}() "
                f"({target.where}), which trains on it, but has no distributed sampler: every rank reads "
                "the whole dataset; pass sampler=DistributedSampler(dataset) and call its set_epoch(epoch) each epoch",
            )

    def _untraced(self, ctx: Context, a: Anatomy) -> None:
        """distify's output: a training loop whose batches no fact traces to a loader (a call of an
        unknown function iterated in place, a generator fed one, a collection of the script's own)
        is reported rather than trusted: nothing in the output shards it."""
        for u in untraced_sources(a):
            source = ctx.code(u.source)
            if len(source) > 48 and isinstance(u.source, cst.Call):
                source = f"{ctx.code(u.source.func)}(...)"
            ctx.warn(
                self.code,
                u.source,
                f"this training loop's batches come from {source}, which distify cannot trace to a "
                "DataLoader it shards: every rank may read all of it; bind the loader to a name and add "
                "<loader> = runtime.shard_loader(<loader>) (with <loader>.sampler.set_epoch(epoch) each pass), "
                "or give it a DistributedSampler where it is built",
            )

    def _foreign(self, ctx: Context, a: Anatomy) -> None:
        """distify's output: a training loader another module builds must pass through
        ``runtime.shard_loader`` (DST201), unless the script treats it as sharded already (it calls
        ``<loader>.sampler.set_epoch``: the module gives it a DistributedSampler)."""
        told = {
            dotted(c.call.func.value)
            for c in a.calls
            if isinstance(c.call.func, cst.Attribute) and c.call.func.attr.value == "set_epoch"
        }
        for f in foreign_loaders(a):
            if f.resharded or switched_on(a, f.call) or {f"{f.name}.sampler", f"{f.loop.ref}.sampler"} & told:
                continue
            ctx.warn(
                self.code,
                f.call.call,
                f"{f.name} feeds a training loop but is built by {f.builder}() in another module and not "
                f"re-sharded here: every rank reads all of it; add {f.name} = runtime.shard_loader({f.name}) "
                "after it, or give it a DistributedSampler where it is built",
            )


RULE = UnshardedLoader()
