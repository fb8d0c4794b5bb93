"""Uses distify.runtime exactly as a migrated DDP script does, then reduces a rank-dependent value.

Prints one line per rank:  rank=R world=W local=L main=M sum=S mean=A max=X tensor=T1,T2
"""
import sys

import torch
import torch.distributed as dist

from distify import runtime

dist.init_process_group(**runtime.init_kwargs())
device = runtime.device()
r, w = runtime.rank(), runtime.world_size()

value = runtime.all_reduce(r + 1)  # 1 + 2 + ... + w
mean = runtime.reduce_mean(float(r))  # (0 + 1 + ... + w-1) / w
biggest = runtime.all_reduce(r, "max")
src = torch.tensor([float(r), 10.0 * (r + 1)], device=device)
out = runtime.all_reduce(src)
assert src.tolist() == [float(r), 10.0 * (r + 1)], "all_reduce mutated its input"

model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1).to(device),
                                                  device_ids=runtime.device_ids())
assert type(runtime.unwrap(model)) is torch.nn.Linear

# one write() per line: print() writes the text and the newline separately, and two ranks sharing
# torchrun's stdout pipe could then interleave their lines
sys.stdout.write(
    f"rank={r} world={w} local={runtime.local_rank()} main={runtime.is_main_process()} "
    f"sum={value!r} mean={mean!r} max={biggest!r} "
    f"tensor={','.join(repr(x) for x in out.tolist())}\n"
)
sys.stdout.flush()
runtime.barrier()
