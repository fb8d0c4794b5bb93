"""FSDP2 state that leaves and enters the process, and accumulation (DST307, DST402), executed.

Under ``torchrun --nproc-per-node 2`` (gloo, CPU):
- accumulation: 2 ranks x batch B x A micro-batches end with the original's weights at batch
  2·B x A micro-batches (< 1e-5), with a micro-batch left over at the end of every pass (FSDP keeps
  its unsynced gradients past optimizer.zero_grad(): the last micro-batch must sync), reduce-scattering
  gradients once per optimizer step plus once for each remainder; a control copy without
  ``set_requires_gradient_sync`` reduce-scatters on every micro-batch (the switch is a saving, not
  a correctness fix: that copy's weights are the same, so the count tells them apart);
- checkpoints: the file the migrated script writes (``get_model_state_dict``) loads with a plain
  ``load_state_dict`` into the ORIGINAL class; a control that saves ``model.state_dict()`` (the
  shards) does not;
- resume: a 2-rank run of one epoch, resumed for one more under 2 ranks and under plain python
  (loaded whole before ``fully_shard`` shards it), ends where the original ends after two epochs (plain SGD: a resumed
  epoch is the next epoch).
"""
from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import SCENARIOS, assert_same_weights, load_state, migrate, run_python, run_torchrun  # noqa: E402

pytestmark = pytest.mark.e2e

# 512 samples: 16 micro-batches per rank and pass, so with A = 3 one is left over at every pass's end
B, ACCUM, NPROC, EPOCHS = 16, 3, 2, 2
MICRO = 512 // NPROC // B
COUNTER = Path(__file__).resolve().parent / "scripts" / "count_reduce_scatter.py"
ACCUMULATION = SCENARIOS / "accumulation.in.py"
RESUME = SCENARIOS / "resume.in.py"
SYNC = "model.set_requires_gradient_sync((step + 1) % args.accum_steps == 0 or step + 1 == len(loader))"
GATHER = "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))"


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsdp-state")
    out = {}
    for src in (ACCUMULATION, RESUME):
        target = folder / src.name.replace(".in.py", ".py")
        migrate(src, target, backend="fsdp")
        text = target.read_text()
        assert "fully_shard(" in text, text
        out[src.name.split(".")[0]] = target
    assert SYNC in out["accumulation"].read_text()
    resume = out["resume"].read_text()
    # The resume load comes before fully_shard (the wrap follows the last change to the model): a
    # plain load of the full weights on every rank, which fully_shard then cuts into shards.
    load = "model.load_state_dict(torch.load(args.resume"
    assert GATHER in resume and load in resume and resume.index(load) < resume.index("fully_shard(model)"), resume
    return out


def _accum_args(batch, accum):
    return ["--batch-size", batch, "--accum-steps", accum, "--epochs", EPOCHS, "--checkpoint", "final.pt"]


def _counted(script: Path, workdir: Path):
    out = workdir / "counts"
    out.mkdir(parents=True)
    run_torchrun(COUNTER, [out, script, *_accum_args(B, ACCUM)], nproc=NPROC, cwd=workdir)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(NPROC)]


@pytest.fixture(scope="module")
def accumulated(migrated, tmp_path_factory):
    """The migrated accumulation script on 2 ranks, its reduce-scatters and steps counted (the
    counter runs the script unchanged: its final.pt serves the weights test too)."""
    work = tmp_path_factory.mktemp("fsdp-accum")
    return work, _counted(migrated["accumulation"], work)


def test_accumulated_weights_match_the_big_batch(accumulated, tmp_path_factory):
    big = tmp_path_factory.mktemp("fsdp-accum-big")
    run_python(ACCUMULATION, _accum_args(NPROC * B, ACCUM), cwd=big)
    work, _ = accumulated
    assert_same_weights(load_state(big / "final.pt"), load_state(work / "final.pt"), atol=1e-5, label="fsdp accumulation")


