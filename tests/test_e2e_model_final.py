"""Executed: the DDP wrap comes after the last change to the model's parameters (issue 22, item 3).

fixtures/DST101/init_after_build.in.py builds two networks, then either loads saved weights
(``--epoch N``) or re-initialises them with ``.apply(weights_init_normal)`` from the unseeded global
generator, and only then builds the optimizer (the CycleGAN layout). Wrapped before that ``if``,
every rank would draw its own weights after DDP's broadcast and train its own model, silently.

- a fresh run (the ``.apply`` branch, 2 ranks under torchrun): every rank holds the same
  parameters at the end (a test-only sitecustomize dumps each rank's optimizer parameters);
- a resumed run (the load branch, deterministic): the checkpoint equals the original's at batch 2B;
- control: the same migrated script with the wraps moved back above the ``if`` (where distify put
  them before) ends with ranks that differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    PARAM_SPY,
    REPO_ROOT,
    RunFailed,
    assert_same_weights,
    executed,
    launcher,
    load_state,
    migrate,
    run_horovodrun,
    run_python,
    run_torchrun,
    sitecustomize_env,
)

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST101" / "init_after_build.in.py"
B = 16
NPROC = 2
WRAPS = (
    "G_AB = runtime.DDP(G_AB, device_ids=runtime.device_ids())\n"
    "G_BA = runtime.DDP(G_BA, device_ids=runtime.device_ids())\n"
)
BRANCHES = "\nif opt.epoch != 0:\n"


def _saved_models(workdir: Path) -> None:
    """saved_models/G_AB_1.pth and G_BA_1.pth: the weights the resumed runs load."""
    import torch

    g = torch.Generator().manual_seed(11)
    shapes = {"net.0.weight": (16, 6), "net.0.bias": (16,), "net.2.weight": (6, 16), "net.2.bias": (6,)}
    (workdir / "saved_models").mkdir(parents=True)
    for name in ("G_AB", "G_BA"):
        state = {k: torch.randn(*s, generator=g) for k, s in shapes.items()}
        torch.save(state, workdir / "saved_models" / f"{name}_1.pth")


def _ranks(script: Path, workdir: Path, args, launch=run_torchrun) -> dict:
    """Launch on NPROC ranks in `workdir`; each rank's optimizer parameters at exit. The warm
    launcher reseeds each forked rank from the OS as a fresh process is seeded (forked_main; checked
    against real launches in test_warm_launcher), so an unseeded init differs between ranks here as
    it does under torchrun, and cannot agree by accident."""
    import torch

    dumps = workdir / "dumps"
    dumps.mkdir(parents=True)
    env = sitecustomize_env(workdir / "spy", PARAM_SPY, {"DISTIFY_E2E_PARAM_DIR": str(dumps)})
    launch(script, args, nproc=NPROC, env=env, cwd=workdir)
    return {r: torch.load(dumps / f"rank{r}.pt") for r in range(NPROC)}


def _same_on_every_rank(ranks: dict) -> bool:
    import torch

    return all(
        len(ranks[r]) == len(ranks[0]) and all(torch.equal(a, b) for a, b in zip(ranks[0], ranks[r]))
        for r in ranks
    )


def _args(batch, epoch=0):
    return ["--batch-size", batch, "--epochs", 2, "--epoch", epoch, "--checkpoint", "final.pt"]


@pytest.mark.runs("DST101/init_after_build", "ddp")
def test_wrap_after_apply_init_and_load(tmp_path):
    script = tmp_path / "script" / "init_after_build.py"
    migrate(SOURCE, script, backend="ddp")
    text = script.read_text()
    assert text.index(BRANCHES) < text.index(WRAPS), "the wraps must follow the load/init branches"

    fresh = _ranks(script, tmp_path / "fresh", _args(B))
    assert fresh[0], "no optimizer parameters were recorded"
    assert _same_on_every_rank(fresh), "ranks trained different models after .apply(init_fn)"

    original = tmp_path / "original"
    _saved_models(original)
    run_python(SOURCE, _args(NPROC * B, epoch=1), cwd=original)
    resumed = tmp_path / "resumed"
    _saved_models(resumed)
    assert _same_on_every_rank(_ranks(script, resumed, _args(B, epoch=1)))
    assert_same_weights(load_state(original / "final.pt"), load_state(resumed / "final.pt"), atol=1e-5,
                        label=f"resumed, 2 ranks x {B} vs batch {NPROC * B}")

    # control: the wraps where they were before (above the branches) -> each rank keeps its own init
    early = tmp_path / "script" / "wrapped_early.py"
    moved = text.replace(WRAPS, "").replace(BRANCHES, "\n" + WRAPS + BRANCHES)
    moved = moved.replace("G_AB.load_state_dict(", "G_AB.module.load_state_dict(")
    moved = moved.replace("G_BA.load_state_dict(", "G_BA.module.load_state_dict(")
    assert moved != text
    early.write_text(moved)
    assert not _same_on_every_rank(_ranks(early, tmp_path / "control", _args(B))), (
        "control: with the wrap before .apply(init_fn) the ranks should differ"
    )


def test_wrap_after_an_init_in_another_module(tmp_path):
    """fixtures/projects/init_in_module: `initialize_weights(net)`, imported from the project's
    nets.py, draws the weights from the unseeded global generator after the model is built; the DDP
    wrap must follow it. Each rank seeds itself from the OS, as under torchrun: every rank
    ends with the same parameters. Control: the wrap moved back above the call (where distify put
    it while it did not read nets.py) leaves the ranks different."""
    from test_project_goldens import migrated_copy

    project = tmp_path / "project"
    migrated_copy("init_in_module", "ddp", project)
    script = project / "train.py"
    text = script.read_text()
    call, wrap = "initialize_weights(net)\n", "net = runtime.DDP(net, device_ids=runtime.device_ids())\n"
    assert text.index(call) < text.index(wrap), "the wrap must follow the initialisation"
    args = ["--batch-size", 8, "--epochs", 1, "--checkpoint", "final.pt"]
    ranks = _ranks(script, tmp_path / "run", args)
    assert ranks[0] and _same_on_every_rank(ranks), "ranks trained different models after initialize_weights(net)"

    script.write_text(text.replace(wrap, "").replace(call, wrap + call))
    assert not _same_on_every_rank(_ranks(script, tmp_path / "control", args)), (
        "control: with the wrap before initialize_weights(net) the ranks should differ"
    )


OTHER_NAMES = REPO_ROOT / "fixtures" / "DST101" / "init_under_other_names.in.py"
BUILT = "G_BA = Mapper(6)\n"
REINIT = "reinit(layers=[G_AB.dec, G_BA.dec], init_fn=weights_init_uniform)\n"
SETUP = {  # what makes the ranks start from one model, per backend
    "ddp": ("G_AB = runtime.DDP(G_AB)\nG_BA = runtime.DDP(G_BA)\n", run_torchrun),
    "horovod": ("hvd.broadcast_parameters(G_AB.state_dict(), root_rank=0)\n"
                "hvd.broadcast_parameters(G_BA.state_dict(), root_rank=0)\n", run_horovodrun),
}


@pytest.mark.parametrize("backend", [executed("DST101/init_under_other_names", b, b) for b in ("ddp", "horovod")])
def test_wrap_after_inits_that_reach_the_model_under_other_names(tmp_path, backend):
    """fixtures/DST101/init_under_other_names: the networks are initialised through a dict's
    ``.items()`` before the optimizer and through a list of their submodules handed by keyword to
    the script's own ``reinit`` after it, from the unseeded global generator. Real launches: every
    rank ends with the same parameters; seeded, the run equals the original at twice the batch.
    Control: the wrap (Horovod: the broadcast) where distify put it while it matched only the
    model's own name leaves the ranks different."""
    setup, launch = SETUP[backend]
    script = tmp_path / "script" / "init_under_other_names.py"
    migrate(OTHER_NAMES, script, backend=backend)
    text = script.read_text()
    assert text.index(REINIT) < text.index(setup), "the wrap/broadcast must follow the re-initialisation"
    args = ["--batch-size", B, "--epochs", 1, "--checkpoint", "final.pt"]

    fresh = _ranks(script, tmp_path / "fresh", args, launch=launch)
    assert fresh[0] and _same_on_every_rank(fresh), "ranks trained different models after the inits"

    original = tmp_path / "original"
    original.mkdir()
    seeded = ["--seed", 3, "--batch-size", B, "--epochs", 1, "--checkpoint", "final.pt"]
    run_python(OTHER_NAMES, [*seeded[:3], NPROC * B, *seeded[4:]], cwd=original)
    migrated = tmp_path / "seeded"
    migrated.mkdir()
    launch(script, seeded, nproc=NPROC, cwd=migrated)
    assert_same_weights(load_state(original / "final.pt"), load_state(migrated / "final.pt"), atol=1e-5,
                        label=f"{backend}, 2 ranks x {B} vs batch {NPROC * B}")

    # control: the wrap/broadcast where it was before (after the construction, or before `reinit`)
    early = text.replace(setup, "")
    if backend == "ddp":
        early = early.replace(BUILT, BUILT + setup).replace("[G_AB.dec, G_BA.dec]", "[G_AB.module.dec, G_BA.module.dec]")
    else:
        early = early.replace(REINIT, setup + REINIT)
    assert early != text
    script.write_text(early)
    assert not _same_on_every_rank(_ranks(script, tmp_path / "control", args, launch=launch)), (
        "control: with the wrap/broadcast before an initialisation the ranks should differ"
    )


