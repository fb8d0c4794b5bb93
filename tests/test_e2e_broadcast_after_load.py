"""Executed: Horovod's broadcasts follow a load that runs in a function of the script, under a
condition (issue 22, item 3; fixtures/DST112/load_in_function).

The script resumes with ``load_checkpoint(args.resume, model, optimizer)`` inside ``if args.resume:``
and ``if os.path.isfile(args.resume):``. Here only rank 0 can read the checkpoint (a test-only
sitecustomize makes ``os.path.isfile`` answer False for it on every other rank: several nodes, no
shared disk). The checkpoint was saved at epoch 0 and the run trains one epoch: every rank then
starts the same loop (a checkpoint of a later epoch would send rank 1, which read no epoch number,
into epochs rank 0 skips: the second test's subject). Rank 1 gets
the loaded weights from rank 0's broadcast, so the ranks end bit-identical (the gradients are
averaged; each rank's own unseeded data does not matter). Control: the same migrated script with
``hvd.broadcast_parameters`` moved above the ``if`` (before the load) ends with ranks that differ.

The second test resumes fixtures/DST112/resume_epoch from a checkpoint of epoch 1 that only rank 0
can read (its optimizer holds momentum): ``start_epoch`` and ``best_loss``, which the load binds,
are broadcast with the state, and the optimizer state is broadcast because rank 0 says it loaded
one (the load's ``os.path.isfile`` may differ between hosts), so both ranks train epoch 2 alone and
end bit-identical. Controls: without the epoch broadcast rank 1 starts at epoch 0 and the job
fails; without the optimizer-state broadcast rank 1 keeps a fresh momentum and the ranks drift.
The third runs the same under DDP (DST308): rank 0's weights, momentum and epoch reach rank 1
after the load; control: without the state broadcast the ranks drift.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    PARAM_SPY, RANK0_ONLY_SPY, REPO_ROOT, RunFailed, assert_same_weights, executed, migrate, rank_parameters, run_horovodrun,
    run_python, run_torchrun, sitecustomize_env,
)

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST112" / "load_in_function.in.py"
BROADCAST = "    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n"
RESUME = "    if args.resume:\n        if os.path.isfile(args.resume):\n"

def _checkpoint(path: Path) -> None:
    import torch
    import torch.nn as nn

    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.save({"epoch": 0, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


def _final_weights(script: Path, workdir: Path) -> dict:
    import torch

    ckpt = workdir / "resume.pth.tar"
    dumps = workdir / "dumps"
    dumps.mkdir()
    env = sitecustomize_env(workdir / "spy", PARAM_SPY + RANK0_ONLY_SPY,
                            {"DISTIFY_E2E_PARAM_DIR": str(dumps), "DISTIFY_E2E_RANK0_ONLY": str(ckpt)})
    run_horovodrun(script, ["--resume", str(ckpt), "--epochs", "1"], nproc=2, env=env, cwd=workdir)
    return {r: torch.load(dumps / f"rank{r}.pt") for r in range(2)}


def _same(found: list, expected: list) -> bool:
    import torch

    return len(found) == len(expected) and all(torch.equal(a, b) for a, b in zip(found, expected))


@pytest.mark.horovod
@pytest.mark.runs("DST112/load_in_function", "horovod")
@pytest.mark.parametrize("broadcast_first", [False, True], ids=["migrated", "control-broadcast-before-load"])
def test_rank_that_cannot_read_the_checkpoint_gets_its_weights(tmp_path, broadcast_first):
    script = tmp_path / "train.py"
    migrate(SOURCE, script, backend="horovod")
    text = script.read_text()
    assert text.index(RESUME) < text.index(BROADCAST), "distify placed the broadcast before the load"
    if broadcast_first:
        text = text.replace(BROADCAST, "").replace(RESUME, BROADCAST + RESUME)
        script.write_text(text)
    _checkpoint(tmp_path / "resume.pth.tar")
    ranks = _final_weights(script, tmp_path)
    assert ranks[0], "the spy recorded no parameters"
    if broadcast_first:
        assert not _same(ranks[1], ranks[0]), "control: a broadcast before the load still left the ranks equal"
    else:
        assert _same(ranks[1], ranks[0]), "rank 1 trained from other weights than rank 0 loaded"


# ------------------------------------------------------------------------------ the resume epoch
# fixtures/DST112/resume_epoch binds `start_epoch = checkpoint["epoch"] + 1` and `best_loss` from a
# checkpoint only rank 0 can read; saved at epoch 1, the run of 3 epochs resumes at epoch 2
RESUMED = "    start_epoch, best_loss = runtime.broadcast_object((start_epoch, best_loss))\n"


def _epoch_checkpoint(path: Path) -> None:
    import torch
    import torch.nn as nn

    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model(torch.randn(4, 12)).sum().backward()
    optimizer.step()  # a momentum buffer in the checkpoint
    torch.save({"epoch": 1, "best_loss": 0.5, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


STATE = "    optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))\n"


def _resume(script: Path, work: Path, run, **kw):
    """Run `script` on 2 ranks resuming from a checkpoint of epoch 1 that only rank 0 can read; the
    launch's result and the folder of each rank's final parameters."""
    ckpt = work / "resume.pt"
    _epoch_checkpoint(ckpt)
    dumps = work / "dumps"
    dumps.mkdir()
    env = sitecustomize_env(work / "spy", PARAM_SPY + RANK0_ONLY_SPY,
                            {"DISTIFY_E2E_PARAM_DIR": str(dumps), "DISTIFY_E2E_RANK0_ONLY": str(ckpt)})
    return run(script, ["--resume", str(ckpt), "--epochs", "3"], nproc=2, env=env, cwd=work, **kw), dumps


@pytest.mark.horovod
@pytest.mark.runs("DST112/resume_epoch", "horovod")
@pytest.mark.parametrize("removed", [None, RESUMED, STATE],
                         ids=["migrated", "control-no-epoch-broadcast", "control-no-optimizer-state"])
def test_rank_that_cannot_read_the_checkpoint_resumes_at_its_epoch(tmp_path, removed):
    import torch

    script = tmp_path / "train.py"
    migrate(REPO_ROOT / "fixtures" / "DST112" / "resume_epoch.in.py", script, backend="horovod")
    text = script.read_text()
    assert RESUMED in text, "DST112 did not broadcast the values the load binds"
    assert STATE in text, "DST112 did not broadcast the loaded optimizer state"
    if removed:
        script.write_text(text.replace(removed, ""))
    result, dumps = _resume(script, tmp_path, run_horovodrun, timeout=120, check=False)
    if removed == RESUMED:
        # rank 1 starts at epoch 0 and waits for collectives rank 0 never runs: Horovod stops the job
        assert result.returncode != 0, "control: the ranks agreed on the epoch without the broadcast"
        return
    assert result.returncode == 0, result.describe()
    assert "epoch 2 loss" in result.stdout and "epoch 0 loss" not in result.stdout
    ranks = [torch.load(dumps / f"rank{r}.pt") for r in range(2)]
    if removed == STATE:
        assert not _same(ranks[1], ranks[0]), "control: rank 1 kept its fresh momentum and still agreed"
    else:
        assert ranks[0] and _same(ranks[1], ranks[0]), "the ranks trained different epochs or weights"


# DDP (DST308): the wrap broadcast the fresh weights before the load, so rank 0's loaded weights,
# momentum and epoch are broadcast after it
DDP_STATE = ("    runtime.broadcast_module(model)\n"
             "    optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))\n")


@pytest.mark.runs("DST112/resume_epoch", "ddp")
@pytest.mark.parametrize("removed", [None, DDP_STATE], ids=["migrated", "control-no-state-broadcast"])
def test_ddp_rank_that_cannot_read_the_checkpoint_gets_rank0s_state(tmp_path, removed):
    import torch

    script = tmp_path / "train.py"
    migrate(REPO_ROOT / "fixtures" / "DST112" / "resume_epoch.in.py", script, backend="ddp")
    text = script.read_text()
    assert DDP_STATE + RESUMED in text, "DST308 did not broadcast the resumed state"
    if removed:
        script.write_text(text.replace(removed, ""))
    result, dumps = _resume(script, tmp_path, run_torchrun)
    assert "epoch 2 loss" in result.stdout and "epoch 0 loss" not in result.stdout
    ranks = [torch.load(dumps / f"rank{r}.pt") for r in range(2)]
    if removed:
        assert not _same(ranks[1], ranks[0]), "control: rank 1 kept fresh weights and momentum and still agreed"
    else:
        assert ranks[0] and _same(ranks[1], ranks[0]), "the ranks trained different models"


# A load the script itself runs on rank 0 only (`if rank == 0 and args.resume:`, fixtures/DST308/
# rank0_load_after_wrap; pretrained weights under `if rank == 0 and os.path.exists(...)`, before the
# optimizer, rank0_load_before_shard): in the single process it always ran, so every rank must end
# with what it loaded. DDP broadcasts rank 0's weights, momentum and epoch after the `if` (or wraps
# after it: the wrap broadcasts), Horovod broadcasts the parameters and the optimizer state after it.
# Both are seeded and do not shuffle: on 2 ranks of batch 8 each ends with the weights of the original
# (which loads: its one process is rank 0) at batch 16. Control: without the broadcasts (DDP: the wrap before
# the load) rank 1 trains on from its fresh weights and momentum and the ranks differ. Its SGD has
# weight decay: under Horovod rank 0's state dict is broadcast (not hvd.broadcast_optimizer_state,
# which gives rank 1's empty optimizer a zero-gradient step whose weight decay changes rank 1's
# weights); control: that call after the parameters, and the ranks end apart.
HVD_STATE = "optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))\n"
OLD_HVD_STATE = ("if runtime.broadcast_object(len(optimizer.state) > 0):\n"
                 "    hvd.broadcast_optimizer_state(optimizer, root_rank=0)\n")
HVD_PARAMS = "hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n"
RANK0_LOADS = {
    ("rank0_load_after_wrap", "ddp"): {
        "runtime.broadcast_module(model)\n"
        "optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))\n"
        "start_epoch = runtime.broadcast_object(start_epoch)\n":
        "start_epoch = runtime.broadcast_object(start_epoch)\n"},  # (the epoch kept: as many steps)
    ("rank0_load_after_wrap", "horovod"): {
        HVD_STATE + HVD_PARAMS + "start_epoch = runtime.broadcast_object(start_epoch)\n":
        "start_epoch = runtime.broadcast_object(start_epoch)\n"},
    ("rank0_load_before_shard", "ddp"): {
        "model = runtime.DDP(model)\n": "",
        "if rank == 0 and os.path.exists(": "model = runtime.DDP(model)\nif rank == 0 and os.path.exists(",
        "    model.load_state_dict(": "    model.module.load_state_dict("},
    ("rank0_load_before_shard", "horovod"): {"hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n": ""},
}


def _rank0_checkpoints(work: Path) -> None:
    """ckpt.pt (a model with a momentum buffer, epoch 0) and pretrained.pt (other weights) in `work`."""
    import torch
    import torch.nn as nn

    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(7)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()  # a momentum buffer to resume
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 0}, work / "ckpt.pt")
    pretrained = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))  # rank0_load_before_shard's model
    torch.save(pretrained.state_dict(), work / "pretrained.pt")


@pytest.mark.parametrize("case,backend", [executed(f"DST308/{case}", backend, case, backend, id=f"{case}-{backend}")
                                          for case, backend in RANK0_LOADS])
def test_load_on_rank0_only_reaches_every_rank(tmp_path, case, backend):
    import torch

    script = tmp_path / "train.py"
    source = REPO_ROOT / "fixtures" / "DST308" / f"{case}.in.py"
    migrate(source, script, backend=backend)
    text = script.read_text()
    edits = RANK0_LOADS[case, backend]
    assert all(old in text for old in edits), "DST308 did not broadcast the state rank 0 loaded"
    resume = case == "rank0_load_after_wrap"
    args = ["--resume", "ckpt.pt", "--epochs", 2] if resume else []

    def ranks(path: Path, name: str) -> list:
        work = tmp_path / name
        _rank0_checkpoints(work)
        return rank_parameters(path, args, work, backend)[1]

    migrated = ranks(script, "migrated")
    assert migrated[0] and _same(migrated[1], migrated[0]), "the ranks trained different models"
    # both seeded and unshuffled: the original (loading on its one rank, rank 0) at twice the batch
    original = tmp_path / "original"
    _rank0_checkpoints(original)
    (original / "train.py").write_text(source.read_text().replace("batch_size=8", "batch_size=16"))
    run_python(original / "train.py", args, cwd=original)
    final = (lambda d: torch.load(d / "last.pt")["model"]) if resume else (lambda d: torch.load(d / "final.pt"))
    assert_same_weights(final(original), final(tmp_path / "migrated"), label=f"{backend}, 2 ranks x 8 vs batch 16")
    control = tmp_path / "control.py"
    broken = text
    for old, new in edits.items():
        broken = broken.replace(old, new)
    assert broken != text
    control.write_text(broken)
    found = ranks(control, "control")
    assert not _same(found[1], found[0]), "control: rank 1 kept its fresh weights and momentum and still agreed"
    if resume and backend == "horovod":
        assert HVD_STATE + HVD_PARAMS in text
        control.write_text(text.replace(HVD_STATE + HVD_PARAMS, HVD_PARAMS + OLD_HVD_STATE))
        found = ranks(control, "control-order")
        assert not _same(found[1], found[0]), "control: rank 1's zero-gradient step left its weights as rank 0's"


# The two DST112 shapes under DDP and FSDP, a checkpoint only rank 0 can read, resumed with nothing
# left to train (--epochs at the checkpoint's next epoch): every rank must end holding the
# checkpoint's model. DDP broadcasts rank 0's module after the load; FSDP loads on every rank or on
# none, as rank 0 answers the test (each rank takes its shards). Controls: without the broadcast
# (DDP), with each host's own answer (FSDP: rank 1 skips the load's collectives), the ranks fail or
# end with a model that is not the checkpoint's.
DDP_MODULE = "    runtime.broadcast_module(model)\n"
HOST_TEST = {"load_in_function": ("runtime.broadcast_object(os.path.isfile(args.resume))", "os.path.isfile(args.resume)"),
             "resume_epoch": ("runtime.broadcast_object(args.resume and os.path.isfile(args.resume))",
                              "args.resume and os.path.isfile(args.resume)")}
CHECKPOINTS = {"load_in_function": (_checkpoint, ["--epochs", 0]), "resume_epoch": (_epoch_checkpoint, ["--epochs", 2])}


@pytest.mark.parametrize("case,backend", [
    executed(f"DST112/{case}", backend, case, backend, id=f"{case}-{backend}")
    for case, backend in (("load_in_function", "ddp"), ("load_in_function", "fsdp"), ("resume_epoch", "fsdp"))
])
def test_rank_that_cannot_read_the_checkpoint_holds_it(tmp_path, case, backend):
    import torch

    script = tmp_path / "train.py"
    migrate(REPO_ROOT / "fixtures" / "DST112" / f"{case}.in.py", script, backend=backend)
    text = script.read_text()
    decided, alone = (DDP_MODULE, "") if backend == "ddp" else HOST_TEST[case]
    assert decided in text, text
    write, args = CHECKPOINTS[case]

    def ranks(name: str, timeout: float):
        work = tmp_path / name
        work.mkdir()
        ckpt = work / "resume.pt"
        write(ckpt)
        saved = torch.load(ckpt)
        saved = [t for k, t in (saved.get("state_dict") or saved["model"]).items()]
        _, found = rank_parameters(script, ["--resume", ckpt, *args], work, backend, RANK0_ONLY_SPY,
                                   {"DISTIFY_E2E_RANK0_ONLY": str(ckpt)}, timeout=timeout)
        return saved, found

    saved, found = ranks("migrated", 180)
    assert all(_same(r, saved) for r in found), "every rank must hold the checkpoint's model"
    script.write_text(text.replace(decided, alone))
    try:
        saved, found = ranks("control", 15)  # (FSDP: rank 1 hangs in the load's collectives)
    except RunFailed:
        return  # rank 1 left the others waiting in the load's collectives
    assert not all(_same(r, saved) for r in found), "control: rank 1 skipped the load, yet holds the checkpoint"


# A rank-0-only resume that restores the LR scheduler too (fixtures/DST308/rank0_load_scheduler):
# rank 0's StepLR resumes at its epoch, and every rank must decay at the same epochs. The checkpoint
# holds a StepLR(step_size=3) stepped twice, so rank 0 decays after the next epoch while a rank with a
# fresh scheduler would decay two epochs later: the averaged gradients are applied with two learning
# rates and the ranks part. Control: the scheduler's broadcast removed.
SCHEDULER_BROADCAST = "scheduler.load_state_dict(runtime.broadcast_object(scheduler.state_dict()))\n"


@pytest.mark.parametrize("backend", [executed("DST308/rank0_load_scheduler", b, b) for b in ("ddp", "horovod")])
def test_a_scheduler_resumed_on_rank0_only_reaches_every_rank(tmp_path, backend):
    import torch
    import torch.nn as nn

    script = tmp_path / "train.py"
    migrate(REPO_ROOT / "fixtures" / "DST308" / "rank0_load_scheduler.in.py", script, backend=backend)
    text = script.read_text()
    assert SCHEDULER_BROADCAST in text, "the scheduler's state is not broadcast after the load"
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()  # a momentum buffer (and the lr in the optimizer's groups) to resume
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    scheduler.step()
    scheduler.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "epoch": 0}, tmp_path / "ckpt.pt")
    launch = run_horovodrun if backend == "horovod" else run_torchrun

    def ranks(path: Path, name: str) -> list:
        dumps = tmp_path / name
        dumps.mkdir()
        env = sitecustomize_env(tmp_path / f"spy-{name}", PARAM_SPY, {"DISTIFY_E2E_PARAM_DIR": str(dumps)})
        launch(path, ["--resume", tmp_path / "ckpt.pt", "--epochs", 3], nproc=2, env=env, cwd=tmp_path)
        return [torch.load(dumps / f"rank{r}.pt") for r in range(2)]

    migrated = ranks(script, "migrated")
    assert migrated[0] and _same(migrated[1], migrated[0]), "the ranks trained with different learning rates"
    control = tmp_path / "control.py"
    control.write_text(text.replace(SCHEDULER_BROADCAST, ""))
    found = ranks(control, "control")
    assert not _same(found[1], found[0]), "control: rank 1's fresh scheduler still agreed with rank 0's"


# Plain SGD (no momentum) keeps no state, loaded or not: the resumed learning rate is in its param
# groups. fixtures/DST308/rank0_load_plain_sgd resumes on rank 0 only from a checkpoint whose StepLR
# has decayed the rate (0.1 -> 0.05); StepLR scales the group's own rate, so a rank left with the
# fresh groups trains at 0.1 for good. Migrated, rank 0's whole state dict reaches every rank: the
# ranks end identical, with the weights of the original (which loads: its one process is rank 0) at
# twice the batch. Control: the old output, which sent the optimizer only when rank 0's state was
# not empty (DDP: load_state_dict under that test; Horovod: hvd.broadcast_optimizer_state, which
# also leaves the groups alone), and the ranks part.
PLAIN_SGD = {
    "ddp": ("optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))\n",
            "if runtime.broadcast_object(len(optimizer.state) > 0):\n"
            "    optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))\n"),
    "horovod": ("optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))\n", OLD_HVD_STATE),
}


@pytest.mark.parametrize("backend", [executed("DST308/rank0_load_plain_sgd", b, b) for b in ("ddp", "horovod")])
def test_plain_sgd_resumed_on_rank0_only_takes_rank0s_learning_rate(tmp_path, backend):
    import torch
    import torch.nn as nn

    source = REPO_ROOT / "fixtures" / "DST308" / "rank0_load_plain_sgd.in.py"
    script = tmp_path / "train.py"
    migrate(source, script, backend=backend)
    text = script.read_text()
    new, old = PLAIN_SGD[backend]
    assert new in text, text

    def checkpoint(work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(7)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        for _ in range(3):
            scheduler.step()
        assert optimizer.param_groups[0]["lr"] == 0.05 and not optimizer.state
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "epoch": 0}, work / "ckpt.pt")

    args = ["--resume", "ckpt.pt", "--epochs", 3]

    def ranks(path: Path, name: str) -> list:
        work = tmp_path / name
        checkpoint(work)
        return rank_parameters(path, args, work, backend)[1]

    migrated = ranks(script, "migrated")
    assert migrated[0] and _same(migrated[1], migrated[0]), "the ranks trained at different learning rates"
    original = tmp_path / "original"
    checkpoint(original)
    (original / "train.py").write_text(source.read_text().replace("batch_size=8", "batch_size=16"))
    run_python(original / "train.py", args, cwd=original)
    last = lambda d: torch.load(d / "last.pt")["model"]  # noqa: E731
    assert_same_weights(last(original), last(tmp_path / "migrated"), label=f"{backend}, 2 ranks x 8 vs batch 16")
    control = tmp_path / "control.py"
    control.write_text(text.replace(new, old))
    found = ranks(control, "control")
    assert not _same(found[1], found[0]), "control: rank 1's fresh learning rate still agreed with rank 0's"


# The scheduler restored inside the script's own helper (fixtures/DST308/scheduler_loaded_in_function:
# `load_checkpoint(path, model, optimizer, scheduler)` under `os.path.isfile`), the checkpoint visible
# to rank 0 only: the scheduler's state is broadcast with the rest (distify.resume.schedulers_loaded
# follows the helper), so both ranks decay at the same epochs and end identical. Control: without the
# scheduler's broadcast (the old output) rank 1 decays two epochs later and the ranks part.
# FSDP loads on every rank or on none, as rank 0 answers the host's test (each rank cuts its shards):
# the ranks end identical; the control of that decision is test_rank_that_cannot_read_the_checkpoint_holds_it's.
@pytest.mark.parametrize("backend", [executed("DST308/scheduler_loaded_in_function", b, b) for b in ("ddp", "horovod", "fsdp")])
def test_a_scheduler_restored_in_a_helper_reaches_every_rank(tmp_path, backend):
    import torch
    import torch.nn as nn

    script = tmp_path / "train.py"
    migrate(REPO_ROOT / "fixtures" / "DST308" / "scheduler_loaded_in_function.in.py", script, backend=backend)
    text = script.read_text()
    fsdp = backend == "fsdp"
    if fsdp:
        assert "if runtime.broadcast_object(args.resume and os.path.isfile(args.resume)):" in text, text
    else:
        assert SCHEDULER_BROADCAST in text, "the scheduler's state is not broadcast after the helper's load"
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    scheduler.step()
    scheduler.step()
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "epoch": 0}, ckpt)

    def ranks(path: Path, name: str) -> list:
        return rank_parameters(path, ["--resume", ckpt, "--epochs", 3], tmp_path / name, backend, RANK0_ONLY_SPY,
                               {"DISTIFY_E2E_RANK0_ONLY": str(ckpt)})[1]

    migrated = ranks(script, "migrated")
    assert migrated[0] and _same(migrated[1], migrated[0]), "the ranks trained with different learning rates"
    if fsdp:
        return
    control = tmp_path / "control.py"
    control.write_text(text.replace(SCHEDULER_BROADCAST, ""))
    found = ranks(control, "control")
    assert not _same(found[1], found[0]), "control: rank 1's fresh scheduler still agreed with rank 0's"
