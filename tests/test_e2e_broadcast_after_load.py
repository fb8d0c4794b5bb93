"""Executed: Horovod's broadcasts follow a load that runs in a function of the script, under a
condition (issue 22, item 3; fixtures/DST112/load_in_function).

The script resumes with ``load_checkpoint(args.resume, model, optimizer)`` inside ``if args.resume:``
and ``if os.path.isfile(args.resume):``. Here only rank 0 can read the checkpoint (a test-only
sitecustomize makes ``os.path.isfile`` answer False for it on every other rank: several nodes, no
shared disk). The checkpoint was saved at epoch 0 and the run trains one epoch: every rank then
starts the same loop (a checkpoint of a later epoch would send rank 1, which read no epoch number,
into epochs rank 0 skips – the resume epoch is not broadcast; not this test's subject). Rank 1 gets
the loaded weights from rank 0's broadcast, so the ranks end bit-identical (the gradients are
averaged; each rank's own unseeded data does not matter). Control: the same migrated script with
``hvd.broadcast_parameters`` moved above the ``if`` (before the load) ends with ranks that differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import PARAM_SPY, REPO_ROOT, migrate, run_horovodrun, sitecustomize_env  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.horovod]

SOURCE = REPO_ROOT / "fixtures" / "DST112" / "load_in_function.in.py"
BROADCAST = "    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n"
RESUME = "    if args.resume:\n        if os.path.isfile(args.resume):\n"

# only rank 0 sees the checkpoint named by DISTIFY_E2E_RANK0_ONLY
_RANK0_ONLY = '''
import os

_ONLY = os.environ.get("DISTIFY_E2E_RANK0_ONLY")
if _ONLY and os.environ.get("HOROVOD_RANK", "0") != "0":
    import os.path as _osp

    _isfile = _osp.isfile

    def _hidden(path):
        return False if os.path.abspath(path) == os.path.abspath(_ONLY) else _isfile(path)

    _osp.isfile = _hidden
'''


def _checkpoint(path: Path) -> None:
    import torch
    import torch.nn as nn

    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.save({"epoch": 0, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


def _final_weights(script: Path, workdir: Path) -> dict:
    import torch

    ckpt = workdir / "resume.pth.tar"
    dumps = workdir / "dumps"
    dumps.mkdir()
    env = sitecustomize_env(workdir / "spy", PARAM_SPY + _RANK0_ONLY,
                            {"DISTIFY_E2E_PARAM_DIR": str(dumps), "DISTIFY_E2E_RANK0_ONLY": str(ckpt)})
    run_horovodrun(script, ["--resume", str(ckpt), "--epochs", "1"], nproc=2, env=env, cwd=workdir)
    return {r: torch.load(dumps / f"rank{r}.pt") for r in range(2)}


def _same(found: list, expected: list) -> bool:
    import torch

    return len(found) == len(expected) and all(torch.equal(a, b) for a, b in zip(found, expected))


@pytest.mark.parametrize("broadcast_first", [False, True], ids=["migrated", "control-broadcast-before-load"])
def test_rank_that_cannot_read_the_checkpoint_gets_its_weights(tmp_path, broadcast_first):
    script = tmp_path / "train.py"
    migrate(SOURCE, script, backend="horovod")
    text = script.read_text()
    assert text.index(RESUME) < text.index(BROADCAST), "distify placed the broadcast before the load"
    if broadcast_first:
        text = text.replace(BROADCAST, "").replace(RESUME, BROADCAST + RESUME)
        script.write_text(text)
    _checkpoint(tmp_path / "resume.pth.tar")
    ranks = _final_weights(script, tmp_path)
    assert ranks[0], "the spy recorded no parameters"
    if broadcast_first:
        assert not _same(ranks[1], ranks[0]), "control: a broadcast before the load still left the ranks equal"
    else:
        assert _same(ranks[1], ranks[0]), "rank 1 trained from other weights than rank 0 loaded"