@pytest.mark.runs("DST101/init_under_other_names", "fsdp")
def test_shard_after_inits_that_reach_the_model_under_other_names(tmp_path):
    """The same fixture under FSDP (fully_shard after both initialisations; `reinit` moves above
    the optimizer with it), seeded: the 2-rank run equals the original at twice the batch. Control:
    shards made right after the construction, where distify put them while it matched only the
    model's own name, each rank initialises its own shard from the shared seed, and the model is no
    longer the original's."""
    shards = "fully_shard(G_AB)\nfully_shard(G_BA)\n"
    script = tmp_path / "script" / "init_under_other_names.py"
    migrate(OTHER_NAMES, script, backend="fsdp")
    text = script.read_text()
    assert text.index(REINIT) < text.index(shards), "the shard must follow the re-initialisation"
    seeded = ["--seed", 3, "--batch-size", B, "--epochs", 1, "--checkpoint", "final.pt"]
    original = tmp_path / "original"
    original.mkdir()
    run_python(OTHER_NAMES, [*seeded[:3], NPROC * B, *seeded[4:]], cwd=original)
    want = load_state(original / "final.pt")

    def run(folder: str) -> dict:
        work = tmp_path / folder
        work.mkdir()
        run_torchrun(script, seeded, nproc=NPROC, cwd=work)
        return load_state(work / "final.pt")

    assert_same_weights(want, run("seeded"), atol=1e-5, label=f"fsdp, 2 ranks x {B} vs batch {NPROC * B}")
    script.write_text(text.replace(shards, "").replace(BUILT, BUILT + shards))
    with pytest.raises(AssertionError, match="control: weights differ"):
        assert_same_weights(want, run("control"), atol=1e-5, label="control")


