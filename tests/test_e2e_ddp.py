"""Executed equivalence: a migrated script under torchrun (2 ranks x batch B) ends with the same
weights as the original script run with plain python at batch 2B; run with plain python (no
launcher) it behaves exactly like the original at batch B.

Scenario conventions (fixtures/scenarios/<name>.in.py, see the scenario list below): argparse
options --batch-size, --epochs, --lr, --checkpoint (final plain state_dict), shuffle=False on the
training loader, deterministic synthetic data, no dropout/BatchNorm, mean-reduced loss, SGD, and
exactly one line per epoch starting with "epoch <n>".
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    SCENARIOS,
    assert_same_weights,
    epoch_lines,
    fs_spy_env,
    load_state,
    migrate,
    read_fs_log,
    checked,
    run_python,
    run_torchrun,
)

pytestmark = pytest.mark.e2e

B = 16  # per-rank batch size
NPROC = 2
EPOCHS = 2
DDP_ATOL = 1e-5  # 2 ranks x B vs one process x 2B: only the float32 summation order differs
PLAIN_ATOL = 1e-6  # migrated script without a launcher vs the original: should be identical


@dataclass(frozen=True)
class Scenario:
    name: str
    extra_args: tuple = ()
    # files (relative to the run directory) that must hold a state_dict with the model's keys;
    # second item: the key of the state_dict inside a checkpoint dict, or None for a bare one
    state_files: tuple = ()
    resume: bool = False

    @property
    def source(self) -> Path:
        return SCENARIOS / f"{self.name}.in.py"

    def __str__(self):
        return self.name


RUNNABLE = (
    Scenario("module_level"),
    Scenario("examples_style", extra_args=("--save-model",)),
    Scenario(
        "trainer_class",
        extra_args=("--checkpoint-dir", "ckpts"),
        state_files=(("ckpts/epoch_000.pt", "model"), ("ckpts/epoch_001.pt", "model")),
    ),
    Scenario("two_loaders", extra_args=("--best-checkpoint", "best.pt"), state_files=(("best.pt", None),)),
    Scenario("aliases"),
    Scenario("resume", resume=True),
)


@dataclass(frozen=True)
class Outcome:
    workdir: Path
    output: str
    weights: dict
    fs_log: Path


class Runs:
    """Runs shared by the tests of this module (each original run happens once per session)."""

    def __init__(self, factory):
        self.factory = factory
        self._cache = {}

    def _memo(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def _args(self, scenario, batch):
        args = ["--batch-size", batch, "--epochs", EPOCHS, "--checkpoint", "final.pt", *scenario.extra_args]
        if scenario.resume:
            args += ["--resume", self.resume_weights()]
        return args

    def resume_weights(self) -> Path:
        def make():
            workdir = self.factory.mktemp("resume-start")
            source = SCENARIOS / "resume.in.py"
            run_python(source, ["--batch-size", 32, "--epochs", 1, "--checkpoint", "start.pt"], cwd=workdir)
            return workdir / "start.pt"

        return self._memo("resume-start", make)

    def _launch(self, scenario, script, batch, launcher, tag):
        workdir = self.factory.mktemp(f"{scenario.name}-{tag}")
        fs_log = workdir.parent / f"{workdir.name}.fs.log"
        env = fs_spy_env(workdir.parent / f"{workdir.name}.spy", fs_log)
        if launcher == "torchrun":
            result = run_torchrun(script, self._args(scenario, batch), nproc=NPROC, env=env, cwd=workdir, check=False)
            result = checked(result, "torchrun", scenario.name)
        else:
            result = run_python(script, self._args(scenario, batch), env=env, cwd=workdir)
        checkpoint = workdir / "final.pt"
        assert checkpoint.is_file(), f"{tag} run wrote no {checkpoint.name}\n" + result.describe()
        return Outcome(workdir, result.output, load_state(checkpoint), fs_log)

    def original(self, scenario, batch) -> Outcome:
        return self._memo(
            ("original", scenario.name, batch),
            lambda: self._launch(scenario, scenario.source, batch, "python", f"orig-b{batch}"),
        )

    def migrated_source(self, scenario) -> Path:
        def make():
            target = self.factory.mktemp(f"{scenario.name}-migrated") / f"{scenario.name}.py"
            migrate(scenario.source, target, backend="ddp")
            return target

        return self._memo(("migrated", scenario.name), make)

    def migrated(self, scenario, launcher) -> Outcome:
        return self._memo(
            ("migrated", scenario.name, launcher),
            lambda: self._launch(scenario, self.migrated_source(scenario), B, launcher, f"mig-{launcher}"),
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory)


def _check_epoch_lines(outcome: Outcome, what: str):
    lines = epoch_lines(outcome.output)
    assert len(lines) == EPOCHS, (
        f"{what}: expected {EPOCHS} lines starting with 'epoch <n>' (printed once, by rank 0), "
        f"got {len(lines)}:\n" + "\n".join(lines) + "\n--- output ---\n" + outcome.output[-4000:]
    )


def _check_state_files(scenario: Scenario, outcome: Outcome, reference_keys):
    for relative, key in scenario.state_files:
        path = outcome.workdir / relative
        assert path.is_file(), f"{relative} was not written"
        state = load_state(path)
        if key is not None:
            state = state[key]
        assert set(state) == set(reference_keys), f"{relative}: keys {sorted(state)} != {sorted(reference_keys)}"


@pytest.mark.parametrize("scenario", RUNNABLE, ids=str)
def test_migration_rewrites_the_script(runs, scenario):
    original = scenario.source.read_text()
    migrated = runs.migrated_source(scenario).read_text()
    assert migrated != original, f"distify left {scenario.name} unchanged"
    compile(migrated, scenario.name, "exec")


@pytest.mark.parametrize("scenario", RUNNABLE, ids=str)
def test_ddp_two_ranks_match_big_batch(runs, scenario):
    big = runs.original(scenario, NPROC * B)
    ddp = runs.migrated(scenario, "torchrun")

    prefixed = sorted(k for k in ddp.weights if k.startswith("module."))
    assert not prefixed, f"checkpoint keys keep the DDP 'module.' prefix: {prefixed[:3]}"
    assert_same_weights(big.weights, ddp.weights, atol=DDP_ATOL, label=f"{scenario.name} ddp vs batch {NPROC * B}")

    _check_epoch_lines(big, "original")
    _check_epoch_lines(ddp, "torchrun")
    _check_state_files(scenario, ddp, big.weights)


METRICS = {
    "two_loaders": r"epoch (\d+) val_acc ([0-9.]+)",
    "examples_style": r"Accuracy: (\d+)/(\d+)",
}


@pytest.mark.parametrize("scenario", [s for s in RUNNABLE if s.name in METRICS], ids=str)
def test_reported_eval_metrics_equal_single_process(runs, scenario):
    """Under 2 ranks the printed accuracy is the single-process one (both scenarios' evaluation
    loaders are sharded by DST203 and their sums reduced over the ranks)."""
    import re

    big = runs.original(scenario, NPROC * B)
    ddp = runs.migrated(scenario, "torchrun")
    expected = re.findall(METRICS[scenario.name], big.output)
    assert expected, f"no metric lines in the original's output:\n{big.output[-2000:]}"
    assert re.findall(METRICS[scenario.name], ddp.output) == expected


@pytest.mark.parametrize("scenario", RUNNABLE, ids=str)
def test_ddp_side_effects_happen_once(runs, scenario):
    ddp = runs.migrated(scenario, "torchrun")
    events = read_fs_log(ddp.fs_log, under=ddp.workdir)
    saves = [e for e in events if e.kind == "save"]
    assert saves, "the torch.save spy recorded nothing (is sitecustomize being loaded?)"
    by_path = {}
    for event in events:
        by_path.setdefault((event.kind, event.path), set()).add((event.pid, event.rank))
    for (kind, path), writers in sorted(by_path.items()):
        relative = Path(path).relative_to(ddp.workdir.resolve())
        assert len({pid for pid, _ in writers}) == 1, f"{kind} {relative} done by {len(writers)} processes: {writers}"
        ranks = {rank for _, rank in writers}
        assert ranks == {"0"}, f"{kind} {relative} done by rank(s) {ranks}, expected rank 0 only"


@pytest.mark.parametrize("scenario", RUNNABLE, ids=str)
def test_migrated_runs_with_plain_python(runs, scenario):
    original = runs.original(scenario, B)
    plain = runs.migrated(scenario, "python")
    assert_same_weights(original.weights, plain.weights, atol=PLAIN_ATOL, label=f"{scenario.name} plain python")
    _check_epoch_lines(plain, "plain python")
    _check_state_files(scenario, plain, original.weights)
