"""Executed: data a script draws from torch's global generator differs between the ranks once DST204
re-seeds each rank (issue 22, items 2 and 3), under torchrun and horovodrun, 2 ranks.

Two shapes: a regression on batches it generates with ``torch.randn`` (fixtures/DST963/
generated_batches) and REINFORCE whose rollouts come from ``Categorical(probs).sample()``
(fixtures/DST204/policy_rollouts: no DataLoader, a toy environment) and a GAN whose real samples come from a
DataLoader while the generator's batch is latent noise from ``torch.randn`` in the loop
(fixtures/DST204/gan_latent: the fixed noise drawn before the models are built stays alike). A test-only sitecustomize
records on each rank every value ``torch.randn`` and ``Categorical.sample`` return, and the
parameters at exit. The ranks must draw different data and end with the same weights (the
gradients are averaged; under FSDP, which the rollouts also run, each rank holds its own shard). Control: the same migrated script without DST204's re-seed line draws
the same data on every rank.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import PARAM_SPY, REPO_ROOT, migrate, run_horovodrun, run_torchrun, sitecustomize_env  # noqa: E402

pytestmark = pytest.mark.e2e

RESEED = "torch.manual_seed(torch.initial_seed() + "
SCRIPTS = {
    "generated": (REPO_ROOT / "fixtures" / "DST963" / "generated_batches.in.py", []),
    "rollouts": (REPO_ROOT / "fixtures" / "DST204" / "policy_rollouts.in.py", ["--episodes", "4"]),
    "gan": (REPO_ROOT / "fixtures" / "DST204" / "gan_latent.in.py", ["--epochs", "1"]),
}
# draws that must stay alike on every rank: the GAN's real data and its fixed_noise, drawn before the
# models are built (only the latent batches in the loop are each rank's own)
ALIKE = {"gan": 2}

_DRAW_SPY = '''
import os

_DRAWS = os.environ.get("DISTIFY_E2E_DRAW_DIR")

if _DRAWS:
    import atexit
    import json

    drawn = []

    def _recording(real):
        def draw(*args, **kwargs):
            out = real(*args, **kwargs)
            drawn.append(out.double().flatten().tolist())
            return out
        return draw

    def _patch_draws(torch):
        torch.randn = _recording(torch.randn)
        from torch.distributions import Categorical

        Categorical.sample = _recording(Categorical.sample)

    _after_torch_import(_patch_draws)

    def _dump_draws():
        rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "single"
        with open(os.path.join(_DRAWS, "draws%s.json" % rank), "w") as f:
            json.dump(drawn, f)

    atexit.register(_dump_draws)
'''


def _run(script: Path, args: list, backend: str, work: Path):
    import torch

    dumps = work / "dumps"
    dumps.mkdir()
    env = sitecustomize_env(work / "spy", PARAM_SPY + _DRAW_SPY,
                            {"DISTIFY_E2E_PARAM_DIR": str(dumps), "DISTIFY_E2E_DRAW_DIR": str(dumps)})
    run = run_horovodrun if backend == "horovod" else run_torchrun
    run(script, args, nproc=2, env=env, cwd=work)
    draws = [json.loads((dumps / f"draws{r}.json").read_text()) for r in range(2)]
    # FSDP's parameters are each rank's own shards: nothing to compare
    weights = None if backend == "fsdp" else [torch.load(dumps / f"rank{r}.pt") for r in range(2)]
    return draws, weights


@pytest.mark.parametrize(
    "shape,backend,reseeded",
    [
        ("generated", "ddp", True),
        ("generated", "ddp", False),
        pytest.param("generated", "horovod", True, marks=pytest.mark.horovod),
        ("rollouts", "ddp", True),
        ("rollouts", "ddp", False),
        pytest.param("rollouts", "horovod", True, marks=pytest.mark.horovod),
        ("rollouts", "fsdp", True),
        ("gan", "ddp", True),
        ("gan", "ddp", False),
        pytest.param("gan", "horovod", True, marks=pytest.mark.horovod),
    ],
    ids=["generated-ddp", "control-generated-ddp", "generated-horovod", "rollouts-ddp", "control-rollouts-ddp",
         "rollouts-horovod", "rollouts-fsdp", "gan-ddp", "control-gan-ddp", "gan-horovod"],
)
def test_each_rank_draws_its_own_data(tmp_path, shape, backend, reseeded):
    import torch

    source, args = SCRIPTS[shape]
    script = tmp_path / "train.py"
    migrate(source, script, backend=backend)
    lines = script.read_text().splitlines(keepends=True)
    reseeds = [line for line in lines if RESEED in line]
    assert len(reseeds) == 1, "DST204 did not re-seed each rank"
    if not reseeded:
        script.write_text("".join(line for line in lines if RESEED not in line))
    draws, weights = _run(script, args, backend, tmp_path)
    assert draws[0] and draws[1], "the spy recorded no draws"
    alike = ALIKE.get(shape, 0)
    assert draws[0][:alike] == draws[1][:alike], "the draws made before the models were built differ"
    if reseeded:
        assert draws[0][alike:] != draws[1][alike:], "both ranks drew the same data"
        if weights is not None:
            assert weights[0] and all(torch.equal(a, b) for a, b in zip(*weights)), "the ranks ended with other weights"
    else:
        assert draws[0] == draws[1], "control: the ranks drew different data without the re-seed"
