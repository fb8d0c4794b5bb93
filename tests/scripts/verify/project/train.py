"""A two-module project, already distributed: the entry script builds the data, the model and the
optimizer; the training loop, its log line and the checkpoint live in utils.py."""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from distify import runtime
from utils import save_checkpoint, train_one_epoch

dist.init_process_group(**runtime.init_kwargs())
parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--checkpoint", default="project.pt")
args = parser.parse_args()

torch.manual_seed(0)
x = torch.randn(256, 12)
y = (x[:, 0] * x[:, 1] > 0).long()
dataset = TensorDataset(x, y)
sampler = DistributedSampler(dataset, shuffle=True)
loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
model = runtime.DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    train_one_epoch(model, loader, optimizer, epoch)
save_checkpoint(model, args.checkpoint)
