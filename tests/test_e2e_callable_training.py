"""Executed: The Annotated Transformer's shape (training in a loss-compute object handed to the loop),
migrated for DDP and launched on 2 ranks.

``run_epoch(data_iter, model, loss_compute)`` trains when it is handed
``SimpleLossCompute(criterion, opt)`` and evaluates when handed ``SimpleLossCompute(criterion, None)``
under ``no_grad``. Before distify.callable_training the loop was no training loop: the training
loader was never sharded and nothing was said. The loader spy (tests/e2e_support.LOADER_SPY) records
each pass's indices on every rank: the training loader (#0) must give the ranks disjoint shards that
cover the set, in a new order every epoch (set_epoch), and the evaluation loader (#1) is read whole by
every rank. The control removes the sampler from the migrated script: the same check fails.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import LOADER_SPY, SCENARIOS, checked, migrate, run_torchrun, sitecustomize_env  # noqa: E402
from test_e2e_data_paths import check_ranks_identical, check_shards  # noqa: E402

pytestmark = pytest.mark.e2e

SCRIPT = SCENARIOS / "annotated_transformer.in.py"
SPEC = dict(train=[0], shuffled=[0], whole=[1])
ARGS = ["--batch-size", 16, "--epochs", 2, "--checkpoint", "final.pt"]


def _launch(script: Path, tmp_path: Path):
    import torch

    dumps = tmp_path / "dumps"
    dumps.mkdir(parents=True, exist_ok=True)
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    env = sitecustomize_env(tmp_path / "spy", LOADER_SPY, {"DISTIFY_E2E_DATA_DIR": str(dumps)})
    result = checked(run_torchrun(script, ARGS, nproc=2, env=env, cwd=run_dir, check=False), "torchrun", script.name)
    loaders, params = {}, {}
    for r in ("0", "1"):
        path = dumps / f"loaders-rank{r}.jsonl"
        assert path.is_file(), f"rank {r} left no loader records\n" + result.describe()
        loaders[r] = [json.loads(line) for line in path.read_text().splitlines()]
        params[r] = torch.load(dumps / f"params-rank{r}.pt")
        params["initial", r] = torch.load(dumps / f"initial-rank{r}.pt")
    return loaders, params, result


def test_annotated_transformer_shards_the_loader_the_training_call_hands_in(tmp_path):
    script = tmp_path / "script" / "annotated_transformer.py"
    script.parent.mkdir()
    migrate(SCRIPT, script, backend="ddp")
    text = script.read_text()
    assert "sampler=train_iter_sampler" in text and "train_iter_sampler.set_epoch(epoch)" in text
    loaders, params, result = _launch(script, tmp_path / "migrated")
    check_shards("annotated_transformer", loaders, SPEC)
    check_ranks_identical("annotated_transformer", params)
    assert sum(line.startswith("epoch ") for line in result.output.splitlines()) == 2  # printed once per epoch

    # control: the sampler taken out again (as distify left it before), both ranks read the same samples
    broken = script.with_name("unsharded.py")
    broken.write_text(text.replace("sampler=train_iter_sampler)", "shuffle=True)"))
    assert broken.read_text() != text
    loaders, _, _ = _launch(broken, tmp_path / "control")
    with pytest.raises(AssertionError, match="the loader is not sharded"):
        check_shards("control", loaders, SPEC)
