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


SCENARIO_ARGS = {"module_level": (), "trainer_class": ("--checkpoint-dir", "ckpts")}
EPOCHS = 2


def train_args(name, batch):
    return ["--batch-size", batch, "--epochs", EPOCHS, "--checkpoint", "final.pt", *SCENARIO_ARGS.get(name, ())]


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    return original_weights(tmp_path_factory, SCENARIOS, train_args)


@pytest.mark.parametrize("name", sorted(SCENARIO_ARGS))
def test_ddp_converts_to_equivalent_fsdp(name, originals, tmp_path):
    """single-GPU -> ddp -> fsdp: the conversion is what a fresh fsdp migration writes (fully_shard,
    no DDP wrapper or .module, a gathered full-state save), and 2 ranks x B end with the
    original's weights at 2B."""
    ddp_script = tmp_path / "ddp" / f"{name}.py"
    migrate(SCENARIOS / f"{name}.in.py", ddp_script, backend="ddp")
    fsdp_script = tmp_path / "fsdp" / f"{name}.py"
    migrate(ddp_script, fsdp_script, backend="fsdp")
    text = fsdp_script.read_text()
    assert "fully_shard(" in text and "DDP(" not in text and ".module" not in text, text
    fresh = tmp_path / "fresh" / f"{name}.py"
    migrate(SCENARIOS / f"{name}.in.py", fresh, backend="fsdp")
    assert _code_lines(text) == _code_lines(fresh.read_text())
    run_torchrun(fsdp_script, train_args(name, B), cwd=tmp_path)
    assert_same_weights(originals(name, NPROC * B), load_state(tmp_path / "final.pt"), atol=ATOL, label=f"{name} ddp->fsdp")


def _code_lines(text):
    """The statements of a script, imports aside (a conversion may order them differently)."""
    return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("import ", "from "))]


@pytest.mark.horovod
def test_hand_written_horovod_converts_to_equivalent_fsdp(tmp_path):
    source = FIXTURES / "DST003" / "hand_horovod.in.py"
    run_horovodrun(source, ["--batch-size", B, "--checkpoint", "hvd.pt"], cwd=tmp_path)
    script = tmp_path / "converted.py"
    migrate(source, script, backend="fsdp")
    text = script.read_text()
    assert "horovod" not in text and "fully_shard(" in text, text
    run_torchrun(script, ["--batch-size", B, "--checkpoint", "fsdp.pt"], cwd=tmp_path)
    assert_same_weights(load_state(tmp_path / "hvd.pt"), load_state(tmp_path / "fsdp.pt"), atol=ATOL, label="hvd->fsdp")
