"""DST206 reduces the sums a training loop adds up and the script reads after it, by what each
batch adds (distify.sums): a per-sample sum is summed over the ranks, a sum of batch means is
averaged, and anything else is left as it is (see tests/test_e2e_train_sums.py for the run)."""
from __future__ import annotations

import re

import pytest

from distify.engine import migrate_source
from distify.rules.base import Options

SCRIPT = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def own_loss(out, y):
    return ((out - y) ** 2).mean()


def per_row_loss(out, y):
    return ((out - y) ** 2).sum(dim=1).mean()


def compute_loss(model, x, y):
    out = model(x)
    loss = F.mse_loss(out, y)
    return loss


def loss_with(crit, out, y):
    return crit(out, y).detach()


data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
loader = DataLoader(data, batch_size=8, shuffle=True)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = {criterion}
{before}
for epoch in range(2):
    {init}
    for x, y in loader:
        optimizer.zero_grad()
        loss = {loss}
        loss.backward()
        optimizer.step()
        {add}
    print(epoch, total / len(loader))
'''

BASE = dict(criterion="nn.MSELoss()", before="", init="total = 0.0", loss="criterion(model(x), y)",
            add="total += loss.item()")
CASES = {
    # a loss module that averages its batch (the library's default): a sum of batch means
    "mean-module": ({}, "reduce_mean"),
    "mean-function": ({"loss": "F.mse_loss(model(x), y)"}, "reduce_mean"),
    "mean-times-batch": ({"add": "total += loss.item() * x.size(0)"}, "all_reduce_sum"),
    "sum-module": ({"criterion": 'nn.MSELoss(reduction="sum")'}, "all_reduce_sum"),
    "count": ({"add": "total += y.size(0)"}, "all_reduce_sum"),
    # the script's own function returning a mean loss: followed through its returns
    "own-function-mean": ({"loss": "compute_loss(model, x, y)"}, "reduce_mean"),
    "own-function-criterion": ({"loss": "criterion(model(x), y)", "add": "total += loss_with(criterion, model(x), y).item()"},
                               "reduce_mean"),
    "own-function-sum-criterion": ({"criterion": 'nn.MSELoss(reduction="sum")', "loss": "criterion(model(x), y)",
                                    "add": "total += loss_with(criterion, model(x), y).item()"}, None),
    # a per-element loss averaged by hand is a batch mean (distify.loss_scale); summed, a per-sample sum
    "own-loss": ({"loss": "own_loss(model(x), y)"}, "reduce_mean"),
    "no-reduction": ({"criterion": 'nn.MSELoss(reduction="none")', "loss": "criterion(model(x), y).mean()"}, "reduce_mean"),
    "no-reduction-sum": ({"criterion": 'nn.MSELoss(reduction="none")', "loss": "criterion(model(x), y).sum()"}, "all_reduce_sum"),
    # what distify cannot tell is a mean or a sum stays as it is
    "own-loss-dim": ({"loss": "per_row_loss(model(x), y)"}, None),  # along a dim: the layout decides
    # a running value printed and reset inside the loop is per rank by design
    "reset-in-loop": ({"add": "total += loss.item()\n        if total > 9:\n            total = 0.0"}, None),
    # a total over every epoch: reducing it after each pass would count the earlier passes N times
    "across-epochs": ({"before": "total = 0.0", "init": "pass"}, None),
    "not-a-sum": ({"add": "total = max(total, loss.item())"}, None),
    # a counter the loop's block adds to again in a later loop: a total of both (it crashed, NameError)
    "adds-in-a-later-loop": ({"add": "total += loss.item()\n    for _ in range(2):\n        total += 1.0"}, None),
    # a counter kept in a tensor (distify.library.ZERO_TENSORS, NUMBER_TENSORS) is one as a number is
    "tensor-zeros": ({"init": "total = torch.zeros(())", "add": "total += loss.detach()"}, "reduce_mean"),
    "tensor-number": ({"init": "total = torch.tensor(0.0)", "add": "total += loss.detach() * x.size(0)"}, "all_reduce_sum"),
    "tensor-moved": ({"init": "total = torch.zeros(1).float()", "add": "total += y.size(0)"}, "all_reduce_sum"),
    "tensor-as-module": ({"before": "import torch as T", "init": "total = T.zeros((), dtype=T.float64)"}, "reduce_mean"),
    # controls: a tensor of ones or of a value read at run time, or one summed over every epoch
    "tensor-ones": ({"init": "total = torch.ones(())", "add": "total += loss.detach()"}, None),
    "tensor-of-a-value": ({"init": "total = torch.tensor(len(data))", "add": "total += y.size(0)"}, None),
    "tensor-across-epochs": ({"before": "total = torch.zeros(())", "init": "pass"}, None),
}


def _reductions(backend: str, **parts) -> list:
    source = SCRIPT.format(**{**BASE, **parts})
    out = migrate_source(source.encode(), Options(backend=backend)).output.decode()
    return re.findall(r"^ *total = runtime\.(\w+)\(total\)$", out, re.M)


@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_reduction_by_kind(case, backend):
    parts, expected = CASES[case]
    assert _reductions(backend, **parts) == ([expected] if expected else [])


def test_second_run_adds_nothing():
    source = SCRIPT.format(**BASE).encode()
    once = migrate_source(source, Options(backend="ddp")).output
    assert migrate_source(once, Options(backend="ddp")).output == once


LIST_FIXTURE = "fixtures/DST206/loss_list_scheduler.in.py"


@pytest.mark.parametrize(
    "old,new,reduced",
    [
        ("", "", True),
        # controls: the list read inside the loop (a running view), not empty at the start, or
        # holding something that is neither a batch mean nor a per-sample sum
        ("        losses.append(loss.item())\n", "        losses.append(loss.item())\n        print(losses[-1])\n", False),
        ("    losses = []\n", "    losses = [0.0]\n", False),
        ("losses.append(loss.item())", "losses.append(model.weight.norm().item())", False),
    ],
)
def test_a_list_of_batch_values_is_reduced_entry_by_entry(old, new, reduced):
    from pathlib import Path

    source = (Path(__file__).resolve().parent.parent / LIST_FIXTURE).read_text()
    if old:
        assert old in source
        source = source.replace(old, new)
    out = migrate_source(source.encode(), Options(backend="ddp")).output.decode()
    assert ("losses = runtime.reduce_each(losses)" in out) == reduced, out


def test_reduce_each_in_one_process_returns_the_list():
    from distify import runtime

    assert runtime.reduce_each([1.5, 2.0]) == [1.5, 2.0]
    assert runtime.reduce_each((1, 2), "sum") == [1, 2]
    with pytest.raises(ValueError):
        runtime.reduce_each([1.0], "max")


@pytest.mark.parametrize(
    "parts,warned",
    [
        ({"loss": "per_row_loss(model(x), y)"}, True),  # reduced along a dim: neither kind distify can tell
        ({"add": "total += loss.item() + y.size(0)"}, True),  # terms of different kinds
        ({}, False),  # control: a sum of batch means, reduced
        ({"add": "total += 1"}, False),  # control: a count of batches, the same on every rank
        ({"add": "total += loss.item()\n        if total > 9:\n            total = 0.0"}, False),  # per rank by design
    ],
)
def test_an_unclassified_sum_read_after_the_loop_is_said_with_its_line(parts, warned):
    source = SCRIPT.format(**{**BASE, **parts})
    result = migrate_source(source.encode(), Options(backend="ddp"))
    found = [f for f in result.findings if f.code == "DST206" and f.kind == "warning"]
    assert bool(found) == warned, found
    if warned:
        read = next(i for i, line in enumerate(source.splitlines(), 1) if "print(epoch, total" in line)
        assert f"(line {read})" in found[0].message and "rank's" in found[0].message


DICT_SCRIPT = '''\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def report(d):
    print(d)


