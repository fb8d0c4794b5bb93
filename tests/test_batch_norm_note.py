"""A model with BatchNorm layers is said to normalise per rank (DST101 under DDP, DST111 under Horovod,
DST121 under FSDP).

Under data parallelism each rank normalises with the statistics of its own shard of the batch, so a
migrated script is not the original at N times the batch (distify verify measured 7e-3 on the
speech-commands tutorial's M5 model after 12 steps); the note names the layer and the opt-in
(SyncBatchNorm). It looks into the model's expression and the classes of the file it builds, and says
nothing for a model without such a layer. The control replaces the fact with one that finds nothing
and shows the note gone."""
from __future__ import annotations

import pytest

from distify.engine import migrate_source
from distify.options import Options

WITH_BN = b'''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.block(x).mean(-1))


loader = DataLoader(TensorDataset(torch.randn(64, 1, 16), torch.randint(0, 2, (64,))), batch_size=8, shuffle=True)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
torch.save(model.state_dict(), "net.pt")
'''

WITHOUT_BN = WITH_BN.replace(b"self.norm = nn.BatchNorm1d(4)", b"self.norm = nn.Identity()")


def _notes(source: bytes, backend: str) -> list:
    result = migrate_source(source, Options(backend=backend))
    return [f for f in result.findings if "normalises with" in f.message]


@pytest.mark.parametrize("backend,code,opt_in", [("ddp", "DST101", "SyncBatchNorm.convert_sync_batchnorm"),
                                                 ("horovod", "DST111", "hvd.SyncBatchNorm"),
                                                 ("fsdp", "DST121", "SyncBatchNorm.convert_sync_batchnorm")])
def test_a_batch_norm_in_a_submodule_class_is_said(backend, code, opt_in):
    notes = _notes(WITH_BN, backend)
    assert len(notes) == 1, notes
    note = notes[0]
    assert note.code == code and note.kind == "info" and opt_in in note.message and "nn.BatchNorm1d" in note.message
    assert note.line == 11  # the layer itself, in Block.__init__


@pytest.mark.parametrize("backend", ["ddp", "horovod", "fsdp"])
def test_no_note_without_batch_norm(backend):
    assert _notes(WITHOUT_BN, backend) == []


def test_control_a_fact_that_finds_nothing_says_nothing(monkeypatch):
    import distify.rules.base as rule

    monkeypatch.setattr(rule, "batch_norm", lambda *args, **kwargs: None)
    assert _notes(WITH_BN, "ddp") == [] and _notes(WITH_BN, "horovod") == [] and _notes(WITH_BN, "fsdp") == []


def test_fsdp_fixture_notes_the_layer_and_the_buffers():
    """fixtures/DST121/batch_norm_statistics: FSDP shards parameters, not buffers, so the note says
    that each rank keeps running statistics of its own, at the layer in the block class."""
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "fixtures" / "DST121" / "batch_norm_statistics.in.py"
    notes = _notes(src.read_bytes(), "fsdp")
    assert [(n.code, n.line) for n in notes] == [("DST121", 14)], notes
    assert "running statistics of its own" in notes[0].message and "not buffers" in notes[0].message
