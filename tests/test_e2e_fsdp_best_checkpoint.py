"""Executed: an FSDP migration whose best checkpoint is written under a test each rank decides on its
own batches (fixtures/DST307/per_rank_best_checkpoint: nanoGPT's ``if losses["val"] < best_val_loss:``
around ``model.state_dict()``) runs to its end on 2 ranks under torchrun (gloo, CPU).

The full-state gather DST307 puts in that branch is a collective: before the fix each rank took the
branch on its own estimate (DST204 gives each rank its own batches), one gathered while the other
trained on, and the job hung. Now every rank takes rank 0's decision (``runtime.broadcast_object``):
the run ends, rank 0 wrote the best checkpoint with the original model's keys and the final weights
load into the original class. Control: the same migrated script without the broadcast does not end
within the time the fixed run needs many times over.
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, RunFailed, migrate, run_torchrun  # noqa: E402

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST307" / "per_rank_best_checkpoint.in.py"
DECIDE = "runtime.broadcast_object(bool("


def _original_keys(out):
    import torch

    sys_argv = sys.argv
    sys.argv = [str(SOURCE), "--max_iters", "0", "--out_dir", str(out)]
    try:
        scope = runpy.run_path(str(SOURCE), run_name="not_main_but_runs")
    finally:
        sys.argv = sys_argv
    return scope, set(scope["model"].state_dict()), torch


@pytest.mark.parametrize("decided", [True, False], ids=["rank0-decides", "control-each-rank-decides"])
def test_best_checkpoint_under_a_per_rank_test_does_not_hang(tmp_path, decided, monkeypatch):
    script = tmp_path / "train.py"
    migrate(SOURCE, script, backend="fsdp")
    text = script.read_text()
    assert text.count(DECIDE) == 1, "DST307 did not make the checkpoint's branch one decision"
    if not decided:
        script.write_text(text.replace(DECIDE, "((", 1))
        with pytest.raises(RunFailed):
            run_torchrun(script, ["--out_dir", str(tmp_path / "out")], cwd=tmp_path, timeout=30)
        return
    run_torchrun(script, ["--out_dir", str(tmp_path / "out")], cwd=tmp_path, timeout=120)
    monkeypatch.chdir(tmp_path)
    scope, keys, torch = _original_keys(tmp_path / "original")
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt")
    assert set(ckpt["model"]) == keys and isinstance(ckpt["iter_num"], int)
    scope["model"].load_state_dict(torch.load(tmp_path / "out" / "final.pt"))