data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
loader = DataLoader(data, batch_size=8)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.MSELoss()
extra = {{"lr": 0.1}}
{before}
for epoch in range(2):
    {init}
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        m["loss"] += loss.item() * x.size(0)
        m["n"] += y.size(0)
        {add}
    {after}
    print(epoch, m["loss"] / m["n"])
'''
DICT_BASE = dict(before="", init='m = {"loss": 0.0, "n": 0}', add="pass", after="pass")
SUMMED = 'm["loss"], m["n"] = runtime.all_reduce_sum(m["loss"], m["n"])'


@pytest.mark.parametrize(
    "parts,expected,warned",
    [
        ({}, [SUMMED], False),
        ({"init": "m = {'loss': torch.zeros(()), 'n': 0, 'steps': 0}", "add": 'm["steps"] += 1'},
         [SUMMED], False),  # a tensor entry, and a count of batches every rank takes alike
        ({"init": 'm = {"loss": 0.0, "n": 0, "batch": 0.0}', "add": 'm["batch"] += loss.item()'},
         [SUMMED, 'm["batch"] = runtime.reduce_mean(m["batch"])'], False),  # a sum of batch means, averaged
        ({"init": 'm = dict(loss=0.0, n=0)'}, [], True),  # not a dict literal distify reads key by key
        ({"init": 'm = {"loss": 0.0, "n": 0, **extra}'}, [], True),
        ({"init": 'm = {"loss": 0.0}'}, [], True),  # an entry it adds to starts from nothing it can see
        ({"init": 'm = {"loss": 0.0, "n": len(data)}'}, [], True),  # nor from a number
        ({"add": "report(m)"}, [], True),  # handed on inside the loop: it may be read or changed there
        ({"add": 'm["loss"] = m["loss"] * 0.5'}, [], True),  # changed otherwise
        ({"add": 'm[str(epoch)] += 1.0'}, [], True),  # at a key distify cannot tell (it may be "n")
        # samples and batches counted in one entry: neither kind (said; the other entry is reduced)
        ({"add": 'm["n"] += 1'}, ['m["loss"] = runtime.all_reduce_sum(m["loss"])'], True),
        ({"after": 'm["n"] += len(data)'}, [], True),  # keeps adding up after the loop
        ({"after": 'm["extra"] = 1'}, [SUMMED], False),  # another entry set after it
        ({"after": "report(m)"}, [SUMMED], False),  # handed on whole after the loop: reduced before
        ({"before": 'm = {"loss": 0.0, "n": 0}', "init": "pass"}, [], True),  # a total over every epoch
    ],
)
def test_a_dict_of_counters_is_reduced_entry_by_entry(parts, expected, warned):
    source = DICT_SCRIPT.format(**{**DICT_BASE, **parts})
    result = migrate_source(source.encode(), Options(backend="ddp"))
    out = result.output.decode()
    assert [line.strip() for line in out.splitlines() if "runtime.all_reduce_sum(m" in line or "runtime.reduce_mean(m" in line] == expected, out
    found = [f for f in result.findings if f.code == "DST206" and f.kind == "warning"]
    assert bool(found) == warned, found
    if warned:
        lines = source.splitlines()
        loop_end = next(i for i, line in enumerate(lines, 1) if 'm["n"] += y.size(0)' in line) + 1
        read = next(i for i, line in enumerate(lines, 1) if i > loop_end and "m[" in line)
        assert f"(line {read})" in found[0].message and "rank's" in found[0].message, found[0].message
