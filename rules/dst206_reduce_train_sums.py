"""DST206 sums over the training data that the script reads after the loop cover every rank."""

from __future__ import annotations

from typing import Set

import libcst as cst

from distify.rules.base import Context, Rule
from distify.sums import UNKNOWN, dict_sums, fed_only_by, first_read_after, list_sums, sharded_key, training_sums


class ReduceTrainSums(Rule):
    """Reduce across ranks the sums a training loop adds up and the script reads after it.

    What it does:
        For a training loop over a loader DST201 shards (or DST901/DST910 share out), finds the counters started from a number
        literal, or a tensor of one (``correct = torch.zeros(())``, ``torch.tensor(0.0)``), right
        before the loop, only added to inside it and read after it (an epoch's loss or accuracy
        printed, logged, returned or saved), and inserts one reduction right after the loop, by
        what each batch adds (``distify.sums``):

        - a per-sample sum (``running_loss += loss.item() * x.size(0)``, ``correct +=
          (pred == y).sum().item()``, ``total += y.size(0)``) is summed over the ranks: divided by
          ``len(train_loader.dataset)`` (the whole set) or by a summed count, it is the whole
          set's mean;
        - a per-batch mean (``running_loss += loss.item()`` of a loss that averages its batch) is
          averaged over the ranks: every rank runs as many batches, so divided by
          ``len(train_loader)`` (this rank's count of batches) it is the mean the single process
          reports at N times the batch.

        A list the loop appends one such value per batch to (``losses.append(loss.item())``, read
        after the loop as ``sum(losses) / len(losses)`` and handed to a scheduler) is reduced entry
        by entry (``runtime.reduce_each``): entry i becomes the value of the big batch the ranks'
        batches i make together. A dict of counters started right before the loop (``stats =
        {"loss": 0.0, "correct": 0}``, ``stats["correct"] += (pred == y).sum().item()``) is reduced
        entry by entry the same way, the summed entries in one call (``stats["loss"], stats["correct"]
        = runtime.all_reduce_sum(stats["loss"], stats["correct"])``); one the loop also reads, hands
        on or changes otherwise, or that keeps adding up after it, is left as it is with a warning
        (its figures are the rank's own). A counter also set, read or added to in another way inside the loop (a running loss printed
        and reset every k batches) is left as it is. The same holds for a loop that does not train
        over a loader DST201 shards (the accuracy on the training set measured after training by
        ``check_accuracy(train_loader, model)``): its sums are this rank's shard too.

    Why:
        Each rank adds up only its shard: printed on rank 0, an epoch's loss or accuracy would be
        rank 0's alone, and a value that steers training (a scheduler, early stopping) would differ
        between ranks. DistributedSampler pads the last shard with repeated samples when the set
        does not divide evenly, so a sum can count a few samples twice.

    Example:
        running_loss = 0.0
        for x, y in train_loader:
            ...
            running_loss += loss.item() * x.size(0)
        print(running_loss / len(train_loader.dataset))

        becomes

        running_loss = 0.0
        for x, y in train_loader:
            ...
            running_loss += loss.item() * x.size(0)
        running_loss = runtime.all_reduce_sum(running_loss)
        print(running_loss / len(train_loader.dataset))
    """

    code = "DST206"
    name = "reduce-train-sums"
    summary = "sum an epoch's training metrics over the ranks"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        done: Set[int] = set()
        sharded = [*ctx.plan.samplers, *ctx.plan.shared]  # DistributedSampler, ShareSampler, ShareStream
        for loader in sharded:
            for bl in loader.batch_loops:
                if bl.via != "for" or id(bl.loop) in done:
                    continue
                done.add(id(bl.loop))
                keyed = None
                if not fed_only_by(a, bl, sharded):
                    keyed = sharded_key(a, bl, sharded)  # `loaders[phase]`: the training key's pass only
                    if keyed is None:
                        continue  # a loader that stays whole reaches it too: its sums are whole already
                entries, odd = dict_sums(a, bl.loop, bl.scope)
                sums = [*training_sums(a, bl.loop, bl.scope), *entries]
                for s in [s for s in sums if s.kind == UNKNOWN]:
                    read = first_read_after(a, s.holder, bl.loop, bl.scope)
                    ctx.warn(self.code, s.node, f"`{s.name}` adds up, over this rank's shard only, terms distify cannot "
                             "tell for per-sample sums or batch means: what the script reads after the loop (line "
                             f"{a.position(read)[0]}) is this rank's figure; reduce it after the loop with "
                             f"runtime.all_reduce_sum({s.name}) or runtime.reduce_mean({s.name})")
                for holder, node, why in odd:
                    read = first_read_after(a, holder, bl.loop, bl.scope)
                    ctx.warn(self.code, node, f"`{holder}` adds up sums over this rank's shard only, and distify does "
                             f"not reduce them: {why}. What the script reads from it after the loop (line "
                             f"{a.position(read)[0]}) is this rank's figure; reduce its entries after the loop with "
                             "runtime.all_reduce_sum or runtime.reduce_mean")
                per_rank = {s.holder for s in sums if s.kind == UNKNOWN}  # a dict with one such entry stays per rank
                sums = [s for s in sums if s.kind != UNKNOWN]
                lists = list_sums(a, bl.loop, bl.scope)
                if not sums and not lists:
                    continue
                stmts = []
                summed = [s.name for s in sums if s.kind == "sample"]
                averaged = [s.name for s in sums if s.kind == "batch"]
                if summed:
                    names = ", ".join(summed)
                    stmts.append(f"{names} = {ctx.runtime}.all_reduce_sum({names})")
                for name in averaged:
                    stmts.append(f"{name} = {ctx.runtime}.reduce_mean({name})")
                for s in lists:
                    op = ", \"sum\"" if s.kind == "sample" else ""
                    stmts.append(f"{s.name} = {ctx.runtime}.reduce_each({s.name}{op})")
                each = [s.name for s in lists]
                if keyed is not None:
                    stmts = [f"if {keyed[0]} == \"{keyed[1]}\":"] + ["    " + s for s in stmts]
                ctx.edits.insert_after(bl.loop, ctx.stmts("\n".join(stmts)))
                # the names alike on every rank after it: a dict of counters by its own name (`stats`)
                reduced = {s.holder: None for s in [*sums, *lists] if s.holder not in per_rank}
                ctx.plan.reduced.extend((bl.scope, n, bl.loop) for n in reduced)
                if isinstance(bl.scope, cst.FunctionDef):
                    ctx.gains_collective(bl.scope)  # `print(train(...))` must now run on every rank
                parts = [
                    f"{', '.join(names)} {how}"
                    for names, how in (
                        (summed, "summed"),
                        (averaged, "(a sum of batch means) averaged"),
                        (each, "(one entry per batch) reduced entry by entry"),
                    )
                    if names
                ]
                what = "the training loop" if bl.trains else "this loop over the training data"
                if keyed is not None:
                    what += f" on its pass over {bl.ref}[\"{keyed[1]}\"] (the only sharded key)"
                padded = "" if bl.trains else (
                    " (DistributedSampler repeats up to N-1 samples to even the shards: they are counted twice)"
                )
                ctx.report(
                    self.code,
                    bl.loop,
                    f"{' and '.join(parts)} over all ranks after {what}: what the script reports covers every "
                    f"rank's shard{padded}",
                )


RULE = ReduceTrainSums()
