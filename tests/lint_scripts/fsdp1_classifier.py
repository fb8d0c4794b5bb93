"""Hand-written FSDP1 (the deprecated FullyShardedDataParallel wrapper) in the style of the older
PyTorch FSDP tutorial: a wrap policy by size, the whole evaluation set on every rank, rank-0 saves."""
import functools
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))


def train(rank, world_size, epochs=2):
    x = torch.randn(300, 16)
    y = torch.randint(0, 3, (300,))
    train_set, test_set = TensorDataset(x[:240], y[:240]), TensorDataset(x[240:], y[240:])
    sampler = DistributedSampler(train_set, rank=rank, num_replicas=world_size, shuffle=True)
    train_loader = DataLoader(train_set, batch_size=16, sampler=sampler)
    test_loader = DataLoader(test_set, batch_size=32)

    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=1000)
    model = FSDP(build_model(), auto_wrap_policy=policy, device_id=torch.device("cpu"))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for data, target in test_loader:
                correct += (model(data).argmax(dim=1) == target).sum().item()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f} test accuracy {correct / len(test_set):.3f}")
    state = model.state_dict()
    if rank == 0:
        torch.save(state, "fsdp1_classifier.pt")


if __name__ == "__main__":
    dist.init_process_group("gloo")
    train(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()
