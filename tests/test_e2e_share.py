"""Executed: a training loader's own WeightedRandomSampler is shared out across 2 ranks (issue 22,
item 5; DST901 and runtime.ShareSampler), under torchrun and horovodrun.

fixtures/DST901/weighted_sampler draws 300 samples per epoch from a set where 1 in 10 is of class 1,
with weights 9:1, so a draw holds both classes about equally. A test-only sitecustomize records, on
each rank, the index batches the training loader's BatchSampler yields and every sequence
ShareSampler draws. Each rank must draw half of every pass (150), its share must hold the classes in
the ratio the weights ask for (not the set's 1 in 10), the ranks must have drawn one sequence and
dealt it out (rank r takes elements r, r + 2, ...), and the ranks' shares must differ.
Control: the same migrated script with the share taken away (``sampler=sampler``) draws the whole
pass on each rank.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, migrate, run_horovodrun, run_torchrun, sitecustomize_env  # noqa: E402

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST901" / "weighted_sampler.in.py"
SHARED = "sampler=runtime.ShareSampler(sampler)"
PASS, EPOCHS = 300, 2

_SPY = '''
import os

_SHARE_DIR = os.environ.get("DISTIFY_E2E_SHARE_DIR")

if _SHARE_DIR:
    import atexit
    import json

    def _patch_share(torch):
        data = torch.utils.data
        batches, sequences = [], []
        real_iter = data.BatchSampler.__iter__

        def __iter__(self):
            for batch in real_iter(self):
                if not isinstance(self.sampler, data.SequentialSampler):  # the evaluation loader's
                    batches.append([int(i) for i in batch])
                yield batch

        data.BatchSampler.__iter__ = __iter__
        try:
            from distify import runtime as _share
        except ImportError:
            _share = None
        if _share is not None:
            real_share = _share.ShareSampler.__iter__

            class _Recording:
                """The wrapped sampler, recording the whole pass it draws."""

                def __init__(self, inner, drawn):
                    self.inner, self.drawn = inner, drawn
                    self.generator = getattr(inner, "generator", None)

                def __iter__(self):
                    for i in self.inner:
                        self.drawn.append(int(i))
                        yield i

                def __len__(self):
                    return len(self.inner)

            def share(self):
                inner = self.sampler
                sequences.append([])
                self.sampler = _Recording(inner, sequences[-1])
                try:
                    yield from real_share(self)
                finally:
                    self.sampler = inner

            _share.ShareSampler.__iter__ = share

        def dump():
            rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "single"
            with open(os.path.join(_SHARE_DIR, "rank%s.json" % rank), "w") as fh:
                json.dump({"batches": batches, "sequences": sequences}, fh)

        atexit.register(dump)

    _after_torch_import(_patch_share)
'''


def _run(tmp_path: Path, launcher: str, shared: bool = True) -> dict:
    script = tmp_path / "train.py"
    migrate(SOURCE, script, backend="horovod" if launcher == "horovodrun" else "ddp")
    text = script.read_text()
    assert SHARED in text, "DST901 did not share the sampler out"
    if not shared:
        script.write_text(text.replace(SHARED, "sampler=sampler"))
    out = tmp_path / "records"
    out.mkdir()
    env = sitecustomize_env(tmp_path / "spy", _SPY, {"DISTIFY_E2E_SHARE_DIR": str(out)})
    run = run_horovodrun if launcher == "horovodrun" else run_torchrun
    run(script, [], nproc=2, env=env, cwd=tmp_path)
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(2)}


def _drawn(record: dict) -> list:
    return [i for batch in record["batches"] for i in batch]


def _class_ratio(indices: list) -> float:
    return sum(1 for i in indices if i % 10 == 0) / len(indices)  # class 1: every 10th sample


@pytest.mark.parametrize("launcher", ["torchrun", pytest.param("horovodrun", marks=pytest.mark.horovod)])
def test_each_rank_draws_its_share_with_the_weights(tmp_path, launcher):
    ranks = _run(tmp_path, launcher)
    drawn = {r: _drawn(ranks[r]) for r in ranks}
    assert [len(drawn[r]) for r in ranks] == [PASS // 2 * EPOCHS] * 2, "each rank draws half of every pass"
    for r in ranks:
        assert 0.4 < _class_ratio(drawn[r]) < 0.6, f"rank {r}: class ratio {_class_ratio(drawn[r]):.2f}, weights ask for 0.5"
    assert ranks[0]["sequences"] == ranks[1]["sequences"] and len(ranks[0]["sequences"]) == EPOCHS
    for epoch, sequence in enumerate(ranks[0]["sequences"]):
        part = slice(epoch * PASS // 2, (epoch + 1) * PASS // 2)
        assert drawn[0][part] == sequence[0::2] and drawn[1][part] == sequence[1::2]
    assert ranks[0]["sequences"][0] != ranks[0]["sequences"][1], "every pass draws anew"
    assert drawn[0] != drawn[1]


def test_control_without_the_share_every_rank_draws_the_whole_pass(tmp_path):
    ranks = _run(tmp_path, "torchrun", shared=False)
    assert [len(_drawn(ranks[r])) for r in ranks] == [PASS * EPOCHS] * 2
