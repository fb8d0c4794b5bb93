"""Run a training script under counters of its communication (used by p3_comm.py, one per rank).

    torchrun ... bench/_p3_probe.py OUT_JSON_PREFIX SCRIPT [script args...]

Counts, without changing the script: DDP gradient all-reduces (a comm hook on every
DistributedDataParallel model: one call per bucket, and the bucket's bytes), explicit
``torch.distributed`` collectives called from Python, and optimizer steps (a global step hook).
"""

import json
import os
import runpy
import sys
import traceback
from collections import Counter

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook

C = Counter()
CALLERS = Counter()
IN_HOOK = [False]  # the hook's own all_reduce is not an 'explicit' collective
PARAM_BYTES = []


def _hook(state, bucket):
    buf = bucket.buffer()
    C["ddp_allreduce_calls"] += 1
    C["ddp_allreduce_bytes"] += buf.numel() * buf.element_size()
    IN_HOOK[0] = True
    try:
        return default_hooks.allreduce_hook(None, bucket)
    finally:
        IN_HOOK[0] = False


_init = DistributedDataParallel.__init__


def _ddp_init(self, *a, **k):
    _init(self, *a, **k)
    PARAM_BYTES.append(sum(p.numel() * p.element_size() for p in self.module.parameters() if p.requires_grad))
    self.register_comm_hook(None, _hook)


DistributedDataParallel.__init__ = _ddp_init

for name in ("all_reduce", "broadcast", "all_gather", "reduce", "barrier", "all_gather_object", "broadcast_object_list"):
    fn = getattr(dist, name, None)
    if fn is None:
        continue

    def wrapped(*a, _fn=fn, _name=name, **k):
        if IN_HOOK[0]:
            return _fn(*a, **k)
        C[f"explicit_{_name}"] += 1
        caller = traceback.extract_stack(limit=2)[0]
        CALLERS[f"{_name} from {os.path.basename(caller.filename)}:{caller.lineno} {caller.name}"] += 1
        return _fn(*a, **k)

    setattr(dist, name, wrapped)

register_optimizer_step_post_hook(lambda opt, a, k: C.update(optimizer_steps=1))

out, script = sys.argv[1], sys.argv[2]
sys.argv = [script] + sys.argv[3:]
rank = os.environ.get("RANK", "0")
try:
    runpy.run_path(script, run_name="__main__")
finally:
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump({"counts": dict(C), "param_bytes": PARAM_BYTES, "callers": dict(CALLERS)}, f)
