"""Executed: the file operations that follow a save rank 0 alone writes are rank 0's too
(fixtures/DST304/atomic_save_rotation: `torch.save(..., path + ".tmp")`, `os.replace` over the last
checkpoint, `os.remove` of the oldest). On 2 ranks (torchrun for ddp and fsdp, horovodrun --gloo for
horovod) the run must end with exactly the newest two checkpoints, no temporary file left, each
loading into the bare model, and one report line. Control: the old output, with `os.replace` and
`os.remove` run by every rank, fails (FileNotFoundError on a rank that never wrote the file)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, RunFailed, executed, launcher, migrate  # noqa: E402

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST304" / "atomic_save_rotation.in.py"


@pytest.mark.parametrize("backend", [executed("DST304/atomic_save_rotation", b, b, id=b) for b in ("ddp", "fsdp", "horovod")])
def test_replace_and_remove_run_on_the_rank_that_saved(backend, tmp_path):
    import torch
    import torch.nn as nn

    script = tmp_path / "script" / "train.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    run = tmp_path / "run"
    run.mkdir()
    result = launcher(backend)(script, [], nproc=2, cwd=run)
    assert sorted(p.name for p in run.iterdir() if p.suffix in (".pt", ".tmp")) == ["epoch2.pt", "epoch3.pt"]
    bare = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
    bare.load_state_dict(torch.load(run / "epoch3.pt")["model"])  # strict: the original's keys, full tensors
    assert result.stdout.count("kept ") == 1, result.stdout
    if backend != "ddp":
        return
    guarded = ("        if runtime.is_main_process():\n"
               "            torch.save({\"model\": model.module.state_dict(), \"epoch\": epoch}, path + \".tmp\")\n"
               "            os.replace(path + \".tmp\", path)\n")
    assert guarded in text, text
    old = text.replace(guarded, guarded.replace("            os.replace(", "        os.replace("))  # out of the guard
    old = old.replace("if len(kept) > 2 and runtime.is_main_process():", "if len(kept) > 2:")
    assert old != text
    control = tmp_path / "script" / "old.py"
    control.write_text(old)
    (tmp_path / "control").mkdir()
    with pytest.raises(RunFailed, match="FileNotFoundError"):
        launcher(backend)(control, [], nproc=2, cwd=tmp_path / "control")
