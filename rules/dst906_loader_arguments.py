"""DST906 DataLoader arguments distify cannot rewrite safely."""

from __future__ import annotations

from distify.syntax import arg
from distify.rules.base import Context, Rule


class LoaderArguments(Rule):
    """Warn about a training DataLoader whose arguments cannot be rewritten safely.

    What it does:
        Reports training loaders built with ``*args``, more than one ``**kwargs``, more than
        three positional arguments, or a dataset distify cannot find; they stay unchanged.

    Why:
        The sampler needs the dataset and the loader's ``shuffle`` value, and the loader must not
        receive ``shuffle`` and ``sampler`` together. When they hide in unpacked arguments the
        rewrite could pass both or drop one.

    Example:
        DataLoader(*loader_args)   # DST906: pass sampler=DistributedSampler(ds) yourself
    """

    code = "DST906"
    name = "loader-arguments"
    summary = "training DataLoader arguments not rewritable"

    def apply(self, ctx: Context) -> None:
        for loader in ctx.anatomy.loaders:
            call = loader.call.call
            if loader.role != "train":
                continue
            if ctx.anatomy.sampler_call(loader) is not None or arg(call, 5, "sampler") is not None or arg(call, 6, "batch_sampler") is not None:
                continue
            positional = [x for x in call.args if x.keyword is None and not x.star]
            splats = [x for x in call.args if x.star == "**"]
            if loader.dataset is None or len(positional) > 3 or len(splats) > 1 or any(x.star == "*" for x in call.args):
                ctx.warn(
                    self.code,
                    call,
                    "training DataLoader arguments are unpacked or positional beyond shuffle: not sharded; "
                    "pass sampler=DistributedSampler(dataset) yourself",
                )


RULE = LoaderArguments()