def test_one_reduce_scatter_round_per_optimizer_step(migrated, accumulated, tmp_path):
    _, synced = accumulated
    control = tmp_path / "control.py"
    text = migrated["accumulation"].read_text()
    control.write_text("".join(line for line in text.splitlines(True) if "set_requires_gradient_sync" not in line))
    every = _counted(control, tmp_path)
    syncs = EPOCHS * -(-MICRO // ACCUM)  # the steps, and each pass's remainder
    for s, e in zip(synced, every):
        assert s["steps"] == e["steps"] == EPOCHS * (MICRO // ACCUM), (s, e)
        groups = s["reduce_scatter"] // syncs
        assert groups > 0 and s["reduce_scatter"] == syncs * groups, s
        assert e["reduce_scatter"] == EPOCHS * MICRO * groups, (s, e)


def _resume_args(batch, checkpoint, resume=None):
    args = ["--batch-size", batch, "--epochs", 1, "--checkpoint", checkpoint]
    return args + ["--resume", resume] if resume else args


@pytest.fixture(scope="module")
def resumed(migrated, tmp_path_factory):
    """Original, two epochs at 2B; migrated, one epoch on 2 ranks, then resumed from its
    checkpoint for one more on 2 ranks and in one plain process."""
    work = tmp_path_factory.mktemp("fsdp-resume")
    run_python(RESUME, ["--batch-size", NPROC * B, "--epochs", 2, "--checkpoint", "original.pt"], cwd=work)
    script = migrated["resume"]
    run_torchrun(script, _resume_args(B, "first.pt"), nproc=NPROC, cwd=work)
    out = run_torchrun(script, _resume_args(B, "ranks.pt", "first.pt"), nproc=NPROC, cwd=work)
    assert out.stdout.count("resumed from first.pt") == 1, out.stdout
    run_python(script, _resume_args(NPROC * B, "plain.pt", "first.pt"), cwd=work)
    return work


def test_resume_under_two_ranks_and_plain_python(resumed):
    original = load_state(resumed / "original.pt")
    assert_same_weights(original, load_state(resumed / "ranks.pt"), atol=1e-5, label="resumed on 2 ranks")
    assert_same_weights(original, load_state(resumed / "plain.pt"), atol=1e-5, label="resumed under plain python")


def _load_into_original(path: Path):
    import torch

    classifier = runpy.run_path(str(RESUME), run_name="original")["Classifier"]()
    classifier.load_state_dict(torch.load(str(path)))  # the original's own, plain load
    return classifier


def test_checkpoint_loads_into_the_original_model(resumed):
    saved = load_state(resumed / "ranks.pt")
    model = _load_into_original(resumed / "ranks.pt")
    assert list(model.state_dict()) == list(saved)
    assert_same_weights(model.state_dict(), load_state(resumed / "original.pt"), atol=1e-5, label="loaded")


def test_control_a_saved_shard_does_not_load_into_the_original(migrated, tmp_path):
    text = migrated["resume"].read_text()
    control = tmp_path / "control.py"
    control.write_text(text.replace(GATHER, "model.state_dict()"))
    run_torchrun(control, _resume_args(B, "shards.pt"), nproc=NPROC, cwd=tmp_path)
    with pytest.raises(Exception):
        _load_into_original(tmp_path / "shards.pt")


ADAM = Path(__file__).resolve().parent.parent / "fixtures" / "DST307" / "resume_adam.in.py"


def test_optimizer_state_crosses_between_the_original_and_the_sharded_script(tmp_path):
    """Adam's moments survive both ways: a checkpoint of the single-GPU script (optimizer state
    keyed by position) resumes on 2 ranks (re-keyed by name before set_optimizer_state_dict,
    which would otherwise drop it), and the sharded script's checkpoint (keyed by name) resumes
    in the original with its plain optimizer.load_state_dict. Each leg is one epoch at the same
    global batch, so the chain equals the original's 2 and 3 epochs."""
    script = tmp_path / "resume_adam.py"
    migrate(ADAM, script, backend="fsdp")
    assert "rekey_optim_state_dict(ckpt[\"optimizer\"], OptimStateKeyType.PARAM_NAME" in script.read_text()

    def original(*args):
        run_python(ADAM, ["--batch-size", NPROC * B, *map(str, args)], cwd=tmp_path)

    original("--epochs", 1, "--checkpoint", "single1.pt")
    run_torchrun(script, ["--batch-size", B, "--resume", "single1.pt", "--checkpoint", "sharded2.pt"], nproc=NPROC, cwd=tmp_path)
    original("--epochs", 1, "--resume", "sharded2.pt", "--checkpoint", "back3.pt")
    original("--epochs", 2, "--checkpoint", "single2.pt")
    original("--epochs", 3, "--checkpoint", "single3.pt")
    for got, want in (("sharded2.pt", "single2.pt"), ("back3.pt", "single3.pt")):
        a, b = load_state(tmp_path / got), load_state(tmp_path / want)
        assert_same_weights(a["model"], b["model"], atol=1e-5, label=f"{got} vs {want}")


# reload_each_epoch's shape (fixtures/DST306): the checkpoint of the previous epoch, model AND
# optimizer, is read back at the top of every epoch; seeded, so that every rank builds the same data
RELOAD_EACH_EPOCH = '''\
import argparse
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default="final.pt")
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=args.batch_size)
    model = nn.Sequential(nn.Linear(8, 6), nn.Linear(6, 1))
    optimizer = OPTIMIZER
    for epoch in range(4):
        if epoch > 0:
            state = torch.load("checkpoint.pt")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        for xb, yb in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(xb), yb).backward()
            optimizer.step()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "checkpoint.pt")
    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
'''
OPTIMIZERS = {
    # keeps no tensor per parameter: torch's full-state optimizer load fails on it
    "sgd": "torch.optim.SGD(model.parameters(), lr=0.05)",
    # keeps a momentum buffer per parameter: resuming must carry it (a reset one changes the weights)
    "momentum": "torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)",
}
OLD_OPTIONS = "StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)"


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_model_and_optimizer_reloaded_every_epoch(tmp_path, optimizer):
    """2 ranks x batch B, the checkpoint reloaded at every epoch's top, end where the original ends
    at batch 2B (so the optimizer state crossed every reload intact); the same script under plain
    python too. Control: the options distify wrote before (full_state_dict with
    broadcast_from_rank0 for the optimizer) fail on SGD without momentum ("Expected device to be
    set"), on 2 ranks as in one process."""
    src = tmp_path / "reload.in.py"
    src.write_text(RELOAD_EACH_EPOCH.replace("OPTIMIZER", OPTIMIZERS[optimizer]))
    script = tmp_path / "reload.py"
    migrate(src, script, backend="fsdp")
    text = script.read_text()
    assert "set_optimizer_state_dict(" in text and OLD_OPTIONS not in text, text
    run_python(src, ["--batch-size", NPROC * B, "--out", "original.pt"], cwd=tmp_path)
    run_torchrun(script, ["--batch-size", B, "--out", "ranks.pt"], nproc=NPROC, cwd=tmp_path)
    run_python(script, ["--batch-size", NPROC * B, "--out", "plain.pt"], cwd=tmp_path)
    original = load_state(tmp_path / "original.pt")
    assert_same_weights(original, load_state(tmp_path / "ranks.pt"), atol=1e-5, label="2 ranks")
    assert_same_weights(original, load_state(tmp_path / "plain.pt"), atol=1e-5, label="plain python")
    if optimizer == "sgd":
        lines = text.splitlines()
        i = next(i for i, line in enumerate(lines) if "set_optimizer_state_dict(" in line)
        lines[i] = lines[i].replace("options=StateDictOptions()", f"options={OLD_OPTIONS}")
        control = tmp_path / "control.py"
        control.write_text("\n".join(lines) + "\n")
        for run in (lambda: run_torchrun(control, ["--batch-size", B], nproc=NPROC, cwd=tmp_path, check=False),
                    lambda: run_python(control, ["--batch-size", NPROC * B], cwd=tmp_path, check=False)):
            out = run()
            assert out.returncode != 0 and "Expected device to be set" in out.stdout + out.stderr


RETURNED = Path(__file__).resolve().parent.parent / "fixtures" / "DST902" / "model_parameter.in.py"


def test_a_model_returned_by_train_is_saved_whole(tmp_path):
    """fixtures/DST902/model_parameter: `train()` shards the model and returns it (`return
    model.module` in the input), the caller saves `trained.state_dict()`. On 2 ranks the file loads
    into the original's plain nn.Linear; control: the caller's plain state_dict() (what distify
    wrote before it followed the return value) saves DTensor shards that do not."""
    import torch

    script = tmp_path / "model_parameter.py"
    migrate(RETURNED, script, backend="fsdp")
    text = script.read_text()
    assert "get_model_state_dict(trained, options=" in text, text
    control = tmp_path / "control.py"
    control.write_text(text.replace("torch.save(trained_state,", "torch.save(trained.state_dict(),"))
    for name, script_ in (("whole", script), ("shards", control)):
        (tmp_path / name).mkdir()
        run_torchrun(script_, [], nproc=NPROC, cwd=tmp_path / name)
    torch.nn.Linear(2, 1).load_state_dict(torch.load(str(tmp_path / "whole" / "model.pt")))
    with pytest.raises(RuntimeError):
        torch.nn.Linear(2, 1).load_state_dict(torch.load(str(tmp_path / "shards" / "model.pt"), weights_only=False))
