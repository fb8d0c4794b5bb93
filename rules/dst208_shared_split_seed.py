"""DST208 a training set split by an unseeded random draw: the same split on every rank, from one shared seed."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from distify.library import SPLIT_DRAWS
from distify.records import INIT_PG
from distify.split_draws import foreign_draws, loader_draws
from distify.rules.base import Context, Rule, add_kwarg

_DEPTH = 4


class SharedSplitSeed(Rule):
    """Seed the random draw a sharded training set is split by with one seed all ranks share.

    What it does:
        For each training loader the migration shards (DST201's DistributedSampler, or DST901's
        ``runtime.ShareSampler`` around the script's own sampler), follows its dataset – and the
        indices of a sampler shared out (``SubsetRandomSampler(train_idx)``) – through the names
        and the script's functions it is built from to the draws that split or order it, when the
        script never seeds that draw's generator (``distify.split_draws``; which draws, and how each
        takes a seed, is ``library.SPLIT_DRAWS``). Each such draw gets ``runtime.shared_seed()``, a
        seed rank 0 draws fresh from the OS and every rank receives:
        ``random_split(full, lens)`` and ``torch.randperm(n)`` get
        ``generator=torch.Generator().manual_seed(runtime.shared_seed())``, ``train_test_split(...)``
        gets ``random_state=runtime.shared_seed()``, and ``random.shuffle(files)`` /
        ``random.sample(...)`` / ``np.random.permutation(n)`` (``choice``, ``shuffle``) become the same
        method of a generator of their own, ``random.Random(runtime.shared_seed()).shuffle(files)`` /
        ``np.random.RandomState(runtime.shared_seed()).permutation(n)``: the same arguments and the
        same kind of result, and the global stream is left as it was. A draw that may run before the
        process group exists, on some ranks only, or with ``*args`` / ``**kwargs`` that may carry its
        seed is left as it is with a warning, and the audit (DST965) then refuses the file; a draw
        in a function of another module of the project (``train_set = make_sets(64)`` from
        ``data.py``) refuses the file with that module's line, since distify does not rewrite it.

    Why:
        A DistributedSampler hands each rank every N-th index of the dataset that rank built. An
        unseeded generator is seeded from the OS in each process (torch, Python's ``random``,
        NumPy), so every rank would split or order the data differently: the shards would overlap,
        some samples would never be trained on, and one rank's validation set would hold another
        rank's training samples, with no error. A constant seed would make every run split alike,
        which the script did not do; one fresh seed shared by the ranks splits one way per run, as
        the single process did (under plain ``python`` it is just a fresh seed).

    Example:
        train_ds, val_ds = random_split(full, [800, 200])

        becomes

        train_ds, val_ds = random_split(full, [800, 200], generator=torch.Generator().manual_seed(runtime.shared_seed()))
    """

    code = "DST208"
    name = "shared-split-seed"
    summary = "seed an unseeded split of the sharded training set with one seed all ranks share"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        done: set = set()
        shared = list(ctx.plan.shared)
        for loader in [*ctx.plan.samplers, *shared]:
            if getattr(loader, "call", None) is None:
                continue
            for draw in loader_draws(a, loader, loader in shared, done):
                why = _unsafe(ctx, draw)
                if why is not None:
                    ctx.warn(self.code, draw,
                             f"{ctx.code(draw.func)}() splits the training set the ranks shard from an unseeded "
                             f"generator, and {why}: not given a seed all ranks share; seed it the same on every "
                             "rank by hand (generator=torch.Generator().manual_seed(seed), random_state=seed, or a "
                             "seed call before the draw)")
                    continue
                self._seed(ctx, draw)
            for f in foreign_draws(a, loader, loader in shared, ctx.plan.script_path, ctx.options):
                ctx.block(self.code, f.call,
                          f"{ctx.code(f.call.func)}() makes the training set the ranks shard with {f.draw}() at "
                          f"{f.where}, from a generator the project never seeds: each rank would shard another "
                          "split, and distify does not rewrite that module: not migrated; seed that draw the "
                          "same on every rank there (random.Random(seed), np.random.RandomState(seed), "
                          "generator=torch.Generator().manual_seed(seed), random_state=seed)")

    def _seed(self, ctx: Context, draw: cst.Call) -> None:
        row = SPLIT_DRAWS[ctx.anatomy.qualname(draw.func)]
        seed = f"{ctx.runtime}.shared_seed()"
        if row.how == "local":
            module, _, cls = row.local.rpartition(".")
            top, _, rest = module.partition(".")
            owner = ctx.imported(top, None, {"numpy": "np"}.get(top, top)) + (f".{rest}" if rest else "")
            method = row.name.rpartition(".")[2]
            func = cst.parse_expression(f"{owner}.{cls}({seed}).{method}")
            ctx.edits.replace(draw, lambda n, func=func: n.with_changes(func=func))
            given = f"{owner}.{cls}({seed}).{method}(...)"
        else:
            value = seed if row.how == "seed" else f"{ctx.imported('torch', None, 'torch')}.Generator().manual_seed({seed})"
            expr = cst.parse_expression(value)
            ctx.edits.replace(draw, lambda n, kw=row.keyword, expr=expr: add_kwarg(n, kw, expr))
            given = f"{row.keyword}={value}"
        ctx.report(self.code, draw,
                   f"{ctx.code(draw.func)}() splits the training set the ranks shard from an unseeded generator: "
                   f"now {given}, a seed rank 0 draws and every rank shares, so every rank shards the same split "
                   "(and every run draws a new one, as before)")


def _unsafe(ctx: Context, draw: cst.Call) -> Optional[str]:
    """Why the shared seed cannot be put into `draw` (a collective every rank must reach after the
    process group exists), or None."""
    if any(x.star for x in draw.args):
        return "its *args / **kwargs may carry a seed of their own"
    a = ctx.anatomy
    site = next((c for c in a.calls if c.call is draw), None)
    if site is None:
        return "distify cannot tell where it runs"
    return _placement(ctx, site, 0)


def _placement(ctx: Context, site, depth: int) -> Optional[str]:
    a = ctx.anatomy
    if a.facts.call_on_some_ranks(site):
        return "it runs on some ranks only (a collective there would hang the others)"
    anchor = ctx.plan.setup_anchor
    strict = False
    if anchor is None:
        inits = a.calls_to({"horovod.torch.init", *INIT_PG})
        anchor, strict = (inits[0].stmt, True) if inits else (None, False)
    if anchor is None:
        return "no process group is set up before it"
    scope, home = site.scope, a.stmt_scope.get(anchor)
    if scope is home:
        after = a.is_before(anchor, site.stmt) or (site.stmt is anchor and not strict)
        return None if after else "it runs before the process group exists"
    if not isinstance(scope, cst.FunctionDef):
        return "it runs at module level, before the process group exists"
    callers = a.facts.callers(scope)
    if not callers or depth >= _DEPTH:
        return "it may run before the process group exists"
    for c in callers:
        why = _placement(ctx, c, depth + 1)
        if why is not None:
            return why
    return None


RULE = SharedSplitSeed()
