"""mlp_train.py converted to DistributedDataParallel BY HAND (the P5 reference), idiomatic torchrun style.

    torchrun --standalone --nproc-per-node 2 bench/workloads/mlp_train_ddp_hand.py
"""
import argparse
import contextlib
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


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
        sync = (i + 1) % accum == 0
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = criterion(model(x), y) / accum
            loss.backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad()
        total += loss.item()
    return total / len(loader)


def main():
    parser = argparse.ArgumentParser(description="benchmark MLP workload (hand-written DDP)")
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

    use_cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(1234)
    inputs = torch.randn(args.samples, args.features, generator=gen)
    labels = torch.randint(0, args.classes, (args.samples,), generator=gen)
    dataset = TensorDataset(inputs, labels)
    sampler = DistributedSampler(dataset, shuffle=True)
    train_loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    model = build_model(args.features, args.width, args.depth, args.classes).to(device)
    model = DDP(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        loss = train_epoch(model, train_loader, optimizer, criterion, device, args.accum)
        elapsed = time.perf_counter() - start
        if rank == 0:
            print(f"epoch_time {epoch} {elapsed:.6f} samples {len(dataset)} loss {loss:.4f}")

    # free the DDP wrapper (its reducer holds the process group) before the group goes: left to
    # interpreter exit, a gloo rank aborts with "terminate called without an active exception" in
    # about a third of 2-process CPU launches with torch 2.13 (distify.runtime's cleanup does the same)
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
