"""DST922 under FSDP: what ``model.named_parameters()`` / ``parameters()`` yields after the shard is
DTensor shards, so a save of those tensors (a dict or list made of them, then ``torch.save``) is
refused with the line, while an optimizer built from ``model.parameters()`` and saved by its own
``state_dict()`` is not (the control that keeps the rule from reading any name a save mentions)."""
from __future__ import annotations

import pytest

from distify.engine import migrate_source
from distify.options import Options

SCRIPT = '''\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 2)), batch_size=8)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
{save}
'''


def _refused(save: str) -> bool:
    result = migrate_source(SCRIPT.replace("{save}", save).encode(), Options(backend="fsdp"))
    return result.refused and any(f.code == "DST922" for f in result.findings)


@pytest.mark.parametrize("save", [
    'kept = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}\ntorch.save(kept, "kept.pt")',
    'kept = dict(model.named_parameters())\ntorch.save({"weights": kept}, "kept.pt")',
    'torch.save([p.detach() for p in model.parameters()], "kept.pt")',
])
def test_saving_the_shards_themselves_is_refused(save):
    assert _refused(save)


@pytest.mark.parametrize("save", [
    'torch.save(optimizer.state_dict(), "opt.pt")',
    'count = sum(p.numel() for p in model.parameters())\nprint(count)',
    'kept = {n: p.detach() for n, p in model.named_parameters()}\nprint(len(kept))',
])
def test_controls_that_save_no_shard_are_migrated(save):
    assert not _refused(save)
