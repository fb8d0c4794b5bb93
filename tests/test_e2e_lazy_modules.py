"""Executed: a model of lazy modules (fixtures/DST101/lazy_modules_dry_run: nn.LazyConv2d and
nn.LazyLinear, materialised by a dry run on a dummy batch before the optimizer) is wrapped after its
dry run (DDP, fully_shard), so the wrapper holds real parameters and makes every rank's the same.
On 2 ranks (torchrun for ddp and fsdp, horovodrun --gloo for horovod; the model is unseeded, so each
rank materialises its own weights) the ranks end with identical parameters. Controls: the wrap moved
back above the dry run, where distify put it before, fails (DDP and fully_shard refuse uninitialised
parameters); under Horovod, without the broadcast after the dry run the ranks end apart."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, RunFailed, executed, migrate, rank_parameters, same_on_every_rank  # noqa: E402

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST101" / "lazy_modules_dry_run.in.py"
DRY_RUN = ("with torch.no_grad():\n"
           "    model(torch.zeros(1, 1, 8, 8, device=device))  # materialise the lazy layers\n")
# (the migrated lines, the control's) for each backend
CONTROL = {
    "ddp": ("model = Net().to(device)\n" + DRY_RUN + "model = runtime.DDP(model, device_ids=runtime.device_ids())\n",
            "model = runtime.DDP(Net().to(device), device_ids=runtime.device_ids())\n" + DRY_RUN),
    "fsdp": ("model = Net().to(device)\n" + DRY_RUN + "fully_shard(model)\n",
             "model = Net().to(device)\nfully_shard(model)\n" + DRY_RUN),
    "horovod": ("hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n", ""),
}


@pytest.mark.parametrize("backend", [executed("DST101/lazy_modules_dry_run", b, b, id=b) for b in ("ddp", "fsdp", "horovod")])
def test_the_wrap_comes_after_the_dry_run(backend, tmp_path):
    script = tmp_path / "script" / "train.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    migrated, old = CONTROL[backend]
    assert text.count(migrated) == 1, text
    _, ranks = rank_parameters(script, [], tmp_path / "migrated", backend)
    assert same_on_every_rank(ranks), "the ranks trained different models"

    control = tmp_path / "script" / "old.py"
    control.write_text(text.replace(migrated, old))
    if backend == "horovod":
        _, ranks = rank_parameters(control, [], tmp_path / "control", backend)
        assert not same_on_every_rank(ranks), "control: without the broadcast the ranks still agree"
        return
    with pytest.raises(RunFailed, match="uninitialized|Uninitialized|uninitialised"):
        rank_parameters(control, [], tmp_path / "control", backend)
