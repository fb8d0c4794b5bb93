"""A Horovod script (as distify --backend horovod writes them) that also uses distify.runtime.

Prints one line per rank:  rank=R world=W local=L main=M hvd=H sum=S mean=A max=X
"""
import horovod.torch as hvd
import torch

from distify import runtime

hvd.init()
r, w = runtime.rank(), runtime.world_size()
assert (r, w) == (hvd.rank(), hvd.size()), (r, w, hvd.rank(), hvd.size())
assert runtime.local_rank() == hvd.local_rank()

reduced = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum, name="plain")
value = runtime.all_reduce(r + 1)
mean = runtime.reduce_mean(torch.tensor([float(r)]))
biggest = runtime.all_reduce(float(r), "max")
runtime.barrier()
print(
    f"rank={r} world={w} local={runtime.local_rank()} main={runtime.is_main_process()} "
    f"hvd={reduced.item()!r} sum={value!r} mean={mean.item()!r} max={biggest!r}",
    flush=True,
)
