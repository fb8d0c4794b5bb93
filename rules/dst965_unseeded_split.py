"""DST965 a sharded training set made by a random draw the script never seeds: another split on every rank."""

from __future__ import annotations

from distify.anatomy import Anatomy
from distify.split_draws import foreign_draws, sharded_loaders, unseeded_splits
from distify.rules.base import AuditCheck, Context


class UnseededSplit(AuditCheck):
    """The dataset a DistributedSampler shards must be the same on every rank.

    What it does:
        Part of the output audit (and of ``distify lint``). Reports a random draw that makes the
        dataset of a training loader a DistributedSampler shards – directly or through the names
        and the script's functions it is built from: ``random_split`` without ``generator=``,
        ``random.shuffle`` of a file list, ``np.random.permutation`` indices, ``train_test_split``
        without ``random_state=`` – when the script never seeds that draw's generator; for a
        sampler of the script's own that DST901 shares out (``runtime.ShareSampler``), the indices
        it is given are followed too (``SubsetRandomSampler(train_idx)``), and so are the functions
        of the project's other modules the script calls for them (the call is reported with the
        draw's file and line). A migration gives each
        such draw a seed every rank shares first (DST208); a draw left unseeded in distify's own
        output (one that runs before the process group exists) refuses the file: exit 3, nothing
        written.

    Why:
        A DistributedSampler hands each rank every N-th index of the dataset that rank built. An
        unseeded generator is seeded from the OS in each process (torch 2.13, Python's ``random``,
        NumPy), so every rank splits or orders the data differently: the shards overlap, some
        samples are never trained on, and one rank's validation set holds another rank's training
        samples. The run trains and reports, wrongly, with no error.

    Example:
        train_ds, val_ds = random_split(full, [800, 200])   # DST965 in a DDP script
        train_loader = DataLoader(train_ds, sampler=DistributedSampler(train_ds))

        fix: random_split(full, [800, 200], generator=torch.Generator().manual_seed(runtime.shared_seed())),
        as DST208 writes (a new split every run, one on every rank), or a fixed seed
    """

    code = "DST965"
    name = "unseeded-split"
    summary = "audit: sharded dataset split by an unseeded random draw"
    # on distify's own output the shards would overlap and miss samples with no error (DST208 seeds
    # every draw it can): the file is refused (exit 3) instead of written
    refuses_own_output = True

    def check(self, ctx: Context, a: Anatomy) -> None:
        for draw, loader in unseeded_splits(a):
            where = f" of {loader.target}" if loader.target else ""
            ctx.warn(
                self.code,
                draw,
                f"{ctx.code(draw.func)}() makes the training set{where}, which the ranks shard, from a "
                "random generator the script never seeds: each rank draws another split, so the shards overlap and "
                "miss samples; seed it the same on every rank (generator=torch.Generator().manual_seed(seed), "
                "random_state=seed, or a seed call before the draw)",
            )
        for loader, shared in sharded_loaders(a):
            for f in foreign_draws(a, loader, shared, ctx.plan.script_path, ctx.options):
                ctx.warn(self.code, f.call, foreign_message(ctx, f, loader.target))


def foreign_message(ctx: Context, f, target) -> str:
    """What DST208 and DST965 say of a training set split in another module by an unseeded draw."""
    where = f" of {target}" if target else ""
    return (f"{ctx.code(f.call.func)}() makes the training set{where}, which the ranks shard, with {f.draw}() at "
            f"{f.where}, from a random generator the project never seeds: each rank draws another split, so the "
            "shards overlap and miss samples; seed that draw the same on every rank there "
            "(random.Random(seed), np.random.RandomState(seed), generator=torch.Generator().manual_seed(seed), "
            "random_state=seed)")


RULE = UnseededSplit()
