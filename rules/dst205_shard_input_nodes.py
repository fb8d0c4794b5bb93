"""DST205 neighbour-sampling loaders read this rank's seed nodes."""

from __future__ import annotations

import libcst as cst

from distify.anatomy import Anatomy
from distify.records import CallSite, assigned_name
from distify.syntax import arg
from distify.names import library_calls, seeds_sharded
from distify.rules.base import HOROVOD_BACKEND, Context, Rule


class ShardInputNodes(Rule):
    """Give a neighbour-sampling loader that feeds training this rank's part of its seed nodes.

    What it does:
        For a loader the library table shards through its seed nodes (PyG's ``NeighborLoader``,
        ``HGTLoader``) whose batches reach a training loop, wraps its ``input_nodes`` in
        ``runtime.shard_nodes(...)``: each rank samples the subgraphs of its own ``ceil(n / N)``
        seed nodes (a boolean mask or an index tensor, also ``(node_type, nodes)``).

    Why:
        Such a loader is a ``DataLoader`` subclass over node indices that builds its own sampler: no
        ``DistributedSampler`` can be handed to it, and ``runtime.shard_loader`` refuses subclasses.
        Without a split of the seed nodes every rank trains on every node. Equal shard sizes keep
        every rank at the same number of steps, which DDP's gradient averaging requires.

    Example:
        loader = NeighborLoader(data, num_neighbors=[10, 5], input_nodes=data.train_mask, shuffle=True)

        becomes

        loader = NeighborLoader(data, num_neighbors=[10, 5], input_nodes=runtime.shard_nodes(data.train_mask), shuffle=True)
    """

    code = "DST205"
    name = "shard-input-nodes"
    summary = "shard the seed nodes of neighbour-sampling loaders"

    def apply(self, ctx: Context) -> None:
        a = ctx.anatomy
        for row, site in library_calls(a.calls, "loader", shard="input_nodes"):
            if not _feeds_training(a, site):
                continue
            nodes = arg(site.call, 2, "input_nodes")
            title = row.name.rsplit(".", 1)[-1]
            if nodes is None or nodes.star or (isinstance(nodes.value, cst.Name) and nodes.value.value == "None"):
                ctx.warn(
                    self.code, site.call,
                    f"this {title} seeds from every node (no input_nodes): every rank would train on all of them; "
                    f"pass input_nodes={ctx.runtime}.shard_nodes(torch.arange(data.num_nodes))",
                )
                continue
            if seeds_sharded(site):
                continue  # distify's own output, run again
            if ctx.options.standalone:
                ctx.warn(self.code, site.call, f"--standalone: {title}'s input_nodes not sharded; pass this rank's part of them")
                continue
            extra = f", num_replicas={ctx.hvd}.size(), rank={ctx.hvd}.rank()" if ctx.backend == HOROVOD_BACKEND else ""
            value = cst.parse_expression(f"{ctx.runtime}.shard_nodes({ctx.code(nodes.value)}{extra})")
            ctx.edits.replace(nodes.value, lambda n, value=value: value)
            ctx.report(self.code, site.call, f"{title} samples from this rank's part of its input_nodes ({ctx.runtime}.shard_nodes)")


def _feeds_training(a: Anatomy, site: CallSite) -> bool:
    """The loader is bound to a name a training batch loop of the same scope iterates."""
    name = assigned_name(site.stmt, site.call)
    return name is not None and any(bl.trains and bl.ref == name and bl.scope is site.scope for bl in a.batch_loops)


RULE = ShardInputNodes()
