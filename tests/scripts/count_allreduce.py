"""Run a training script with a counting DDP comm hook: `python count_allreduce.py OUT SCRIPT ARGS...`.

Every DistributedDataParallel gets a comm hook that counts gradient-bucket all-reduces and their
bytes; every optimizer step is counted too. At exit each rank writes its counts to OUT/rank<R>.json.
"""
import json
import os
import runpy
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

out_dir, script, *args = sys.argv[1:]
counts = {"allreduce": 0, "bytes": 0, "steps": 0, "param_bytes": 0}


def counting_hook(state, bucket):
    counts["allreduce"] += 1
    buffer = bucket.buffer()
    counts["bytes"] += buffer.numel() * buffer.element_size()
    return allreduce_hook(None, bucket)


real_init = DistributedDataParallel.__init__


def init(self, *a, **kw):
    real_init(self, *a, **kw)
    counts["param_bytes"] += sum(p.numel() * p.element_size() for p in self.parameters() if p.requires_grad)
    self.register_comm_hook(None, counting_hook)


DistributedDataParallel.__init__ = init

real_step = torch.optim.Optimizer.step if hasattr(torch.optim.Optimizer, "step") else None
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
