"""A shuffled training loader whose Dataset adds numpy noise to each sample (augmentation): drawn from
numpy's global generator (--noise global), or from a generator object the Dataset keeps (--noise generator)."""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--noise", choices=["global", "generator"], default="global")
args = parser.parse_args()

torch.manual_seed(0)
np.random.seed(0)


class Jittered(Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, 12)
        self.y = (self.x[:, 0] * self.x[:, 1] > 0).long()
        self.rng = np.random.default_rng(0) if args.noise == "generator" else None

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.rng is not None:
            noise = self.rng.normal(0.0, 0.05, size=12).astype("float32")
        else:
            noise = np.random.normal(0.0, 0.05, size=12).astype("float32")
        return self.x[i] + torch.from_numpy(noise), self.y[i]


train_loader = DataLoader(Jittered(256), batch_size=args.batch_size, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

for epoch in range(args.epochs):
    for inputs, labels in train_loader:
        loss = F.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")

torch.save(model.state_dict(), "jittered.pt")
