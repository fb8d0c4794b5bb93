"""Hand-written Horovod with the training steps as functions nested in train(args), as Horovod's
examples write them when they also run through horovod.run."""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from torch.utils.data import TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--log-interval", type=int, default=10)


def train(args):
    def train_epoch(epoch):
        model.train()
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]\tLoss: {loss.item():.6f}")

    def test():
        model.eval()
        correct = 0.0
        with torch.no_grad():
            for data, target in test_loader:
                correct += model(data).argmax(1).eq(target).float().sum().item()
        if hvd.rank() == 0:
            print(f"Test accuracy: {100.0 * correct / len(test_loader.dataset):.2f}%")

    hvd.init()
    torch.manual_seed(42)
    train_dataset = TensorDataset(torch.randn(512, 12), torch.randint(0, 4, (512,)))
    test_dataset = TensorDataset(torch.randn(100, 12), torch.randint(0, 4, (100,)))
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=32, sampler=train_sampler)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=50)
    model = nn.Sequential(nn.Linear(12, 4), nn.LogSoftmax(dim=1))
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch)
        test()


if __name__ == "__main__":
    train(parser.parse_args())
