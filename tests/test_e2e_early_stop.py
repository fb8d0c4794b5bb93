"""Executed: an early stop decided on a value of each rank's own shard is taken by every rank at once
(issue 22; DST207, fixtures/DST207/last_loss_stop).

The script stops once the epoch's last batch loss is under a tolerance. The odd samples are noisy
and DistributedSampler deals index i to rank i % 2, so on 2 ranks rank 0's loss falls under it and
rank 1's never does. Migrated, ``runtime.agree`` makes the decision one for both: the run ends, early,
with the same parameters on every rank (they took as many steps). Control: without it rank 0 leaves
the loop and rank 1 waits for it in the next gradient all-reduce (gloo then fails on the closed
connection, or the launch times out).

The other stops of fixtures/DST207, each migrated for every backend with a golden and launched on 2
ranks (DDP and FSDP under torchrun, Horovod under horovodrun, whose agreement goes through Horovod's
all-reduce): the early-stopping object of the common recipe, whose ``__call__`` keeps the flag the
loop reads (early_stopping_object); a ``while`` loop whose test reads a flag set from the last batch
loss (while_not_done, agreed with ``runtime.agree_all``); a batch loop left on this rank's batch
loss beside a patience counter on a whole evaluation (patience); a stop a function of the script
decides from the losses the loop appends, and a ``sys.exit`` on a loss no longer finite
(stop_in_function); REINFORCE's running reward past a threshold, with each rank drawing its own
episodes (solved_threshold; a test-only sitecustomize seeds each rank apart, as separate machines'
environments would be). Every rank must end with the same parameters (FSDP: every rank's run ends
and the gathered parameters are taken, the agreement is what lets the ranks finish). The stop
depends on each rank's own shard, so the run is not the single process's at twice the batch, and
no weights are compared with it. Control (ddp): the same migration with the agreements taken out
either fails (a rank waits in an all-reduce the other left) or ends with ranks that differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    REPO_ROOT, RunFailed, executed, migrate, rank_parameters, run_torchrun,
)

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST207" / "last_loss_stop.in.py"
AGREED = "if runtime.agree(loss.item() < args.tol):"
ARGS = ["--batch-size", 8, "--epochs", 40]



def _ranks(script: Path, workdir: Path, backend: str, timeout: float, args=ARGS, seed_apart: bool = False):
    """(the launch's result, each rank's parameters at exit)."""
    if seed_apart:
        return rank_parameters(script, args, workdir, backend, SEED_APART, {"DISTIFY_E2E_SEED_APART": "1"}, timeout=timeout)
    return rank_parameters(script, args, workdir, backend, timeout=timeout)


@pytest.mark.parametrize("backend", [executed("DST207/last_loss_stop", b, b) for b in ("ddp", "horovod", "fsdp")])
def test_every_rank_stops_at_the_same_epoch(tmp_path, backend):
    import torch

    script = tmp_path / "script" / "last_loss_stop.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    assert AGREED in text, "DST207 did not agree the stop"
    result, (rank0, rank1) = _ranks(script, tmp_path / "run", backend, timeout=180)
    assert "converged at epoch" in result.stdout and "stopped after epoch 39" not in result.stdout, result.stdout
    assert rank0 and all(torch.equal(a, b) for a, b in zip(rank0, rank1)), "the ranks took different steps"

    if backend == "ddp":
        # control: each rank decides alone -> rank 1 trains on after rank 0 left
        script.write_text(text.replace(AGREED, "if loss.item() < args.tol:"))
        with pytest.raises(RunFailed):
            run_torchrun(script, ARGS, nproc=2, cwd=tmp_path, timeout=60)


# each rank seeds its generators apart (torch.manual_seed(seed) seeds seed + 1000 * rank): separate
# machines drawing their own episodes
SEED_APART = '''\
import os

if os.environ.get("DISTIFY_E2E_SEED_APART"):
    def _patch(torch):
        real_seed = torch.manual_seed
        rank = int(os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or 0)
        torch.manual_seed = lambda seed: real_seed(int(seed) + 1000 * rank)

    _after_torch_import(_patch)
'''


class Stop:
    """A shape: its arguments, the lines distify agrees (each with its line without the agreement),
    what its output must show once the migrated run stops early, and what only a run that never
    stopped early shows."""

    def __init__(self, args, agreed: dict, shows: str = "", never: str = "", seed_apart: bool = False):
        self.args, self.agreed, self.shows, self.never, self.seed_apart = args, agreed, shows, never, seed_apart


SHAPES = {
    "early_stopping_object": Stop(ARGS, {"if runtime.agree(early_stopping.early_stop):": "if early_stopping.early_stop:"},
                                  "stopped after epoch", "stopped after epoch 39"),
    "while_not_done": Stop(ARGS, {"while runtime.agree_all(not done):": "while not done:"},
                           "stopped after epoch", "stopped after epoch 40"),
    # batch 4: 6 batches a rank, whose losses pass under 0.05 on one rank before the other
    "patience": Stop(["--batch-size", 4, "--epochs", 50], {
        "if runtime.agree(loss.item() < 0.05):": "if loss.item() < 0.05:",
        "if runtime.agree(val < best):": "if val < best:"}, "done 49"),
    "stop_in_function": Stop([], {
        "if runtime.agree(not math.isfinite(loss.item())):": "if not math.isfinite(loss.item()):",
        "if runtime.agree(plateaued(history, 3)):": "if plateaued(history, 3):"}, "done", "done 29"),
    "solved_threshold": Stop([], {"if runtime.agree(running_reward > args.threshold):":
                                  "if running_reward > args.threshold:"}, "Solved!", seed_apart=True),
}


@pytest.mark.parametrize("shape,backend", [
    executed(f"DST207/{shape}", backend, shape, backend, id=f"{shape}-{backend}")
    for shape in sorted(SHAPES) for backend in ("ddp", "horovod", "fsdp")
])
def test_a_stop_decided_outside_the_test_is_taken_by_every_rank(tmp_path, shape, backend):
    import torch

    stop = SHAPES[shape]
    script = tmp_path / "script" / f"{shape}.py"
    migrate(REPO_ROOT / "fixtures" / "DST207" / f"{shape}.in.py", script, backend=backend)
    text = script.read_text()
    assert all(line in text for line in stop.agreed), "DST207 did not agree the stop"
    result, (rank0, rank1) = _ranks(script, tmp_path / "run", backend, 180, stop.args, stop.seed_apart)
    assert stop.shows in result.stdout and not (stop.never and stop.never in result.stdout), result.stdout
    assert rank0 and all(torch.equal(a, b) for a, b in zip(rank0, rank1)), "the ranks took different steps"
    if backend != "ddp":
        return

    # control: each rank decides alone -> one leaves the loop, the other waits in the next all-reduce
    # (the launch fails or hangs) or trains on alone (the ranks end apart)
    for agreed, alone in stop.agreed.items():
        text = text.replace(agreed, alone)
    script.write_text(text)
    try:
        _, (rank0, rank1) = _ranks(script, tmp_path / "control", backend, 60, stop.args, stop.seed_apart)
    except RunFailed:
        return
    assert not (rank0 and all(torch.equal(a, b) for a, b in zip(rank0, rank1))), \
        "control: the ranks decided alone and still took the same steps"


# The early-stopping helper that saves the model it is handed (fixtures/DST102/early_stopping_checkpoint):
# `stopper(valid_loss, model)` runs `__call__`, which hands the model on to `self.save_checkpoint`.
# Before the fix that call was not seen as one of `__call__` (Facts.callers), so the wrapped model was
# saved as it was: DDP's `module.` keys in the checkpoint (the final reload then failed), and under FSDP
# rank 0's DTensor shards instead of the full state (the launch hung).
CHECKPOINT = REPO_ROOT / "fixtures" / "DST102" / "early_stopping_checkpoint.in.py"
SAVED = {
    "ddp": "torch.save(runtime.unwrap(model).state_dict(), self.path)",
    "fsdp": "model_state = get_model_state_dict(model, options=",
    "horovod": "torch.save(model.state_dict(), self.path)",
}


@pytest.mark.parametrize("backend", [
    executed("DST102/early_stopping_checkpoint", backend, backend, id=backend) for backend in ("ddp", "fsdp", "horovod")
])
def test_the_checkpoint_the_stopper_saves_has_the_model_keys(tmp_path, backend):
    from e2e_support import assert_same_weights, load_state, run_horovodrun, run_python

    import torch

    orig = tmp_path / "orig"
    orig.mkdir()
    run_python(CHECKPOINT, ["--batch-size", 16], cwd=orig)
    script = tmp_path / "script" / "early_stopping_checkpoint.py"
    migrate(CHECKPOINT, script, backend=backend)
    text = script.read_text()
    assert SAVED[backend] in text
    launch = run_horovodrun if backend == "horovod" else run_torchrun
    run = tmp_path / "run"
    run.mkdir()
    launch(script, ["--batch-size", 8], nproc=2, cwd=run, timeout=180)
    best = torch.load(run / "checkpoint.pt", map_location="cpu")
    assert all(type(v) is torch.Tensor for v in best.values()), "the checkpoint holds shards, not tensors"
    assert_same_weights(best, load_state(orig / "checkpoint.pt"), label="best checkpoint")
    assert_same_weights(load_state(run / "final.pt"), load_state(orig / "final.pt"), label="final")
    if backend != "ddp":
        return

    # control: the save as distify wrote it before (the wrapped model's own state_dict)
    script.write_text(text.replace(SAVED["ddp"], "torch.save(model.state_dict(), self.path)"))
    with pytest.raises(RunFailed):  # the reload into model.module meets `module.` keys
        launch(script, ["--batch-size", 8], nproc=2, cwd=run, timeout=60)
    assert all(k.startswith("module.") for k in torch.load(run / "checkpoint.pt", map_location="cpu"))
