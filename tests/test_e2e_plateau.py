"""Executed: a ReduceLROnPlateau that decides from a value each rank measures on its own batches
(fixtures/DST207/plateau_per_rank_metric: nanoGPT's estimate_loss() on batches DST204 draws per rank)
gets ``runtime.reduce_mean`` of it from DST207, under torchrun and horovodrun, 2 ranks.

A test-only sitecustomize records every rank's parameters at exit and its last learning rate. With the
mean, the ranks end with one learning rate and the same weights. Control: the same migrated script
without the mean: the ranks cut their learning rates at their own steps (measured before the fix:
3.9e-05 on rank 0, 6.25e-04 on rank 1) and their weights part although every gradient was averaged.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import PARAM_SPY, REPO_ROOT, migrate, run_horovodrun, run_torchrun, sitecustomize_env  # noqa: E402

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST207" / "plateau_per_rank_metric.in.py"
MEAN = "runtime.reduce_mean("


@pytest.mark.parametrize(
    "backend,averaged",
    [("ddp", True), ("ddp", False), pytest.param("horovod", True, marks=pytest.mark.horovod)],
    ids=["ddp", "control-ddp", "horovod"],
)
def test_every_rank_cuts_its_learning_rate_at_the_same_step(tmp_path, backend, averaged):
    import torch

    script = tmp_path / "train.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    assert text.count(MEAN) == 1, "DST207 did not average the scheduler's metric"
    if not averaged:
        text = text.replace(MEAN, "(", 1)
    # each rank's last learning rate, beside the parameters the spy records
    script.write_text(text + '\nprint("last lr", optimizer.param_groups[0]["lr"], flush=True)\n')
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    env = sitecustomize_env(tmp_path / "spy", PARAM_SPY, {"DISTIFY_E2E_PARAM_DIR": str(dumps)})
    run = run_horovodrun if backend == "horovod" else run_torchrun
    result = run(script, ["--out_dir", str(tmp_path / "out")], nproc=2, env=env, cwd=tmp_path)
    lrs = {line.split()[-1] for line in result.output.splitlines() if line.startswith("last lr")}
    weights = [torch.load(dumps / f"rank{r}.pt") for r in range(2)]
    same = all(torch.equal(a, b) for a, b in zip(*weights))
    if averaged:
        assert len(lrs) == 1 and same, f"the ranks parted: learning rates {lrs}"
    else:
        assert len(lrs) == 2 and not same, "control: the ranks agreed without the mean"
