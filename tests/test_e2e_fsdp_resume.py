"""Executed: under FSDP a resume whose checkpoint only rank 0 may see runs on every rank or on none
(issue 22, item 4; DST308, fixtures/DST308/resume_args_epoch).

The script loads its checkpoint under ``if os.path.isfile(args.resume):``. A test-only
sitecustomize makes ``os.path.isfile`` answer False for it on rank 1 (several nodes: only rank 0's
disk holds it) while the file stays readable. Migrated, the test takes rank 0's answer
(``runtime.broadcast_object``), so both ranks run ``set_model_state_dict`` for their shards: resumed
at its last epoch (nothing left to train), the sharded model gathered on each rank is the
checkpoint's. Control: with the host's own answer rank 1 skips the load, its epoch count and its
shards: the run hangs or fails, or ends with a model that is not the checkpoint's.

The same resume migrated for DDP and Horovod: rank 0's weights (and optimizer state, and epoch) are
broadcast after the load, so every rank holds the checkpoint's model; control: without the
broadcasts rank 1 holds its fresh one. And a resume path found nowhere (``--resume missing.pt``: the
script says so and trains from scratch): the optimizer must take as many steps as the rank trained
batches. Horovod's broadcast_optimizer_state gives an empty optimizer a zero-gradient step (Adam's
step count one ahead, its bias correction shifted), so it runs only when rank 0 says its optimizer
holds a state; control: under ``if args.resume:`` (distify's condition before, true here) Adam is
one step ahead.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    FSDP_SPY, RANK0_ONLY_SPY, REPO_ROOT, RunFailed, executed, launcher, migrate, rank_parameters, run_torchrun,
    sitecustomize_env,
)

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST308" / "resume_args_epoch.in.py"
DECIDED = "        if runtime.broadcast_object(os.path.isfile(args.resume)):\n"
EPOCHS = 2


def _checkpoint(path: Path) -> list:
    """A checkpoint of epoch EPOCHS with Adam's state; the parameters it holds, in order."""
    import torch
    import torch.nn as nn

    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    torch.save({"epoch": EPOCHS, "best_acc1": 0.5, "state_dict": model.state_dict(),
                "optimizer": optimizer.state_dict()}, path)
    return [p.detach().clone() for p in model.parameters()]


def _resumed(script: Path, workdir: Path, timeout: float):
    """Each rank's gathered parameters after the resumed run (None when the run failed or hung)."""
    import torch

    workdir.mkdir(parents=True)
    ckpt = workdir / "checkpoint.pth.tar"
    saved = _checkpoint(ckpt)
    dumps = workdir / "dumps"
    dumps.mkdir()
    env = sitecustomize_env(workdir / "spy", FSDP_SPY + RANK0_ONLY_SPY,
                            {"DISTIFY_E2E_FSDP_DIR": str(dumps), "DISTIFY_E2E_RANK0_ONLY": str(ckpt)})
    try:
        run_torchrun(script, ["--resume", ckpt, "--epochs", EPOCHS], nproc=2, env=env, cwd=workdir, timeout=timeout)
    except RunFailed:
        return saved, None
    return saved, [torch.load(dumps / f"rank{r}.pt")["params"] for r in range(2)]


def _is_checkpoint(saved: list, ranks) -> bool:
    import torch

    return ranks is not None and all(
        len(found) == len(saved) and all(torch.equal(a, b) for a, b in zip(found, saved)) for found in ranks
    )


@pytest.mark.runs("DST308/resume_args_epoch", "fsdp")
def test_a_load_rank_0_alone_can_see_runs_on_every_rank(tmp_path):
    script = tmp_path / "script" / "resume_args_epoch.py"
    migrate(SOURCE, script, backend="fsdp")
    text = script.read_text()
    assert DECIDED in text, "DST308 did not give the load rank 0's decision"
    saved, ranks = _resumed(script, tmp_path / "run", timeout=180)
    assert _is_checkpoint(saved, ranks), "every rank must hold the checkpoint's model"

    script.write_text(text.replace(DECIDED, "        if os.path.isfile(args.resume):\n"))
    saved, ranks = _resumed(script, tmp_path / "control", timeout=30)
    assert not _is_checkpoint(saved, ranks), "control: rank 1 skipped the load, yet the model is the checkpoint's"


# what makes every rank hold rank 0's resumed state, per backend
BROADCASTS = {
    "ddp": ("    runtime.broadcast_module(model)\n"
            "    optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))\n"),
    "horovod": ("    optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))\n"
                "    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n"),
}


@pytest.mark.parametrize("backend", [executed("DST308/resume_args_epoch", b, b) for b in ("ddp", "horovod")])
def test_a_load_rank_0_alone_can_see_reaches_every_rank(tmp_path, backend):
    import torch

    script = tmp_path / "script" / "resume_args_epoch.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    assert BROADCASTS[backend] in text, text

    def resumed(name: str) -> tuple:
        work = tmp_path / name
        work.mkdir()
        ckpt = work / "checkpoint.pth.tar"
        saved = _checkpoint(ckpt)
        _, ranks = rank_parameters(script, ["--resume", ckpt, "--epochs", EPOCHS], work, backend, RANK0_ONLY_SPY,
                                   {"DISTIFY_E2E_RANK0_ONLY": str(ckpt)}, timeout=180)
        return saved, ranks

    saved, ranks = resumed("run")
    assert _is_checkpoint(saved, ranks), "every rank must hold the checkpoint's model"
    script.write_text(text.replace(BROADCASTS[backend], ""))
    saved, ranks = resumed("control")
    assert torch.equal(ranks[0][0], saved[0]) and not _is_checkpoint(saved, ranks), (
        "control: without the broadcasts rank 1 should keep its fresh model")


@pytest.mark.parametrize("backend", [executed("DST308/resume_args_epoch", b, b) for b in ("ddp", "horovod")])
def test_a_resume_path_found_nowhere_trains_a_fresh_optimizer(tmp_path, backend):
    import torch

    script = tmp_path / "script" / "resume_args_epoch.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    steps_per_rank = 4 * 96 // (2 * 16)  # 4 epochs of 3 batches of 16 on each of 2 ranks

    def adam_steps(path: Path, name: str) -> set:
        work = tmp_path / name
        work.mkdir()
        launcher(backend)(path, ["--resume", "missing.pt"], nproc=2, cwd=work)
        state = torch.load(work / "checkpoint.pth.tar")["optimizer"]["state"]
        return {int(s["step"]) for s in state.values()}

    assert adam_steps(script, "run") == {steps_per_rank}
    if backend == "horovod":
        # control: Horovod's own broadcast_optimizer_state (distify's output before) gives the fresh
        # AdamW a zero-gradient step: one step more on every rank
        decided = "    optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))\n"
        assert decided in text
        script.write_text(text.replace(decided, "    hvd.broadcast_optimizer_state(optimizer, root_rank=0)\n"))
        assert adam_steps(script, "control") == {steps_per_rank + 1}, "control: Horovod's zero-gradient step"
