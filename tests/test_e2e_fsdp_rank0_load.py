"""Executed: under FSDP a model loaded on rank 0 only, before it is sharded, is broadcast before
``fully_shard`` (DST308; fixtures/DST308/rank0_load_before_shard, issue 22 item 3).

The script loads ``pretrained.pt`` under ``if rank == 0 and ...:`` and only then builds its
optimizer. ``fully_shard`` cuts each rank's shards from the weights that rank holds, so rank 1,
which skipped the load, would shard its fresh weights. Migrated, ``runtime.broadcast_module(model)``
comes between the load and the shard: the 2-rank run at batch 8 per rank ends with the weights of
the original run whole at batch 16 from the same pretrained weights. Control: the same output
without the broadcast ends elsewhere (rank 1's half of the first layer started from its own
initialisation, which differs from the pretrained weights).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, assert_same_weights, load_state, migrate, run_python, run_torchrun  # noqa: E402

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST308" / "rank0_load_before_shard.in.py"
BROADCAST = "runtime.broadcast_module(model)\n"


def _pretrained(path: Path) -> None:
    import torch
    import torch.nn as nn

    torch.manual_seed(99)  # not the script's seed: weights no rank would draw itself
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    torch.save(model.state_dict(), path)


def _final(script: Path, workdir: Path, launch) -> dict:
    workdir.mkdir()
    _pretrained(workdir / "pretrained.pt")
    launch(script, cwd=workdir)
    return load_state(workdir / "final.pt")


@pytest.mark.runs("DST308/rank0_load_before_shard", "fsdp")
def test_rank0s_loaded_weights_are_what_every_rank_shards(tmp_path):
    script = tmp_path / "train.py"
    migrate(SOURCE, script, backend="fsdp")
    text = script.read_text()
    assert BROADCAST + "fully_shard(model)\n" in text, "DST308 did not broadcast the load before the shard"
    original = tmp_path / "original.py"
    original.write_text(SOURCE.read_text().replace("batch_size=8", "batch_size=16"))
    expected = _final(original, tmp_path / "orig", lambda s, cwd: run_python(s, cwd=cwd))
    found = _final(script, tmp_path / "migrated", lambda s, cwd: run_torchrun(s, nproc=2, cwd=cwd))
    assert_same_weights(found, expected, atol=1e-5, label="fsdp vs original at twice the batch")
    control = tmp_path / "control.py"
    control.write_text(text.replace(BROADCAST, ""))
    drifted = _final(control, tmp_path / "control", lambda s, cwd: run_torchrun(s, nproc=2, cwd=cwd))
    with pytest.raises(AssertionError, match="weights differ"):
        assert_same_weights(drifted, expected, atol=1e-5, label="control")
