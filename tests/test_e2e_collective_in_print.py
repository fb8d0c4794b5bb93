"""A collective inside the arguments of a print is computed on every rank, and only the print is
rank 0's (``Context.guard_statement``), under real launches.

``fixtures/DST302/evaluation_in_print.in.py`` prints a validation count computed inside the print
itself. The model has BatchNorm, so under DDP its forward broadcasts rank 0's buffers (a collective)
and under FSDP every forward all-gathers the shards; DST203 also shards the evaluation and sums the
count over the ranks. With the print's whole statement under ``if runtime.is_main_process():``, as
distify wrote it before, rank 0 waits in a collective the other ranks never join: the DDP run failed
("Connection closed by peer") — that earlier output is the control, rebuilt here by hand from the
migrated script (`test_control_*`).

Checked on each launch: the script finishes, each epoch line is printed once, and the count it
prints for the last epoch is the count of the saved weights on the whole validation set.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, load_state, migrate, run_horovodrun, run_torchrun  # noqa: E402

pytestmark = pytest.mark.e2e

SRC = REPO_ROOT / "fixtures" / "DST302" / "evaluation_in_print.in.py"
LINE = re.compile(r"^(?:\[\d+\]<stdout>:)?epoch (\d+) val correct (\d+) of 100$", re.M)  # horovodrun prefixes a rank


def _count_of_saved_weights(checkpoint: Path) -> int:
    """The saved weights, put into the original architecture, scored on the whole validation set."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("original_script", SRC)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
    )
    model.load_state_dict(load_state(checkpoint))
    loader = torch.utils.data.DataLoader(module.make_data(100, seed=2), batch_size=32)
    return module.count_correct(model, loader)


def _launch(script: Path, backend: str, timeout: float = 120):
    if backend == "horovod":
        return run_horovodrun(script, timeout=timeout, check=False)
    return run_torchrun(script, timeout=timeout, check=False)


def _check(result, folder: Path) -> None:
    assert result.returncode == 0, result.describe()
    lines = LINE.findall(result.stdout)
    assert [int(e) for e, _ in lines] == [0, 1], f"each epoch line must be printed once:\n{result.describe()}"
    assert int(lines[-1][1]) == _count_of_saved_weights(folder / "classifier.pt")


@pytest.mark.parametrize("backend", ["ddp", "fsdp", pytest.param("horovod", marks=pytest.mark.horovod)])
def test_evaluation_inside_a_print_runs_on_every_rank(tmp_path, backend):
    script = tmp_path / "train.py"
    migrate(SRC, script, backend)
    text = script.read_text()
    assert "message = f\"epoch {epoch} val correct {count_correct(model, val_loader)}" in text
    _check(_launch(script, backend), tmp_path)


def test_control_evaluation_under_the_rank_guard_fails(tmp_path):
    """The earlier output: the whole print, evaluation included, on rank 0 only."""
    script = tmp_path / "train.py"
    migrate(SRC, script, "ddp")
    text = script.read_text()
    hoisted = (
        '        message = f"epoch {epoch} val correct {count_correct(model, val_loader)} of {len(val_loader.dataset)}"\n'
        "        if runtime.is_main_process():\n"
        "            print(message)\n"
    )
    assert hoisted in text
    script.write_text(text.replace(hoisted, (
        "        if runtime.is_main_process():\n"
        '            print(f"epoch {epoch} val correct {count_correct(model, val_loader)} of {len(val_loader.dataset)}")\n'
    )))
    result = _launch(script, "ddp", timeout=90)
    with pytest.raises(AssertionError):
        _check(result, tmp_path)
