"""Train a small convolutional classifier on synthetic 16x16 "digits".

A single-GPU (or CPU) script in the familiar train()/test()/main() layout. The data are generated
on the fly, so it runs anywhere in a few seconds:

    python examples/train.py --epochs 2

Turn it into a DistributedDataParallel script with

    distify examples/train.py --backend ddp --diff      # preview
    distify examples/train.py --backend ddp             # rewrite in place
    torchrun --nproc-per-node 2 examples/train.py       # then launch it
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Dataset


class SyntheticDigits(Dataset):
    """Each class is a fixed random 16x16 pattern; samples are that pattern plus noise."""

    def __init__(self, num_samples, num_classes=10, noise=1.5, seed=0):
        patterns = torch.randn(num_classes, 1, 16, 16, generator=torch.Generator().manual_seed(2024))
        gen = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, num_classes, (num_samples,), generator=gen)
        self.images = patterns[self.targets] + noise * torch.randn(num_samples, 1, 16, 16, generator=gen)

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], self.targets[index]


class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout(torch.flatten(x, 1))
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]"
                  f"\tLoss: {loss.item():.4f}")


def test(model, device, test_loader):
    model.eval()
    test_loss = 0.0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.cross_entropy(output, target, reduction="sum").item()
            correct += (output.argmax(dim=1) == target).sum().item()
    n = len(test_loader.dataset)
    print(f"Test set: average loss {test_loss / n:.4f}, accuracy {correct}/{n} ({100.0 * correct / n:.1f}%)")


def main():
    parser = argparse.ArgumentParser(description="Synthetic digits classifier")
    parser.add_argument("--batch-size", type=int, default=64, help="training batch size (default: 64)")
    parser.add_argument("--test-batch-size", type=int, default=256, help="test batch size (default: 256)")
    parser.add_argument("--epochs", type=int, default=3, help="number of epochs (default: 3)")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate (default: 0.05)")
    parser.add_argument("--gamma", type=float, default=0.7, help="learning rate decay per epoch (default: 0.7)")
    parser.add_argument("--no-cuda", action="store_true", help="disable CUDA even if it is available")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    parser.add_argument("--log-interval", type=int, default=10, help="batches between log lines")
    parser.add_argument("--save-model", action="store_true", help="save the trained weights")
    parser.add_argument("--checkpoint", default="digits_cnn.pt", help="where --save-model writes")
    args = parser.parse_args()

    use_cuda = not args.no_cuda and torch.cuda.is_available()
    device = torch.device("cuda" if use_cuda else "cpu")
    torch.manual_seed(args.seed)

    train_dataset = SyntheticDigits(2048, seed=1)
    test_dataset = SyntheticDigits(512, seed=2)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True, num_workers=2)
    test_loader = DataLoader(test_dataset, batch_size=args.test_batch_size, shuffle=False)

    model = Net().to(device)
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)

    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()

    if args.save_model:
        torch.save(model.state_dict(), args.checkpoint)
        print(f"saved weights to {args.checkpoint}")


if __name__ == "__main__":
    main()
