"""Training handed to a loop as a value (distify.callable_training), decided from data flow.

The Annotated Transformer's ``run_epoch(data_iter, model, loss_compute)`` trains through
``loss_compute(out, tgt, norm)``, an instance of the script's ``SimpleLossCompute(criterion, opt)``
whose ``__call__`` steps. Before, only functions called by name and methods called through the
instance counted, so the loop was no training loop: its loader was never sharded, and no warning.
"""

from __future__ import annotations

import libcst as cst
import pytest

from distify import anatomy as anatomy_module
from distify.anatomy import analyse

HEAD = """
import functools
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class LossCompute:
    def __init__(self, criterion, opt=None):
        self.criterion = criterion
        self.opt = opt

    def __call__(self, x, y, norm):
        loss = self.criterion(x, y) / norm
        if self.opt is not None:
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
        return loss.item() * norm


def run_epoch(data_iter, model, loss_compute):
    total = 0.0
    for src, tgt in data_iter:
        total += loss_compute(model(src), tgt, 1)
    return total
"""

ANNOTATED = HEAD + """
def main():
    train_loader = DataLoader(train_ds, batch_size=8, shuffle=True)
    val_loader = DataLoader(val_ds, batch_size=8)
    model = nn.Linear(8, 2)
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters())
    for epoch in range(3):
        model.train()
        run_epoch(train_loader, model, LossCompute(criterion, opt))
        model.eval()
        with torch.no_grad():
            print(run_epoch(val_loader, model, LossCompute(criterion, None)))
"""


def _roles(src: str):
    a = analyse(cst.parse_module(src))
    return {l.target: l.role for l in a.loaders}, a


def test_the_loader_handed_in_the_training_call_is_the_training_loader():
    roles, a = _roles(ANNOTATED)
    assert roles == {"train_loader": "train", "val_loader": "eval"}
    train = next(l for l in a.loaders if l.target == "train_loader")
    (ep,) = a.epoch_loops[train]
    assert ep.var == "epoch" and ep.loader_ref == "train_loader"
    assert a.facts.trains(a.functions["run_epoch"])


def test_control_without_the_fact_the_loop_trains_nothing(monkeypatch):
    monkeypatch.setattr(anatomy_module, "value_trainers", lambda facts: frozenset())
    roles, _ = _roles(ANNOTATED)
    assert roles["train_loader"] != "train"


def test_none_for_the_optimizer_alone_makes_the_call_evaluate():
    # no no_grad around the evaluation call: the constant None closes `if self.opt is not None`
    src = ANNOTATED.replace("        with torch.no_grad():\n            print(", "        if True:\n            print(")
    roles, _ = _roles(src)
    assert roles == {"train_loader": "train", "val_loader": "eval"}


def test_no_grad_alone_makes_the_call_evaluate():
    src = ANNOTATED.replace("LossCompute(criterion, None)", "LossCompute(criterion, opt)")
    roles, _ = _roles(src)
    assert roles == {"train_loader": "train", "val_loader": "eval"}
    # control: the same call outside no_grad, with the optimizer, trains: both loaders train
    src = src.replace("        with torch.no_grad():\n            print(", "        if True:\n            print(")
    roles, _ = _roles(src)
    assert roles == {"train_loader": "train", "val_loader": "train"}


def test_the_instance_parameter_is_whatever_the_method_calls_it():
    src = ANNOTATED.replace("def __call__(self, x, y, norm):", "def __call__(me, x, y, norm):").replace(
        "self.criterion(x, y)", "me.criterion(x, y)").replace("if self.opt is not None:", "if me.opt is not None:").replace(
        "self.opt.step()", "me.opt.step()").replace("self.opt.zero_grad()", "me.opt.zero_grad()")
    assert "self.opt is" not in src.split("def __call__")[1].split("def run_epoch")[0]
    roles, _ = _roles(src)
    assert roles == {"train_loader": "train", "val_loader": "eval"}


def test_a_class_whose_call_does_not_train_is_no_training():
    src = ANNOTATED.replace("            loss.backward()\n            self.opt.step()\n", "            pass\n")
    roles, a = _roles(src)
    assert "train" not in roles.values()
    assert not a.facts.trains(a.functions["run_epoch"])


STEP = """
def train_step(out, y, norm, opt=None):
    loss = nn.functional.cross_entropy(out, y)
    loss.backward()
    opt.step()
    return loss.item()


def main():
    loader = DataLoader(ds, batch_size=8, shuffle=True)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        run_epoch(loader, model, STEP_VALUE)
"""


@pytest.mark.parametrize("value", ["train_step", "functools.partial(train_step, opt=opt)"])
def test_a_function_of_the_script_passed_as_a_value_trains(value):
    roles, a = _roles(HEAD + STEP.replace("STEP_VALUE", value))
    assert roles == {"loader": "train"}
    assert [ep.var for ep in a.epoch_loops[a.loaders[0]]] == ["epoch"]


def test_control_a_function_that_does_not_train_passed_as_a_value():
    src = (HEAD + STEP.replace("STEP_VALUE", "train_step")).replace("    loss.backward()\n    opt.step()\n", "")
    roles, _ = _roles(src)
    assert roles != {"loader": "train"}


def test_a_local_name_bound_to_an_instance_that_trains():
    src = HEAD + """
loader = DataLoader(ds, batch_size=8, shuffle=True)
model = nn.Linear(8, 2)
step = LossCompute(nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1))
for epoch in range(2):
    for x, y in loader:
        step(model(x), y, 1)
"""
    roles, _ = _roles(src)
    assert roles == {"loader": "train"}
    roles, _ = _roles(src.replace("torch.optim.SGD(model.parameters(), lr=0.1))", "None)"))
    assert roles != {"loader": "train"}  # control: the same instance without an optimizer evaluates
