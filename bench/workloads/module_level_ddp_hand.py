"""fixtures/scenarios/module_level.in.py converted to DistributedDataParallel BY HAND: P4's reference
for what DDP itself costs at world size 1 on a tiny model, next to the distify-migrated script.

    torchrun --standalone --nproc-per-node 2 bench/workloads/module_level_ddp_hand.py
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=0 WORLD_SIZE=1 python bench/workloads/module_level_ddp_hand.py
"""
import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser(description="module-level training script, DDP by hand")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--checkpoint", default="model.pt")
args = parser.parse_args()

use_cuda = torch.cuda.is_available()
dist.init_process_group(backend="nccl" if use_cuda else "gloo")
rank = dist.get_rank()
local_rank = int(os.environ.get("LOCAL_RANK", 0))
if use_cuda:
    torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
torch.manual_seed(args.seed or 0)

# synthetic regression problem: y = x @ w + noise
gen = torch.Generator().manual_seed(1234)
features = torch.randn(256, 8, generator=gen)
true_w = torch.randn(8, 1, generator=gen)
targets = features @ true_w + 0.1 * torch.randn(256, 1, generator=gen)

dataset = TensorDataset(features, targets)
sampler = DistributedSampler(dataset, shuffle=False)
train_loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
model = DDP(model, device_ids=[local_rank] if use_cuda else None)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
criterion = nn.MSELoss()

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    model.train()
    total = 0.0
    for x, y in train_loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
    if rank == 0:
        print(f"epoch {epoch} loss {total / len(train_loader):.4f}")

if rank == 0:
    torch.save(model.module.state_dict(), args.checkpoint)
    print(f"saved {args.checkpoint}")
# free the DDP wrapper (its reducer holds the process group) before the group goes; see
# mlp_train_ddp_hand.py
del model, optimizer
gc.collect()
dist.destroy_process_group()
