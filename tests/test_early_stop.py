"""DST207: an early stop decided on a value each rank computes from its own shard is agreed across
ranks (distify.early_stop); one on a value that is the same everywhere is left as it is. Each shape
has its control, the same stop on a value that is not per rank (see tests/test_e2e_early_stop.py for
the run)."""
from __future__ import annotations

import pytest

from distify.engine import migrate_source
from distify.rules.base import Options

SCRIPT = '''\
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def evaluate(model, loader):
    worst = 0.0
    with torch.no_grad():
        for x, y in loader:
            worst = max(worst, nn.functional.mse_loss(model(x), y).item())
    return worst


def halved(value):
    return value / 2


parser = argparse.ArgumentParser()
parser.add_argument("--limit", type=float, default=0.1)
args = parser.parse_args()
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
history = []
for epoch in range(10):
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        {inner}
    {outer}
'''

# (where, per-rank stop, the same stop on a value every rank shares)
CASES = {
    "last-batch-loss": ("outer", "if loss.item() < args.limit:\n        break",
                        "if epoch * args.limit > 3:\n        break"),
    "in-the-batch-loop": ("inner", "if torch.isnan(loss):\n            break",
                          "if step >= 2 and args.limit > 1:\n            break"),
    "own-function-over-a-loader": ("outer", "score = evaluate(model, loader)\n    if score < args.limit:\n        break",
                                   "score = halved(args.limit)\n    if score < args.limit:\n        break"),
    "appended": ("outer", "history.append(loss.item())\n    if sum(history) > 9:\n        break",
                 "history.append(args.limit)\n    if sum(history) > 9:\n        break"),
    "nested-condition": ("outer", "if loss.item() > args.limit:\n        if epoch > 3:\n            break",
                         "if args.limit > 1:\n        if epoch > 3:\n            break"),
}


def _migrate(where: str, code: str, backend: str = "ddp") -> str:
    parts = {"inner": "pass", "outer": "pass", where: code}
    return migrate_source(SCRIPT.format(**parts).encode(), Options(backend=backend)).output.decode()


@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_per_rank_stop_is_agreed(case, backend):
    where, per_rank, shared = CASES[case]
    out = _migrate(where, per_rank, backend)
    assert out.count("runtime.agree(") == 1, out
    second = migrate_source(out.encode(), Options(backend=backend)).output.decode()
    assert second == out, "a second run must change nothing"
    assert "runtime.agree(" not in _migrate(where, shared, backend)  # control


RETURNS = '''\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def train(model, loader, optimizer, limit):
    for epoch in range(10):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            if {test} < limit:
                return epoch
    return 10


loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
model = nn.Linear(4, 1)
print(train(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), 0.1))
'''


def test_a_return_out_of_a_training_function_is_agreed():
    out = migrate_source(RETURNS.format(test="loss.item()").encode(), Options(backend="ddp")).output.decode()
    assert "if runtime.agree(loss.item() < limit):" in out, out
    out = migrate_source(RETURNS.format(test="epoch").encode(), Options(backend="ddp")).output.decode()
    assert "runtime.agree(" not in out  # control: the epoch count is the same on every rank


def test_agree_in_one_process_is_the_flag():
    from distify import runtime

    assert runtime.agree(True) is True and runtime.agree(0) is False
