"""Executed: a Trainer whose fit() prints what its training epoch returns,
``print(epoch, self.train_epoch())`` (fixtures/DST966/print_computes_by_training).

Two mistakes distify made on this shape, both silent until run: the print's rank-0 guard took the
epoch's training with it (``if runtime.is_main_process(): print(epoch, self.train_epoch())``:
rank 0 waits in backward for ranks that never train), and the Trainer, which keeps the model it is
given (``self._model = model.to(device)``), was handed the DDP wrapper's module as if it only read
it, so no gradient was ever averaged. Migrated now, the value is computed on every rank before the
guard and the Trainer gets the wrapper: on 2 ranks (ddp, horovod) every rank trains, the ranks end
bit-identical, away from where they started, and each epoch is printed once. Control: the module
handed to the Trainer again (the earlier output) leaves the ranks apart."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    PARAM_SPY, REPO_ROOT, checked, migrate, run_horovodrun, run_torchrun, same_on_every_rank, sitecustomize_env,
)

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST966" / "print_computes_by_training.in.py"
EPOCH_LINE = re.compile(r"^(?:\[\d+\]<stdout>:)?\d+ \d+\.\d+$", re.M)


def _run(script: Path, workdir: Path, launcher: str):
    import torch

    dumps = workdir / "dumps"
    dumps.mkdir(parents=True)
    env = sitecustomize_env(workdir / "spy", PARAM_SPY, {"DISTIFY_E2E_PARAM_DIR": str(dumps)})
    launch = run_horovodrun if launcher == "horovodrun" else run_torchrun
    result = checked(launch(script, [], nproc=2, env=env, cwd=workdir, check=False), launcher, script.name)
    return [torch.load(dumps / f"rank{r}.pt") for r in (0, 1)], result.output


@pytest.mark.parametrize("backend,launcher", [
    ("ddp", "torchrun"),
    pytest.param("horovod", "horovodrun", marks=pytest.mark.horovod),
])
def test_every_rank_trains_the_same_model(tmp_path, backend, launcher):
    import torch

    script = tmp_path / "train.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    assert "train_epoch_result = self.train_epoch()\n" in text, "the epoch's training went under the rank-0 guard"
    ranks, output = _run(script, tmp_path / "run", launcher)
    assert same_on_every_rank(ranks), "the ranks trained different models"
    torch.manual_seed(0)
    start = [p.detach() for p in torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(ranks[0], start)), "nothing was trained"
    assert len(EPOCH_LINE.findall(output)) == 3, output
    if backend == "ddp":
        control = tmp_path / "control.py"
        control.write_text(text.replace("Trainer(model, ", "Trainer(model.module, "))
        found, _ = _run(control, tmp_path / "control", launcher)
        assert not same_on_every_rank(found), "control: the unwrapped module trained alike on both ranks"
