"""DST960 a training framework already distributes the script: left as it is, with how to launch it."""

from __future__ import annotations

import os

from distify.names import frameworks
from distify.rules.base import Context, Rule


class FrameworkDistributes(Rule):
    """Say which framework already distributes a script, and how to launch it on N processes.

    What it does:
        When the script trains through a framework that distributes it itself (Hugging Face
        Accelerate's ``Accelerator``, Lightning's ``Trainer`` or ``Fabric``, the Hugging Face
        ``Trainer``, ``deepspeed.initialize``, Ignite's ``idist``, Ray Train: the rows of
        ``distify.library``), the file is left byte for byte as it is, and distify says, without
        ``-v``, which framework it found (with the line) and the command that launches the script.

    Why:
        Such a framework shards the data, wraps the model and averages the gradients itself.
        Adding a ``DistributedSampler``, a ``DDP`` wrapper and ``init_process_group`` on top would
        split the data twice and wrap the model twice. The script is already ready for N processes:
        what it needs is the framework's own launcher.

    Example:
        accelerator = Accelerator()                 # DST960: distributed by Hugging Face Accelerate;
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
                                                    # launch with: accelerate launch train.py
    """

    code = "DST960"
    name = "framework-distributes"
    summary = "left unchanged: a training framework already distributes the script"

    def apply(self, ctx: Context) -> None:
        script = os.path.basename(ctx.plan.script_path or "train.py")
        said = set()
        for row, site in frameworks(ctx.anatomy.calls):
            if row.title in said:
                continue
            said.add(row.title)
            ctx.report(
                self.code,
                site.call,
                f"left unchanged: {row.title} already distributes this script (it shards the data and "
                f"averages the gradients itself); launch it with: {row.launch.format(script=script)}",
                kind="note",
            )


RULE = FrameworkDistributes()
