"""A two-module single-process project for distify to migrate: the entry script builds the data,
the model and the optimizer; the training loop, its log line and the checkpoint live in utils.py."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from utils import save_checkpoint, train_one_epoch

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--checkpoint", default="project.pt")
args = parser.parse_args()

torch.manual_seed(0)
x = torch.randn(256, 12)
y = (x[:, 0] * x[:, 1] > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

for epoch in range(args.epochs):
    train_one_epoch(model, loader, optimizer, epoch)
save_checkpoint(model, args.checkpoint)
