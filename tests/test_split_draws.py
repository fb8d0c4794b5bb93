"""DST965: the dataset a DistributedSampler shards is made by a random draw the script never seeds
(distify.split_draws), so every rank shards another split. Each case has its control: the same
script seeded, or the draw kept away from the training set, stays quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.rules.base import Options

SCRIPT = '''\
import random
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset, random_split

SEED_LINE
def make_sets(full):
    return random_split(full, [48, 16]SPLIT_KW)


def main():
    xs = torch.arange(64.0).reshape(64, 1)
    full = TensorDataset(xs, xs * 2)
    train_ds, val_ds = make_sets(full)
    train_loader = DataLoader(TRAIN_DS, batch_size=8, shuffle=True)
    val_loader = DataLoader(val_ds, batch_size=8)
    model = nn.Linear(1, 1)
    optimizer = torch.optim.Adam(model.parameters())
    for epoch in range(2):
        for step, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            (model(x) - y).pow(2).mean().backward()
            optimizer.step()
    with torch.no_grad():
        print(sum(nn.functional.mse_loss(model(x), y).item() for x, y in val_loader))


if __name__ == "__main__":
    main()
'''


def script(seed: str = "", kw: str = "", train: str = "train_ds") -> bytes:
    return SCRIPT.replace("SEED_LINE", seed).replace("SPLIT_KW", kw).replace("TRAIN_DS", train).encode()


def draw_line(source: bytes) -> int:
    return next(i for i, text in enumerate(source.decode().splitlines(), 1) if "return random_split(" in text)


def lines(source: bytes, backend: str) -> list:
    out = migrate_source(source, Options(backend=backend))
    assert out.changed
    return [f.line for f in out.findings if f.code == "DST965"]


@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
def test_an_unseeded_split_of_the_training_set_is_reported_at_the_draw(backend) -> None:
    # in make_sets(), reached through the call that binds train_ds
    assert lines(script(), backend) == [draw_line(script())]


@pytest.mark.parametrize("seed, kw", [
    ("torch.manual_seed(0)\n", ""),  # the global generator seeded: the same split on every rank
    ("", ", generator=torch.Generator().manual_seed(3)"),  # a generator of its own
])
def test_a_seeded_split_is_quiet(seed, kw) -> None:
    assert lines(script(seed, kw), "ddp") == []


def test_a_seed_of_another_generator_does_not_count() -> None:
    # control of the family: random.seed / np.random.seed leave torch's generator unseeded
    source = script("random.seed(0)\nnp.random.seed(0)\n")
    assert lines(source, "ddp") == [draw_line(source)]


def test_a_split_that_only_the_evaluation_reads_is_quiet() -> None:
    # control of the data flow: the training loader reads the whole set, the split only feeds validation
    assert lines(script(train="full"), "ddp") == []


SAMPLED = '''\
import numpy as np
import torch
from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

SEED_LINE
xs = torch.linspace(-1, 1, 64).reshape(32, 2)
data = TensorDataset(xs, xs)
order = np.random.permutation(len(data))
loader = DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(order[8:].tolist()))
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.l1_loss(model(x), y).backward()
        opt.step()
'''


@pytest.mark.parametrize("seed, found", [("", True), ("np.random.seed(4)", False)])
def test_the_indices_of_a_shared_sampler_are_followed(seed, found) -> None:
    # DST901 shares SubsetRandomSampler out with runtime.ShareSampler: its indices must be alike too
    source = SAMPLED.replace("SEED_LINE", seed).encode()
    assert bool(lines(source, "ddp")) is found


LEARNT = (Path(__file__).resolve().parents[1] / "fixtures" / "DST901" / "loss_weighted_sampler.in.py").read_text()
WRITE = "            hardness[idx] = per_sample.detach() + 1e-3\n"


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_a_sampler_built_from_weights_the_training_writes_is_refused(backend) -> None:
    out = migrate_source(LEARNT.encode(), Options(backend=backend))
    assert not out.changed and [f.line for f in out.findings if f.code == "DST901"] == [
        LEARNT.splitlines().index(WRITE.rstrip("\n")) + 1]
    # control: weights fixed before training (the write taken out) are shared out as before
    assert WRITE in LEARNT
    fixed = migrate_source(LEARNT.replace(WRITE, "").encode(), Options(backend=backend))
    assert fixed.changed and b"ShareSampler(sampler)" in fixed.output
