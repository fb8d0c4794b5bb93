"""Executed FSDP2 on a model that is an nn.ModuleList (no forward of its own; the script calls the
layers it holds): DST121 shards each layer, and under torchrun (2 ranks x batch B) every rank ends with
the full weights of the original at batch 2B, held as DTensor shards. The control: the same script
with only the first layer sharded (the second layer's parameters plain tensors on every rank) ends
with weights that differ from the big-batch run, so the comparison can tell."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import FSDP_SPY, migrate, run_python, run_torchrun, sitecustomize_env  # noqa: E402

pytestmark = pytest.mark.e2e

B = 8
SCRIPT = '''\
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 2))
loader = DataLoader(data, batch_size=args.batch_size)
layers = nn.ModuleList([nn.Linear(8, 16), nn.Linear(16, 2)])
optimizer = torch.optim.SGD(layers.parameters(), lr=0.1)
for epoch in range(args.epochs):
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(layers[1](torch.relu(layers[0](x))), y)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
'''
SHARD_EACH = "for layer in layers:\n    fully_shard(layer)\n"


def _weights(tmp_path: Path, script: Path, batch: int, launcher: str) -> dict:
    import torch

    dumps = tmp_path / f"{script.stem}-{launcher}-dumps"
    dumps.mkdir()
    env = sitecustomize_env(tmp_path / f"{script.stem}-{launcher}-spy", FSDP_SPY, {"DISTIFY_E2E_FSDP_DIR": dumps})
    run = run_torchrun if launcher == "torchrun" else run_python
    run(script, ["--batch-size", batch], env=env, cwd=tmp_path)
    return {p.stem: torch.load(p) for p in sorted(dumps.glob("rank*.pt"))}


def _max_diff(a, b) -> float:
    assert len(a) == len(b)
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def test_a_module_list_model_trains_like_the_big_batch_under_torchrun(tmp_path):
    original = tmp_path / "layers.py"
    original.write_text(SCRIPT)
    migrated = tmp_path / "layers_fsdp.py"
    migrate(original, migrated, backend="fsdp")
    text = migrated.read_text()
    assert SHARD_EACH in text and "fully_shard(layers)" not in text
    reference = _weights(tmp_path, original, 2 * B, "python")["ranksingle"]["params"]
    ranks = _weights(tmp_path, migrated, B, "torchrun")
    assert sorted(ranks) == ["rank0", "rank1"]
    for dump in ranks.values():
        assert dump["counts"]["params_sharded"] == dump["counts"]["params"] == 4
        assert _max_diff(reference, dump["params"]) < 1e-5
    # control: the second layer left unsharded steps on each rank's own gradients
    half = tmp_path / "layers_half.py"
    half.write_text(text.replace(SHARD_EACH, "fully_shard(layers[0])\n"))
    for dump in _weights(tmp_path, half, B, "torchrun").values():
        assert _max_diff(reference, dump["params"]) > 1e-3
