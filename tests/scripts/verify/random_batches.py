"""Regression trained on batches drawn with torch.randint, in the style of nanoGPT's get_batch."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--iters", type=int, default=40)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(args.seed)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = torch.randn(1024, 8)
target = data.sum(1, keepdim=True)

model = nn.Linear(8, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)


def get_batch():
    ix = torch.randint(len(data), (args.batch_size,))
    return data[ix].to(device), target[ix].to(device)


for it in range(args.iters):
    x, y = get_batch()
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if it % 10 == 0:
        print(f"iter {it} loss {loss.item():.4f}")
