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


# Stops the loop's own test cannot show: a `while` test, an exit of the process, a flag an object of
# the script keeps, a counter steered by a per-rank branch, a function returning under a per-rank
# test. Each with its control: the same shape on values every rank shares.
SHAPES = '''\
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Stopper:
    def __init__(self, patience):
        self.patience = patience
        self.best = None
        self.counter = 0
        self.early_stop = False

    def __call__(self, value):
        {keeps}
        if self.counter >= self.patience:
            self.early_stop = True


def converged(model):
    if {converged} < 0.01:
        return True
    return False


loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
stopper = Stopper(3)
best, patience, done, epoch = 1e9, 0, False, 0
while {loop}:
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    epoch += 1
    {tail}
'''

SHAPE_DEFAULTS = {"keeps": "self.counter += 1", "converged": "model.weight.abs().sum()", "loop": "epoch < 10", "tail": "pass"}

# (the per-rank shape, the control, what the stop's test becomes)
SHAPE_CASES = {
    # the object's __call__ keeps a flag set under a test on the loss it is handed
    "object-keeps-a-flag": (
        {"keeps": "if self.best is None or value < self.best:\n            self.best, self.counter = value, 0\n"
                  "        else:\n            self.counter += 1",
         "tail": "stopper(loss.item())\n    if stopper.early_stop:\n        break"},
        # the same object counting calls: the value it is handed decides nothing it keeps
        {"tail": "stopper(loss.item())\n    if stopper.early_stop:\n        break"},
        "if runtime.agree(stopper.early_stop):",
    ),
    "while-test": (
        {"loop": "not done", "tail": "done = loss.item() < 0.01 or epoch >= 10"},
        {"loop": "not done", "tail": "done = epoch >= 10"},
        "while runtime.agree_all(not done):",
    ),
    "sys-exit": (
        {"tail": "if torch.isnan(loss):\n        sys.exit(1)"},
        {"tail": "if epoch > 8:\n        sys.exit(0)"},
        "if runtime.agree(torch.isnan(loss)):",
    ),
    "raise-system-exit": (
        {"tail": "if loss.item() > 1e6:\n        raise SystemExit(2)"},
        {"tail": "if epoch > 1e6:\n        raise SystemExit(2)"},
        "if runtime.agree(loss.item() > 1e6):",
    ),
    # the counter is steered by a per-rank branch, and read by a test of its own
    "counter-steered-by-a-branch": (
        {"tail": "if loss.item() < best:\n        best = loss.item()\n        patience = 0\n    else:\n        patience += 1\n"
                 "    if patience >= 3:\n        break"},
        {"tail": "if epoch % 2:\n        patience = 0\n    else:\n        patience += 1\n"
                 "    if patience >= 3:\n        break"},
        "if runtime.agree(patience >= 3):",
    ),
    "function-returns-under-a-test": (
        {"converged": "nn.functional.mse_loss(model(next(iter(loader))[0]), next(iter(loader))[1]).item()",
         "tail": "if converged(model):\n        break"},
        {"tail": "if converged(model):\n        break"},
        "if runtime.agree(converged(model)):",
    ),
}


def _shape(parts: dict, backend: str = "ddp") -> str:
    src = SHAPES.format(**{**SHAPE_DEFAULTS, **parts})
    return migrate_source(src.encode(), Options(backend=backend)).output.decode()


@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
@pytest.mark.parametrize("case", sorted(SHAPE_CASES))
def test_a_stop_the_test_does_not_show_is_agreed(case, backend):
    per_rank, shared, expected = SHAPE_CASES[case]
    out = _shape(per_rank, backend)
    assert expected in out and out.count("runtime.agree") == 1, out
    assert migrate_source(out.encode(), Options(backend=backend)).output.decode() == out, "not idempotent"
    assert "runtime.agree" not in _shape(shared, backend), "control: the same shape on shared values"


def test_the_values_beside_an_agreed_decision_stay_each_ranks_own():
    """Once `val < best` is agreed, every rank takes the branch together: the patience counter it
    steers is one value everywhere (no second agreement), but `best` is still each rank's own figure,
    so a later stop on it is agreed in its turn (and rank 0's is what rank 0 saves or reports)."""
    tail = ("if loss.item() < best:\n        best = loss.item()\n        patience = 0\n    else:\n"
            "        patience += 1\n        if patience >= 3:\n            break\n"
            "    if {late} < 0.01:\n        break")
    out = _shape({"tail": tail.format(late="best")})
    assert "if runtime.agree(loss.item() < best):" in out, out
    assert "if patience >= 3:" in out and "if runtime.agree(best < 0.01):" in out, out
    out = _shape({"tail": tail.format(late="patience")})
    assert "if patience >= 3:" in out and "if patience < 0.01:" in out, "control: the counter is agreed already"


def test_agree_all_in_one_process_is_the_flag():
    from distify import runtime

    assert runtime.agree_all(True) is True and runtime.agree_all(0) is False


HELPER_EXIT = '''\
import math
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def check(value):
    if not math.isfinite(value):
        print("stopping at", value)
        sys.exit(1)


loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        check({value})
'''


def test_an_exit_in_a_function_the_training_loop_calls_is_agreed():
    out = migrate_source(HELPER_EXIT.format(value="loss.item()").encode(), Options(backend="ddp")).output.decode()
    assert "    if runtime.agree(not math.isfinite(value)):" in out, out
    assert migrate_source(out.encode(), Options(backend="ddp")).output.decode() == out
    # controls: the function handed a value every rank shares; the function also called on rank 0 alone
    out = migrate_source(HELPER_EXIT.format(value="float(epoch)").encode(), Options(backend="ddp")).output.decode()
    assert "runtime.agree(" not in out
    guarded = HELPER_EXIT.format(value="loss.item()").replace("import sys\n", "import os\nimport sys\n").replace(
        "model = nn.Linear", 'rank = int(os.environ.get("RANK", 0))\nmodel = nn.Linear').replace(
        "        check(loss.item())", "        if rank == 0:\n            check(loss.item())")
    out = migrate_source(guarded.encode(), Options(backend="ddp")).output.decode()
    assert "runtime.DDP(" in out and "runtime.agree(" not in out, out
