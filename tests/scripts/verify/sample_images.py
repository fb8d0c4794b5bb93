"""A small autoencoder that writes a grid of its reconstructions as a PGM image after every epoch."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def write_pgm(path, image):
    """image: a 2-D tensor in [0, 1], written as a binary greyscale PGM."""
    pixels = (image.clamp(0, 1) * 255).to(torch.uint8)
    with open(path, "wb") as fh:
        fh.write(b"P5 %d %d 255\n" % (pixels.shape[1], pixels.shape[0]))
        fh.write(bytes(pixels.flatten().tolist()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--samples", default="samples")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    images = torch.rand(128, 64)
    loader = DataLoader(TensorDataset(images), batch_size=args.batch_size, shuffle=False)
    model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 64), nn.Sigmoid()).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    os.makedirs(args.samples, exist_ok=True)

    for epoch in range(args.epochs):
        for (x,) in loader:
            x = x.to(device)
            loss = F.mse_loss(model(x), x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            grid = model(images[:8].to(device)).cpu().reshape(8 * 8, 8)
        write_pgm(os.path.join(args.samples, f"epoch_{epoch}.pgm"), grid)
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
