"""DST204 batches drawn from the global random stream: a per-rank stream for each rank."""

from __future__ import annotations

import libcst as cst

from distify.syntax import dotted
from distify.training import global_draws, walked_permutation
from distify.rules.base import HOROVOD_BACKEND, Context, Rule
from distify.walk import walk


class DataRng(Rule):
    """Give each rank its own random stream when the batches are drawn without a DataLoader.

    What it does:
        Finds training loops that read no DataLoader and draw their data with ``torch.randint`` /
        ``torch.randperm`` (directly or in a function they call, like nanoGPT's ``get_batch``)
        from the global generator, or – when no DataLoader feeds training at all – generate the
        data itself with ``torch.randn`` / ``torch.rand`` / ``torch.normal`` (a regression on
        batches it makes, a GAN's real samples); beside a DataLoader, such a draw that is a model's
        whole input in the loop (a GAN generator's latent batch, ``netG(noise)``). Right before the first draw – once every model and optimizer
        of that function is built – it inserts
        ``torch.manual_seed(torch.initial_seed() + rank)``. Draws with ``numpy.random`` /
        ``random``, or set up in a way it cannot order, are reported instead.

    Why:
        Every rank runs the same script with the same seed (torch's default seed is a constant
        too), so every rank would draw the same offsets: N ranks do the work of one, silently.
        Re-seeding after the models are built keeps the initial weights identical on all ranks
        (DDP and Horovod also start every rank from rank 0's weights) and makes the data streams
        independent.

    Example:
        model = GPT(config).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        for it in range(max_iters):
            xb, yb = get_batch("train")   # torch.randint(len(data) - block_size, (batch_size,))

        becomes

        model = DDP(GPT(config).to(device), device_ids=runtime.device_ids())
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        # distify: the models are built; from here each rank draws its own batches
        torch.manual_seed(torch.initial_seed() + dist.get_rank())
        for it in range(max_iters):
            xb, yb = get_batch("train")
    """

    code = "DST204"
    name = "data-rng"
    summary = "give each rank its own random stream for batches drawn without a DataLoader"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        if not a.models:
            return
        done = set()
        for d in global_draws(a):
            if d.first_use in done:
                continue
            done.add(d.first_use)
            where = f" in {d.via.name.value}()" if d.via is not None else ""
            what = d.what
            if not (what or "").startswith("torch."):
                ctx.warn(
                    self.code, d.draw.call,
                    f"the training batches are drawn with {what}{where}, the same on every rank: seed it with "
                    "seed + rank once the models are built (or shard the data with a DataLoader)",
                )
                continue
            if _reseeded(a, d):
                continue
            setup = [m.assign for m in a.models] + [m.place for m in a.models] + [o.call.stmt for o in a.optimizers]
            tops = [(*a.stmt_parent.get(s, ()), s)[0] for s in setup]
            ordered = all(
                a.stmt_scope.get(s) is d.scope and (s is not d.first_use and a.is_before(s, d.first_use))
                for s in tops
            )
            if not ordered:
                ctx.warn(
                    self.code, d.draw.call,
                    f"the training batches are drawn with {what}{where} from the global generator, the same on "
                    "every rank; once the models are built, re-seed each rank: "
                    "torch.manual_seed(torch.initial_seed() + rank)",
                )
                continue
            torch_name = ctx.imported("torch", None, "torch")
            rank = f"{ctx.hvd}.rank()" if ctx.backend == HOROVOD_BACKEND else f"{ctx.dist}.get_rank()"
            ctx.edits.insert_before(
                d.first_use,
                ctx.stmts(
                    "# distify: the models are built; from here each rank draws its own batches\n"
                    f"{torch_name}.manual_seed({torch_name}.initial_seed() + {rank})\n"
                ),
            )
            ctx.report(
                self.code, d.draw.call,
                f"{what}{where} draws the batches: each rank re-seeded with initial_seed() + rank once the "
                "models are built",
            )
            if walked_permutation(d) is not None:
                # an epoch walks the permutation in slices: with a stream per rank, every rank walks a
                # whole permutation of its own, so a pass reads N times the data in as many steps as one
                # process took (the shards are neither disjoint nor a split of the data)
                ctx.warn(
                    self.code, d.draw.call,
                    f"each rank now walks its own {what} permutation of the whole data in every pass: a pass "
                    "reads world-size times the data in as many steps as one process took (no speed-up, and "
                    "an epoch is no longer one pass over the data); shard one permutation instead (the same "
                    "seed on every rank, perm[rank::world_size] and the batch loop over its length) or draw "
                    "the batches with a DataLoader",
                )


def _reseeded(a, d) -> bool:
    """A manual_seed(... rank ...) already runs in the loop's function before the first draw."""
    found = []

    class V(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if (dotted(node.func) or "").endswith("manual_seed") and any(a.reads_rank(x.value) for x in node.args):
                found.append(node)

    for stmt, scope in a.stmt_scope.items():
        if scope is d.scope and isinstance(stmt, cst.SimpleStatementLine) and a.is_before(stmt, d.first_use):
            walk(stmt, V())
    return bool(found)


RULE = DataRng()
