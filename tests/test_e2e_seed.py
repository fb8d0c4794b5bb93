"""--seed-per-rank (DST403) under real launches: each rank draws its own random numbers in training.

The control run (same script, no flag) shows the check has teeth: with the shared seed every rank
draws exactly the same numbers.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import load_state, migrate, run_horovodrun, run_torchrun  # noqa: E402

pytestmark = [pytest.mark.e2e]

SCRIPT = '''\
import argparse
import os
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        rank = os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0"))
        with open(f"draws-{rank}.txt", "a") as out:  # a file per rank by name: every rank writes its own
            out.write(f"draw {rank} {epoch} {torch.rand(1).item():.8f}\\n")
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
'''

DRAW = re.compile(r"draw (\d) (\d) ([0-9.]+)")


def draws(run_dir: Path) -> dict:
    """{epoch: {rank: value}} from the files each rank wrote (console output is rank 0's only)."""
    text = "".join(p.read_text() for p in sorted(run_dir.glob("draws-*.txt")))
    found = {}
    for rank, epoch, value in DRAW.findall(text):
        found.setdefault(int(epoch), {})[int(rank)] = value
    assert sorted(found) == [0, 1] and all(sorted(v) == [0, 1] for v in found.values()), text[-2000:]
    return found


def _launch(backend: str, script: Path):
    if backend == "ddp":
        return run_torchrun(script, cwd=script.parent)
    return run_horovodrun(script, cwd=script.parent)


@pytest.mark.parametrize("backend", ["ddp", pytest.param("horovod", marks=pytest.mark.horovod)])
def test_seed_per_rank_gives_each_rank_its_own_stream(tmp_path, backend):
    src = tmp_path / "train_in.py"
    src.write_text(SCRIPT)
    results = {}
    for flag in (True, False):
        run_dir = tmp_path / ("flag" if flag else "control")
        script = run_dir / "train.py"
        migrate(src, script, backend, ["--seed-per-rank"] if flag else [])
        assert ("--seed-per-rank" in script.read_text()) is flag
        _launch(backend, script)
        results[flag] = draws(run_dir)
        assert set(load_state(run_dir / "model.pt")) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    for epoch in (0, 1):
        assert results[True][epoch][0] != results[True][epoch][1], "ranks drew the same numbers"
        assert results[False][epoch][0] == results[False][epoch][1], "control: shared seed must draw alike"
