"""`distify lint` follows the script's calls into its project as the migration does (issue 21): a
helper module that writes a file on every rank, or trains on a loader the script hands it without a
sampler, is reported at the script's call with the helper's file:line. How the loader reaches the
call (its own name, another name bound to it, a function's parameter) does not matter: the match
is by data flow, never by spelling."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from distify.lint import lint_source

HELPERS = """\
import torch


def save_checkpoint(state, path):
    torch.save(state, path)


class Runner:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def fit(self, loader, epochs):
        for epoch in range(epochs):
            for x, y in loader:
                self.optimizer.zero_grad()
                torch.nn.functional.mse_loss(self.model(x), y).backward()
                self.optimizer.step()
"""

SCRIPT = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from helpers import Runner, save_checkpoint


def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4, shuffle=True)
    runner = Runner(model, optimizer)
    runner.fit(train_loader, 2)
    save_checkpoint(model.module.state_dict(), "final.pt")


if __name__ == "__main__":
    main()
"""

HANDED = {
    "by its name": SCRIPT,
    "under another name": SCRIPT.replace("    runner.fit(train_loader, 2)\n", "    ld = train_loader\n    runner.fit(ld, 2)\n"),
    "by keyword": SCRIPT.replace("    runner.fit(train_loader, 2)\n", "    runner.fit(epochs=2, loader=train_loader)\n"),
    "through a function": SCRIPT.replace("    runner = Runner(model, optimizer)\n    runner.fit(train_loader, 2)\n",
                                         "    go(model, optimizer, train_loader)\n").replace(
        "def main():", "def go(net, opt, batches):\n    runner = Runner(net, opt)\n    runner.fit(batches, 2)\n\n\ndef main():"),
}


def _lint(tmp_path: Path, script: str, helpers: str = HELPERS):
    (tmp_path / "helpers.py").write_text(helpers)
    (tmp_path / "train.py").write_text(script)
    return [(f.line, f.code, f.message) for f in lint_source(script.encode(), path=str(tmp_path / "train.py"))]


@pytest.mark.parametrize("how", list(HANDED))
def test_a_loader_handed_to_a_helper_that_trains_on_it_is_reported(tmp_path, how):
    script = HANDED[how]
    found = _lint(tmp_path, script)
    line = script.splitlines().index(next(l for l in script.splitlines() if "= DataLoader(" in l)) + 1
    said = [f for f in found if f[1] == "DST951"]
    assert said and said[0][0] == line and "is handed to fit() (helpers.py:13)" in said[0][2], found


def test_a_helper_writing_on_every_rank_is_reported_with_its_line(tmp_path):
    found = _lint(tmp_path, SCRIPT)
    assert (16, "DST955", "save_checkpoint() in helpers.py:4 writes a file (save()) on every rank; guard the call "
            "with `if runtime.is_main_process():` or let distify migrate helpers.py") in found


def test_a_sharded_loader_and_a_guarded_save_are_not_reported(tmp_path):
    script = SCRIPT.replace("batch_size=4, shuffle=True)", "batch_size=4, sampler=torch.utils.data.distributed."
                            "DistributedSampler(torch.arange(16)))").replace(
        '    save_checkpoint(', '    if dist.get_rank() == 0:\n        save_checkpoint(')
    assert [f for f in _lint(tmp_path, script) if f[1] in ("DST951", "DST955")] == []


def test_a_helper_that_builds_its_own_loader_from_the_one_handed_is_not_reported(tmp_path):
    """A hand-written helper may make its own sharded loader out of the one it receives: its loop
    iterates that one, not the parameter, and nothing is said."""
    helpers = HELPERS.replace("            for x, y in loader:", "            sharded = torch.utils.data.DataLoader(loader.dataset, "
                              "sampler=torch.utils.data.distributed.DistributedSampler(loader.dataset))\n"
                              "            for x, y in sharded:")
    assert [f for f in _lint(tmp_path, SCRIPT, helpers) if f[1] == "DST951"] == []
