"""Executed: training losses summed over the batch (DST131) on 2 ranks under every backend.

fixtures/DST131/sparse_autoencoder (a reconstruction error and an L1 penalty, both summed, in the
script's own loss function of what the model's forward returns) and fixtures/DST131/
trainer_sum_criterion (a trainer's `self.loss_fn = nn.SmoothL1Loss(reduction="sum")`, stepped
through a GradScaler). The gradient averaging of DDP, FSDP and Horovod divides a summed loss's
gradient by the number of ranks; scaled by the world size, each backend's run at batch 8 per rank
ends with the weights of the original at batch 16, and the epoch's loss per sample it prints (a
per-sample sum reduced over the ranks, DST206) is the original's. Control: the same migration
without the scaling ends elsewhere."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    REPO_ROOT, assert_same_weights, executed, load_state, migrate, run_horovodrun, run_python, run_torchrun,
)

pytestmark = pytest.mark.e2e

CASES = ("DST131/sparse_autoencoder", "DST131/trainer_sum_criterion")
SCALE = re.compile(r" \* (dist\.get_world_size\(\)|hvd\.size\(\))")


def _run(script: Path, workdir: Path, launch, batch: int):
    workdir.mkdir()
    result = launch(script, ["--batch-size", batch], cwd=workdir)
    losses = re.findall(r"loss per sample ([0-9.]+)", result.stdout)
    return load_state(workdir / "final.pt"), losses


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    out = {}
    for case in CASES:
        root = tmp_path_factory.mktemp(case.replace("/", "_"))
        out[case] = _run(REPO_ROOT / "fixtures" / f"{case}.in.py", root / "run",
                         lambda s, a, cwd: run_python(s, a, cwd=cwd), 16)
    return out


@pytest.mark.parametrize("case,backend", [
    executed(case, backend, case, backend) for case in CASES for backend in ("ddp", "fsdp", "horovod")
])
def test_a_summed_loss_trains_like_the_original(tmp_path, case, backend, originals):
    script = tmp_path / "train.py"
    migrate(REPO_ROOT / "fixtures" / f"{case}.in.py", script, backend=backend)
    text = script.read_text()
    assert len(SCALE.findall(text)) == 1, text
    launch = run_horovodrun if backend == "horovod" else run_torchrun
    two = lambda s, a, cwd: launch(s, a, nproc=2, cwd=cwd)  # noqa: E731
    weights, losses = _run(script, tmp_path / "run", two, 8)
    want_weights, want_losses = originals[case]
    assert_same_weights(weights, want_weights, atol=1e-5, label=f"{backend} vs original at twice the batch")
    assert losses == want_losses
    if backend in ("ddp", "horovod"):
        control = tmp_path / "control.py"
        control.write_text(SCALE.sub("", text))
        drifted, _ = _run(control, tmp_path / "control", two, 8)
        with pytest.raises(AssertionError, match="weights differ"):
            assert_same_weights(drifted, want_weights, atol=1e-5, label="control")
