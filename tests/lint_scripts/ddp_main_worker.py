"""Hand-written DDP in the style of an ImageNet-like main_worker script (argparse, explicit ranks)."""
import argparse
import os
import shutil

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils.data
import torch.utils.data.distributed
from torch.utils.data import TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", default=3, type=int)
parser.add_argument("--batch-size", default=32, type=int)
parser.add_argument("--lr", default=0.1, type=float)


def main():
    args = parser.parse_args()
    args.rank = int(os.environ.get("RANK", 0))
    args.world_size = int(os.environ.get("WORLD_SIZE", 1))
    dist.init_process_group(backend="gloo", world_size=args.world_size, rank=args.rank)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    model = torch.nn.parallel.DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)

    train_dataset = TensorDataset(torch.randn(1024, 32), torch.randint(0, 10, (1024,)))
    val_dataset = TensorDataset(torch.randn(256, 32), torch.randint(0, 10, (256,)))
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None), num_workers=0, sampler=train_sampler
    )
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=args.batch_size, shuffle=False)

    best_acc1 = 0.0
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, epoch, args)
        acc1 = validate(val_loader, model, criterion, args)
        scheduler.step()
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        if args.rank == 0:
            save_checkpoint(
                {"epoch": epoch + 1, "state_dict": model.module.state_dict(), "best_acc1": best_acc1,
                 "optimizer": optimizer.state_dict()},
                is_best,
            )
    dist.destroy_process_group()


def train(train_loader, model, criterion, optimizer, epoch, args):
    model.train()
    for i, (images, target) in enumerate(train_loader):
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % 10 == 0 and args.rank == 0:
            print(f"Epoch: [{epoch}][{i}/{len(train_loader)}] loss {loss.item():.4f}")


def validate(val_loader, model, criterion, args):
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, target in val_loader:
            correct += (model(images).argmax(1) == target).sum().item()
    acc1 = 100.0 * correct / len(val_loader.dataset)
    if args.rank == 0:
        print(f" * Acc@1 {acc1:.3f}")
    return acc1


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


if __name__ == "__main__":
    main()
