"""A migrated-style DDP training script for the fault tests (tests/test_runtime_faults.py).

    python train_fault.py [--fail-rank R] [--fail-step S] [--steps N] [--hold-file PATH]

Initialises the process group through the shim exactly as distify's output does, trains a tiny
model with DDP on CPU (gloo) and:
* ``--fail-rank R --fail-step S``: rank R raises at step S (the other ranks block in the gradient
  all-reduce of that step: the launcher must tear the job down, not hang);
* ``--hold-file PATH``: prints ``TRAINING pid=<pid>`` once the group is up and keeps training
  (one all-reduced step at a time) until PATH exists or 60 s have passed, so that a test can look
  at the sockets of a process in the middle of its training loop.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distify import runtime

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-step", type=int, default=3)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--hold-file", default=None)
args = parser.parse_args()

dist.init_process_group(**runtime.init_kwargs())
device = runtime.device()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1).to(device), device_ids=runtime.device_ids())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def step():
    x = torch.randn(16, 8, device=device)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()  # gradient all-reduce: blocks until every rank takes part
    optimizer.step()
    return loss.item()


if args.hold_file:
    print(f"TRAINING pid={os.getpid()} rank={dist.get_rank()} world={dist.get_world_size()}", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(args.hold_file) and time.monotonic() < deadline:
        step()
        time.sleep(0.02)
    print("DONE", flush=True)
    sys.exit(0)

for i in range(args.steps):
    if dist.get_rank() == args.fail_rank and i == args.fail_step:
        raise RuntimeError(f"injected failure on rank {args.fail_rank} at step {i}")
    step()
    if runtime.is_main_process():
        print(f"step {i}", flush=True)
print(f"rank {dist.get_rank()} finished", flush=True)
