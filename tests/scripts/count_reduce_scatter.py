"""Run a training script counting FSDP2's gradient reduce-scatters: `python count_reduce_scatter.py OUT SCRIPT ARGS...`.

FSDP2 reduces every sharded group's gradients with ``torch.distributed.reduce_scatter_single``
(looked up on the module at call time, so patching the module attribute sees every call); every
optimizer step is counted too. At exit each rank writes its counts to OUT/rank<R>.json.
"""
import json
import os
import runpy
import sys

import torch
import torch.distributed as dist

out_dir, script, *args = sys.argv[1:]
counts = {"reduce_scatter": 0, "steps": 0}
real_reduce_scatter = dist.reduce_scatter_single


def reduce_scatter_single(*a, **kw):
    counts["reduce_scatter"] += 1
    return real_reduce_scatter(*a, **kw)


dist.reduce_scatter_single = reduce_scatter_single

# each class's own step() once: AdamW inherits Adam's on some torch versions, and patching it twice
# counted every AdamW step twice
for cls in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
    if "step" not in vars(cls):
        continue
    original = cls.step

    def step(self, *a, _original=original, **kw):
        counts["steps"] += 1
        return _original(self, *a, **kw)

    cls.step = step

sys.argv = [script, *args]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", 0))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(counts, f)
