"""The training loop of the two-module project, with its log line and its checkpoint."""
import torch
import torch.nn.functional as F


def train_one_epoch(model, loader, optimizer, epoch):
    for inputs, labels in loader:
        loss = F.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")


def save_checkpoint(model, path):
    torch.save(model.state_dict(), path)