INSTANCE = REPO_ROOT / "fixtures" / "DST101" / "init_through_instance_containers.in.py"


INSTANCE_SETUP = {  # what makes the ranks train one model, per backend
    "ddp": "        self.mapper = runtime.DDP(self.mapper)\n",
    "horovod": "        hvd.broadcast_parameters(self.mapper.state_dict(), root_rank=0)\n",
    "fsdp": "        fully_shard(self.mapper)\n",
}


@pytest.mark.parametrize("backend", [executed("DST101/init_through_instance_containers", b, b) for b in INSTANCE_SETUP])
def test_wrap_after_inits_through_the_instance_and_star_args(tmp_path, backend):
    """fixtures/DST101/init_through_instance_containers: the trainer's network is re-initialised by a
    method of its class through a ModuleList on the instance (`self.init_weights()`), then by the
    script's `reset_biases(*nets)`, from the unseeded global generator; the DDP wrap (Horovod's
    broadcast, FSDP's shard) must follow both (distify.model_refs follows the instance's attributes
    into the method and the `*nets` parameter). Real launches: every rank ends with the same
    parameters (DDP, Horovod); seeded, the run equals the original at twice the batch. Control: the
    wrap (broadcast, shard) at the construction, where distify put it before, leaves the ranks
    different (FSDP: the seeded run is no longer the original's)."""
    launch = launcher(backend)
    script = tmp_path / "script" / "init_through_instance_containers.py"
    migrate(INSTANCE, script, backend=backend)
    text = script.read_text()
    built, wrap = "self.mapper = Mapper(6)\n", INSTANCE_SETUP[backend]
    assert text.index("reset_biases(self.mapper)\n") < text.index(wrap), "the wrap must follow both initialisations"
    args = ["--batch-size", B, "--epochs", 1, "--checkpoint", "final.pt"]
    if backend != "fsdp":
        fresh = _ranks(script, tmp_path / "fresh", args, launch=launch)
        assert fresh[0] and _same_on_every_rank(fresh), "ranks trained different models after the inits"

    original = tmp_path / "original"
    original.mkdir()
    run_python(INSTANCE, ["--seed", 3, "--batch-size", NPROC * B, "--epochs", 1, "--checkpoint", "final.pt"], cwd=original)
    want = load_state(original / "final.pt")

    def seeded(path: Path, name: str) -> dict:
        work = tmp_path / name
        work.mkdir()
        launch(path, ["--seed", 3, *args], nproc=NPROC, cwd=work)
        return load_state(work / "final.pt")

    assert_same_weights(want, seeded(script, "seeded"), atol=1e-5, label=f"{backend}, 2 ranks x {B} vs batch {NPROC * B}")

    if backend == "ddp":
        early = text.replace(wrap, "").replace(built, "self.mapper = runtime.DDP(Mapper(6))\n")
    else:
        early = text.replace(wrap, "").replace(built, built + wrap)
    assert early != text
    script.write_text(early)
    if backend == "fsdp":
        with pytest.raises(AssertionError, match="control: weights differ"):
            assert_same_weights(want, seeded(script, "control"), atol=1e-5, label="control")
        return
    assert not _same_on_every_rank(_ranks(script, tmp_path / "control", args, launch=launch)), (
        "control: with the wrap before the initialisations the ranks should differ"
    )


