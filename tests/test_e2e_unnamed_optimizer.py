"""Horovod and an optimizer with no name of its own (DST111, fixtures/DST111/optimizer_in_schedule).

The transformer recipes hand the optimizer straight to a scheduling class of the script
(`NoamSchedule(16, 10, torch.optim.Adam(net.parameters(), ...))`) that sets its learning rate and
calls its `step()`. distify used to skip such an optimizer: no hvd.DistributedOptimizer and no
parameter broadcast, so each rank trained on its own gradients from its own initial weights, with no
word. It is now wrapped where it is built. This runs the migrated fixture on two gloo ranks under
horovodrun and checks that the parameters it steps are identical on both ranks at the end; the
control removes the wrap (what distify wrote before) and the ranks differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, migrate, run_horovodrun, same_on_every_rank, spied_parameters  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.horovod]

CASE = REPO_ROOT / "fixtures" / "DST111" / "optimizer_in_schedule.in.py"
WRAPPED = "hvd.DistributedOptimizer(torch.optim.Adam(net.parameters(), lr=0, betas=(0.9, 0.98), eps=1e-9), named_parameters=net.named_parameters())"
PLAIN = "torch.optim.Adam(net.parameters(), lr=0, betas=(0.9, 0.98), eps=1e-9)"


def _migrated(tmp_path: Path) -> Path:
    script = tmp_path / "script" / "noam.py"
    migrate(CASE, script, backend="horovod")
    text = script.read_text()
    assert WRAPPED in text and "hvd.broadcast_parameters(net.state_dict(), root_rank=0)" in text, text
    return script


def test_optimizer_built_inside_a_schedule_is_averaged(tmp_path):
    assert same_on_every_rank(spied_parameters(_migrated(tmp_path), tmp_path, run_horovodrun, "horovodrun"))


def test_control_without_the_wrap_the_ranks_drift(tmp_path):
    script = _migrated(tmp_path)
    script.write_text(script.read_text().replace(WRAPPED, PLAIN))
    assert not same_on_every_rank(spied_parameters(script, tmp_path, run_horovodrun, "horovodrun"))
