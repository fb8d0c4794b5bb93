"""Benchmark workload: an MLP classifier on synthetic data, written as a single-GPU script.

distify migrates this file (P3/P4/P5 run the migrated copy); ``bench/workloads/mlp_train_ddp_hand.py``
is the same script converted to DDP by hand. It prints one ``epoch_time`` line per epoch so the
benchmarks can compute steady-state samples/s without instrumenting anything else.
"""
import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def build_model(features, width, depth, classes):
    layers = [nn.Linear(features, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def train_epoch(model, loader, optimizer, criterion, device, accum):
    model.train()
    total = 0.0
    optimizer.zero_grad()
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        loss = criterion(model(x), y) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
        total += loss.item()
    return total / len(loader)


def main():
    parser = argparse.ArgumentParser(description="benchmark MLP workload")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(1234)
    inputs = torch.randn(args.samples, args.features, generator=gen)
    labels = torch.randint(0, args.classes, (args.samples,), generator=gen)
    train_loader = DataLoader(TensorDataset(inputs, labels), batch_size=args.batch_size, shuffle=True)

    model = build_model(args.features, args.width, args.depth, args.classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        start = time.perf_counter()
        loss = train_epoch(model, train_loader, optimizer, criterion, device, args.accum)
        elapsed = time.perf_counter() - start
        print(f"epoch_time {epoch} {elapsed:.6f} samples {len(train_loader.dataset)} loss {loss:.4f}")


if __name__ == "__main__":
    main()