# init_after_build under Horovod and FSDP: what makes the ranks start from one model follows the
# load/init branches (Horovod's broadcasts; FSDP's shards, cut after the load)
AFTER_BRANCHES = {
    "horovod": "hvd.broadcast_parameters(G_AB.state_dict(), root_rank=0)\n"
               "hvd.broadcast_parameters(G_BA.state_dict(), root_rank=0)\n",
    "fsdp": "fully_shard(G_AB)\nfully_shard(G_BA)\n",
}


@pytest.mark.parametrize("backend", [executed("DST101/init_after_build", b, b) for b in ("horovod", "fsdp")])
def test_broadcast_or_shard_after_apply_init_and_load(tmp_path, backend):
    """fixtures/DST101/init_after_build migrated for Horovod and FSDP. Resumed (the load branch,
    deterministic), 2 ranks at batch B end with the original's weights at batch 2B; fresh (the
    ``.apply`` branch, each rank draws its own initial weights), Horovod's ranks
    end identical. Control: the broadcasts (the shards) moved above the branches, where a wrap
    before them left each rank its own model: Horovod's ranks differ; FSDP's resumed run no longer
    ends with the original's weights (or fails to load into the shards)."""
    setup = AFTER_BRANCHES[backend]
    launch = launcher(backend)
    script = tmp_path / "script" / "init_after_build.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    assert text.index(BRANCHES) < text.index(setup), "the broadcast/shard must follow the load/init branches"

    original = tmp_path / "original"
    _saved_models(original)
    run_python(SOURCE, _args(NPROC * B, epoch=1), cwd=original)
    want = load_state(original / "final.pt")

    def resumed(path: Path, name: str) -> dict:
        work = tmp_path / name
        _saved_models(work)
        launch(path, _args(B, epoch=1), nproc=NPROC, cwd=work)
        return load_state(work / "final.pt")

    assert_same_weights(want, resumed(script, "resumed"), atol=1e-5, label=f"{backend}, resumed, 2 ranks x {B} vs batch {NPROC * B}")
    early = tmp_path / "script" / "early.py"
    early.write_text(text.replace(setup, "").replace(BRANCHES, "\n" + setup + BRANCHES))
    assert early.read_text() != text and early.read_text().index(setup) < early.read_text().index(BRANCHES)
    if backend == "horovod":
        fresh = _ranks(script, tmp_path / "fresh", _args(B), launch=launch)
        assert fresh[0] and _same_on_every_rank(fresh), "ranks trained different models after .apply(init_fn)"
        assert not _same_on_every_rank(_ranks(early, tmp_path / "control", _args(B), launch=launch)), (
            "control: with the broadcast before .apply(init_fn) the ranks should differ")
    else:
        with pytest.raises((AssertionError, RunFailed)):
            assert_same_weights(want, resumed(early, "control"), atol=1e-5, label="control")


