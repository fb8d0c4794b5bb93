"""Facts decided from what the code does, never from how the user spelled it (issue #21, item 3).

Each test states a fact on a small script whose names say nothing (or say the wrong thing), and
the metamorphic tests (tests/test_metamorphic.py) hold every fixture to the same rule. The controls
named in each docstring were run by putting the old spelling test back."""

from __future__ import annotations

import pytest

from distify.anatomy import analyse
import libcst as cst

HEAD = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
a = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
b = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
"""


def _roles(src: str) -> dict:
    return {l.target: l.role for l in analyse(cst.parse_module(src)).loaders}


@pytest.mark.parametrize("names", [("a", "b"), ("val_loader", "train_loader")])
def test_loader_role_from_what_the_loop_does_with_the_batches(names) -> None:
    """A loader only a generator expression reads, under no_grad, evaluates; one a `while` loop draws
    from with next() (the iterator made again on StopIteration) trains. Swapped names (`val_loader`
    for the one that trains) change nothing. Control: with the role guessed from the names again,
    or with draws counted only inside `for` loops, or comprehensions not read, this test fails."""
    src = HEAD + """
it = iter(a)
step = 0
while step < 4:
    try:
        x, y = next(it)
    except StopIteration:
        it = iter(a)
        x, y = next(it)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    step += 1
with torch.no_grad():
    total = sum(nn.functional.mse_loss(model(x), y).item() for x, y in b)
"""
    first, second = names
    src = src.replace("\na =", f"\n{first} =").replace("\nb =", f"\n{second} =")
    src = src.replace("iter(a)", f"iter({first})").replace("in b)", f"in {second})")
    assert _roles(src) == {first: "train", second: "eval"}


def test_a_loader_nothing_reads_has_no_role_whatever_its_name() -> None:
    """Control for the name: `val_loader` and `train_loader` built and never iterated are neither
    sharded nor evaluated; only a loop over one gives it a role."""
    src = HEAD.replace("\na =", "\ntrain_loader =").replace("\nb =", "\nval_loader =")
    assert set(_roles(src).values()) == {"unknown"}
    assert _roles(src + "for x, y in val_loader:\n    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\n")[
        "val_loader"
    ] == "train"


LIB_SAVE = """import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import AutoModelForSequenceClassification

model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
data = DataLoader(TensorDataset(torch.randint(0, 9, (8, 4)), torch.randint(0, 2, (8,))), batch_size=2)
for epoch in range(2):
    for x, y in data:
        opt.zero_grad()
        model(input_ids=x, labels=y).loss.backward()
        opt.step()
model.save_pretrained("out")
"""


def _migrate(src: str) -> str:
    from distify.engine import migrate_source
    from distify.rules.base import Options

    return migrate_source(src.encode(), Options(backend="ddp")).output.decode()


def test_save_pretrained_of_a_library_model_is_a_checkpoint_write() -> None:
    out = _migrate(LIB_SAVE)
    assert "if runtime.is_main_process():\n    model.module.save_pretrained(\"out\")" in out


def test_a_method_of_the_scripts_own_class_is_not_the_librarys_save_whatever_its_name() -> None:
    """A local class's own `save_pretrained` runs the script's code: the writes inside it are guarded
    where they are, and the call is the same call as one to a method spelled `dump`. Control: with
    the call taken for Hugging Face's by its name (the old SAVE_METHODS test), the two differ."""
    src = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(nn.Linear):
    def save_pretrained(self, path):
        torch.save(self.state_dict(), path)


model = Regressor(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)
for epoch in range(2):
    for x, y in data:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
model.save_pretrained("out.pt")
"""
    out = _migrate(src)
    assert "        if runtime.is_main_process():\n            torch.save(self.state_dict(), path)" in out
    assert _migrate(src.replace("save_pretrained", "dump")) == out.replace("save_pretrained", "dump")
