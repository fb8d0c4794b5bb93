"""An optimizer the model's own method builds (nanoGPT's ``optimizer = model.configure_optimizers(...)``
over weight-decay groups of its instance), run on two ranks.

distify refused this shape (it could not name the model the optimizer steps); distify.obtained now
names it where the script obtains the optimizer, and the migration wraps it (DDP: the method reached
through ``model.module``), shards it before the call (FSDP2) or wraps the returned optimizer
(Horovod). Each launch runs the migrated script on 2 ranks at batch B and checks that the ranks end
with identical parameters, equal to the original's single-process run at batch 2B (no shuffling:
the two shards of a 2B batch are the two ranks' batches). The controls take away the averaging
(the wrap, the shard, hvd.DistributedOptimizer): the ranks differ and leave the big-batch run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    FSDP_SPY, PARAM_SPY, migrate, run_horovodrun, run_python, run_torchrun, sitecustomize_env,
)

pytestmark = pytest.mark.e2e

B = 8
SCRIPT = '''\
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.norm(torch.relu(self.body(x))))

    def configure_optimizers(self, weight_decay, learning_rate):
        param_dict = {pn: p for pn, p in self.named_parameters()}
        param_dict = {pn: p for pn, p in param_dict.items() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(optim_groups, lr=learning_rate)


torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=args.batch_size)
model = Net()
optimizer = model.configure_optimizers(0.1, 1e-2)
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    print(f"epoch {epoch}")
torch.save(model.state_dict(), "final.pt")
'''

# what each backend's migration must write, and the text the control puts back (no averaging)
AVERAGING = {
    "ddp": ("model = runtime.DDP(Net())\noptimizer = model.module.configure_optimizers(0.1, 1e-2)\n",
            "model = Net()\noptimizer = model.configure_optimizers(0.1, 1e-2)\n"),
    "fsdp": ("model = Net()\nfully_shard(model)\noptimizer = model.configure_optimizers(0.1, 1e-2)\n",
             "model = Net()\noptimizer = model.configure_optimizers(0.1, 1e-2)\n"),
    "horovod": ("optimizer = model.configure_optimizers(0.1, 1e-2)\n"
                "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())\n",
                "optimizer = model.configure_optimizers(0.1, 1e-2)\n"),
}
LAUNCH = {"ddp": run_torchrun, "fsdp": run_torchrun, "horovod": run_horovodrun}


def _params(tmp_path: Path, script: Path, batch: int, launch, fsdp: bool) -> dict:
    """rank -> the parameters the run's optimizers step, at exit (full tensors under FSDP)."""
    import torch

    tag = f"{script.stem}-{launch.__name__}-{batch}"
    dumps = tmp_path / f"{tag}-dumps"
    dumps.mkdir()
    spy, var = (FSDP_SPY, "DISTIFY_E2E_FSDP_DIR") if fsdp else (PARAM_SPY, "DISTIFY_E2E_PARAM_DIR")
    env = sitecustomize_env(tmp_path / f"{tag}-spy", spy, {var: str(dumps)})
    run = tmp_path / f"{tag}-run"
    run.mkdir()
    launch(script, ["--batch-size", batch], env=env, cwd=run)
    out = {}
    for p in sorted(dumps.glob("rank*.pt")):
        dump = torch.load(p)
        if fsdp or dump:  # a real launcher's own process imports torch and steps nothing
            out[p.stem] = dump["params"] if fsdp else dump
    return out


def _max_diff(a, b) -> float:
    assert len(a) == len(b) > 0
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


@pytest.mark.parametrize("backend", [
    "ddp", "fsdp", pytest.param("horovod", marks=pytest.mark.horovod),
])
def test_configure_optimizers_trains_like_the_big_batch_on_two_ranks(tmp_path, backend):
    original = tmp_path / "gpt.py"
    original.write_text(SCRIPT)
    migrated = tmp_path / f"gpt_{backend}.py"
    migrate(original, migrated, backend=backend)
    text = migrated.read_text()
    wrote, plain = AVERAGING[backend]
    assert wrote in text, text
    fsdp = backend == "fsdp"
    reference = _params(tmp_path, original, 2 * B, run_python, fsdp)["ranksingle"]
    ranks = _params(tmp_path, migrated, B, LAUNCH[backend], fsdp)
    assert sorted(ranks) == ["rank0", "rank1"]
    assert _max_diff(ranks["rank0"], ranks["rank1"]) == 0.0
    assert _max_diff(reference, ranks["rank0"]) < 1e-5
    # control: the same migration without the averaging (what a migration that wraps nothing, or
    # shards after the optimizer is built, trains): each rank steps on its own half of the data
    control = tmp_path / f"gpt_{backend}_unaveraged.py"
    control.write_text(text.replace(wrote, plain).replace("model.module.state_dict()", "model.state_dict()"))
    ranks = _params(tmp_path, control, B, LAUNCH[backend], fsdp)
    assert _max_diff(ranks["rank0"], ranks["rank1"]) > 1e-3
    assert _max_diff(reference, ranks["rank0"]) > 1e-3