EITHER = REPO_ROOT / "fixtures" / "DST101" / "model_from_either_branch.in.py"
EITHER_WRAP = "    model = runtime.DDP(model)\n"
EITHER_BUILD = "        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))\n"


@pytest.mark.parametrize("backend", [executed("DST101/model_from_either_branch", "ddp", "ddp")])
def test_wrap_holds_the_model_of_either_branch(tmp_path, backend):
    """fixtures/DST101/model_from_either_branch: `if args.resume: model = checkpoint["model"]` (a
    whole-model pickle) `else: model = Net()`. A resumed run on 2 ranks at batch 8 must end with
    the weights of the single process resumed from the same checkpoint at batch 16. Control: the
    wrap where distify put it before the fix (in the `else` branch only) leaves the resumed model
    unwrapped: each rank steps on its own gradients, and the run fails at `model.module` or ends apart."""
    orig = tmp_path / "orig"
    orig.mkdir()
    run_python(EITHER, ["--batch-size", 16, "--epochs", 1], cwd=orig)
    resume = (orig / "checkpoint.pth").read_bytes()
    run_python(EITHER, ["--batch-size", 16, "--epochs", 3, "--resume", "checkpoint.pth"], cwd=orig)
    want = load_state(orig / "final.pt")

    script = tmp_path / "script" / "train.py"
    migrate(EITHER, script, backend=backend)
    text = script.read_text()
    assert EITHER_WRAP in text and "else:\n" + EITHER_BUILD in text, "the wrap is not after the if"
    args = ["--batch-size", 8, "--epochs", 3, "--resume", "checkpoint.pth"]
    for name, body in (("fixed", text), ("control", text.replace(EITHER_WRAP, "").replace(
            EITHER_BUILD, EITHER_BUILD.replace("= nn.Sequential(", "= runtime.DDP(nn.Sequential(").replace("\n", ")\n")))):
        run = tmp_path / name
        run.mkdir()
        (run / "checkpoint.pth").write_bytes(resume)
        script.write_text(body)
        if name == "fixed":
            run_torchrun(script, args, nproc=NPROC, cwd=run)
            assert_same_weights(load_state(run / "final.pt"), want, label="resumed on 2 ranks")
            continue
        try:
            run_torchrun(script, args, nproc=NPROC, cwd=run)
        except RunFailed:
            continue
        with pytest.raises(AssertionError):
            assert_same_weights(load_state(run / "final.pt"), want)
