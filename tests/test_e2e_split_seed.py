"""Executed: a training set split by an unseeded ``random_split`` is split alike on 2 ranks (DST208,
runtime.shared_seed()), under torchrun and horovodrun.

fixtures/DST965/random_split_unseeded splits 80 samples into 64 for training and 16 for validation
with ``random_split`` and no generator, then trains on a DistributedSampler of the 64. A test-only
sitecustomize records, on each rank and every pass, the split the training sampler shards (its
Subset's indices into the full set) and the positions it yields. Both ranks must have built the same
split, and in every pass the samples they trained on (the split's entries at their positions) must
be disjoint and together be the whole training set.
Control: the same migrated script with the shared seed taken out again (the original
``random_split(full, [64, 16])``) builds another split on each rank, and the shards overlap.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, migrate, run_horovodrun, run_torchrun, sitecustomize_env  # noqa: E402

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST965" / "random_split_unseeded.in.py"
ORIGINAL = "random_split(full, [64, 16])"
SEEDED = "random_split(full, [64, 16], generator=torch.Generator().manual_seed(runtime.shared_seed()))"
TRAIN, EPOCHS = 64, 2

_SPY = '''
import os

_SPLIT_DIR = os.environ.get("DISTIFY_E2E_SPLIT_DIR")

if _SPLIT_DIR:
    import atexit
    import json

    def _patch_split(torch):
        from torch.utils.data.distributed import DistributedSampler

        passes = []
        real_iter = DistributedSampler.__iter__

        def __iter__(self):
            positions = [int(i) for i in real_iter(self)]
            passes.append({"split": [int(i) for i in self.dataset.indices], "positions": positions})
            return iter(positions)

        DistributedSampler.__iter__ = __iter__

        def dump():
            rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "single"
            with open(os.path.join(_SPLIT_DIR, "rank%s.json" % rank), "w") as fh:
                json.dump(passes, fh)

        atexit.register(dump)

    _after_torch_import(_patch_split)
'''


def _run(tmp_path: Path, launcher: str, seeded: bool = True) -> dict:
    script = tmp_path / "train.py"
    migrate(SOURCE, script, backend="horovod" if launcher == "horovodrun" else "ddp")
    text = script.read_text()
    assert SEEDED in text, "DST208 did not give the split a shared seed"
    if not seeded:
        script.write_text(text.replace(SEEDED, ORIGINAL))
    out = tmp_path / "records"
    out.mkdir()
    env = sitecustomize_env(tmp_path / "spy", _SPY, {"DISTIFY_E2E_SPLIT_DIR": str(out)})
    run = run_horovodrun if launcher == "horovodrun" else run_torchrun
    run(script, [], nproc=2, env=env, cwd=tmp_path)
    ranks = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(2)}
    assert [len(ranks[r]) for r in ranks] == [EPOCHS] * 2, "one sampler pass per epoch on each rank"
    return ranks


def _shards_partition_one_split(ranks: dict) -> bool:
    """Every pass: both ranks shard one split, and the samples they train on are disjoint and
    together the whole training set."""
    for epoch in range(EPOCHS):
        split = ranks[0][epoch]["split"]
        if len(split) != TRAIN or ranks[1][epoch]["split"] != split:
            return False
        trained = [{ranks[r][epoch]["split"][p] for p in ranks[r][epoch]["positions"]} for r in ranks]
        if trained[0] & trained[1] or trained[0] | trained[1] != set(split):
            return False
    return True


@pytest.mark.parametrize("launcher", ["torchrun", pytest.param("horovodrun", marks=pytest.mark.horovod)])
def test_every_rank_shards_one_split(tmp_path, launcher):
    ranks = _run(tmp_path, launcher)
    assert all(len(ranks[r][e]["positions"]) == TRAIN // 2 for r in ranks for e in range(EPOCHS))
    assert _shards_partition_one_split(ranks)


def test_control_an_unseeded_split_overlaps(tmp_path):
    ranks = _run(tmp_path, "torchrun", seeded=False)
    assert ranks[0][0]["split"] != ranks[1][0]["split"], "each rank drew its own split"
    assert not _shards_partition_one_split(ranks)
