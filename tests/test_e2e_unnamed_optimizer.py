"""Horovod and an optimizer with no name of its own (DST111, fixtures/DST111/optimizer_in_schedule).

The transformer recipes hand the optimizer straight to a scheduling class of the script
(`NoamSchedule(16, 10, torch.optim.Adam(net.parameters(), ...))`) that sets its learning rate and
calls its `step()`. distify used to skip such an optimizer: no hvd.DistributedOptimizer and no
parameter broadcast, so each rank trained on its own gradients from its own initial weights, with no
word. It is now wrapped where it is built. This runs the migrated fixture on two gloo ranks under
horovodrun and checks that the parameters it steps are identical on both ranks at the end; the
control removes the wrap (what distify wrote before) and the ranks differ. The DDP output (the model
wrapped, the optimizer left where it is built) runs the same way, with the same control (the wrap
removed); the FSDP output (fully_shard before the schedule builds the optimizer) runs on two ranks
and its optimizer must step the sharded parameters (DTensors on every rank).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, executed, migrate, rank_parameters, same_on_every_rank  # noqa: E402

pytestmark = pytest.mark.e2e

CASE = REPO_ROOT / "fixtures" / "DST111" / "optimizer_in_schedule.in.py"
WRAPPED = "hvd.DistributedOptimizer(torch.optim.Adam(net.parameters(), lr=0, betas=(0.9, 0.98), eps=1e-9), named_parameters=net.named_parameters())"
PLAIN = "torch.optim.Adam(net.parameters(), lr=0, betas=(0.9, 0.98), eps=1e-9)"
# per backend: what makes the ranks train one model, and the same line without it (the control)
SETUP = {
    "horovod": (WRAPPED, PLAIN),
    "ddp": ("net = runtime.DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))",
            "net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))"),
    "fsdp": ("    fully_shard(net)\n", None),
}


def _migrated(tmp_path: Path, backend: str) -> Path:
    script = tmp_path / "script" / "noam.py"
    migrate(CASE, script, backend=backend)
    text = script.read_text()
    assert SETUP[backend][0] in text, text
    if backend == "horovod":
        assert "hvd.broadcast_parameters(net.state_dict(), root_rank=0)" in text, text
    return script


def _ranks(script: Path, work: Path, backend: str) -> list:
    (work / "run").mkdir(parents=True)
    return rank_parameters(script, [], work / "run", backend)[1]


@pytest.mark.parametrize("backend", [executed("DST111/optimizer_in_schedule", b, b) for b in ("horovod", "ddp", "fsdp")])
def test_optimizer_built_inside_a_schedule_is_averaged(tmp_path, backend):
    script = _migrated(tmp_path, backend)
    assert same_on_every_rank(_ranks(script, tmp_path / "migrated", backend))
    if backend == "fsdp":
        import torch

        counts = [torch.load(tmp_path / "migrated" / "run" / "dumps" / f"rank{r}.pt")["counts"] for r in (0, 1)]
        assert all(c["params_sharded"] == c["params"] == 4 for c in counts), counts
        return

    # control: without the wrap (what distify wrote before) each rank trains on its own gradients
    wrapped, plain = SETUP[backend]
    script.write_text(script.read_text().replace(wrapped, plain))
    assert not same_on_every_rank(_ranks(script, tmp_path / "control", backend))
