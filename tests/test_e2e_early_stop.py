"""Executed: an early stop decided on a value of each rank's own shard is taken by every rank at once
(issue 22; DST207, fixtures/DST207/last_loss_stop).

The script stops once the epoch's last batch loss is under a tolerance. The odd samples are noisy
and DistributedSampler deals index i to rank i % 2, so on 2 ranks rank 0's loss falls under it and
rank 1's never does. Migrated, ``runtime.agree`` makes the decision one for both: the run ends, early,
with the same parameters on every rank (they took as many steps). Control: without it rank 0 leaves
the loop and rank 1 waits for it in the next gradient all-reduce (gloo then fails on the closed
connection, or the launch times out).

Two stops the condition alone does not show, one run each (ddp; the agreement is the same runtime
call under every backend): the early-stopping object of the common recipe, whose ``__call__``
keeps the flag the loop reads (fixtures/DST207/early_stopping_object), and a ``while`` loop whose
test reads a flag set from the last batch loss (fixtures/DST207/while_not_done, agreed with
``runtime.agree_all``). Each has its control, the same migration with the agreement taken out.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    PARAM_SPY, REPO_ROOT, RunFailed, migrate, run_horovodrun, run_torchrun, sitecustomize_env,
)

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST207" / "last_loss_stop.in.py"
AGREED = "if runtime.agree(loss.item() < args.tol):"
ARGS = ["--batch-size", 8, "--epochs", 40]


def _ranks(script: Path, workdir: Path, launch, timeout: float):
    import torch

    dumps = workdir / "dumps"
    dumps.mkdir(parents=True)
    env = sitecustomize_env(workdir / "spy", PARAM_SPY, {"DISTIFY_E2E_PARAM_DIR": str(dumps)})
    result = launch(script, ARGS, nproc=2, env=env, cwd=workdir, timeout=timeout)
    return result, [torch.load(dumps / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("backend", ["ddp", pytest.param("horovod", marks=pytest.mark.horovod)])
def test_every_rank_stops_at_the_same_epoch(tmp_path, backend):
    import torch

    launch = run_horovodrun if backend == "horovod" else run_torchrun
    script = tmp_path / "script" / "last_loss_stop.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    assert AGREED in text, "DST207 did not agree the stop"
    result, (rank0, rank1) = _ranks(script, tmp_path / "run", launch, timeout=180)
    assert "converged at epoch" in result.stdout and "stopped after epoch 39" not in result.stdout, result.stdout
    assert rank0 and all(torch.equal(a, b) for a, b in zip(rank0, rank1)), "the ranks took different steps"

    if backend == "ddp":
        # control: each rank decides alone -> rank 1 trains on after rank 0 left
        script.write_text(text.replace(AGREED, "if loss.item() < args.tol:"))
        with pytest.raises(RunFailed):
            launch(script, ARGS, nproc=2, cwd=tmp_path, timeout=60)


# (fixture, the agreed line, the line without the agreement, what it prints when it never stops early)
SHAPES = {
    "early_stopping_object": ("if runtime.agree(early_stopping.early_stop):", "if early_stopping.early_stop:",
                              "stopped after epoch 39"),
    "while_not_done": ("while runtime.agree_all(not done):", "while not done:", "stopped after epoch 40"),
}


@pytest.mark.parametrize(
    "shape,backend",
    [(shape, "ddp") for shape in sorted(SHAPES)]
    # runtime.agree_all through Horovod's all-reduce (the agreed run; the control is the ddp case's)
    + [pytest.param("while_not_done", "horovod", marks=pytest.mark.horovod)],
)
def test_a_stop_decided_outside_the_test_is_taken_by_every_rank(tmp_path, shape, backend):
    import torch

    agreed, alone, never = SHAPES[shape]
    args = ["--batch-size", 8, "--epochs", 40]
    script = tmp_path / "script" / f"{shape}.py"
    migrate(REPO_ROOT / "fixtures" / "DST207" / f"{shape}.in.py", script, backend=backend)
    text = script.read_text()
    assert agreed in text, "DST207 did not agree the stop"
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    env = sitecustomize_env(tmp_path / "spy", PARAM_SPY, {"DISTIFY_E2E_PARAM_DIR": str(dumps)})
    launch = run_horovodrun if backend == "horovod" else run_torchrun
    result = launch(script, args, nproc=2, env=env, cwd=tmp_path, timeout=180)
    assert "stopped after epoch" in result.stdout and never not in result.stdout, result.stdout
    rank0, rank1 = (torch.load(dumps / f"rank{r}.pt") for r in range(2))
    assert rank0 and all(torch.equal(a, b) for a, b in zip(rank0, rank1)), "the ranks took different steps"
    if backend == "horovod":
        return

    # control: each rank decides alone -> one leaves the loop, the other waits in the next all-reduce
    script.write_text(text.replace(agreed, alone))
    with pytest.raises(RunFailed):
        run_torchrun(script, args, nproc=2, cwd=tmp_path, timeout=60)
