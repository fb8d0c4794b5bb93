"""DDP and a training loss computed by a method of the model (DST102).

DDP averages the gradients of a step only when a forward called through the wrapper armed its
hooks. distify therefore refuses `loss = model.compute_loss(x)` when no wrapped forward runs first
(fixtures/DST102/loss_method_in_loop), and migrates `out = model(x); loss = model.compute_loss(...)`
(fixtures/DST102/loss_method_after_forward), reaching the method through `model.module`. This runs
the latter on two gloo ranks and checks that every parameter the optimizer steps is identical on both
(the codebook too, which only the method reads directly). The control turns the wrapped forward into
`model.module(...)`: the same script then leaves each rank its own gradients, and the ranks differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, migrate, run_torchrun, same_on_every_rank, spied_parameters  # noqa: E402

pytestmark = pytest.mark.e2e

CASE = REPO_ROOT / "fixtures" / "DST102" / "loss_method_after_forward.in.py"
WRAPPED_FORWARD = "recon, z, codes = model(xb)"


def _ranks(script: Path, tmp_path: Path) -> list:
    return spied_parameters(script, tmp_path, run_torchrun, "torchrun")


_same = same_on_every_rank


def _migrated(tmp_path: Path) -> Path:
    script = tmp_path / "script" / "vq.py"
    migrate(CASE, script, backend="ddp")
    text = script.read_text()
    assert "model.module.compute_loss(" in text and WRAPPED_FORWARD in text, text
    return script


def test_loss_method_after_a_wrapped_forward_is_averaged(tmp_path):
    assert _same(_ranks(_migrated(tmp_path), tmp_path))


def test_control_without_the_wrapped_forward_the_ranks_drift(tmp_path):
    script = _migrated(tmp_path)
    script.write_text(script.read_text().replace(WRAPPED_FORWARD, "recon, z, codes = model.module(xb)"))
    assert not _same(_ranks(script, tmp_path))
