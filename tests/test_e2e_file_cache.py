"""Executed: a file rank 0 alone writes and every rank then reads is waited for
(fixtures/DST306/numpy_feature_cache: features computed once and cached with `np.save`, read back
with `np.load`; a metadata dict written through `open(path, "wb")` + pickle and read back through
`open(path, "rb")`). On 2 ranks (torchrun for ddp and fsdp, horovodrun --gloo for horovod), with rank
0's `np.save` slowed down by a spy, every rank must load the whole cache (the spy records the shape
each rank read), and the ranks end with identical probes. Control: the migration without the barrier
before `np.load`, and rank 1 reads a file rank 0 has not written yet (FileNotFoundError)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, RunFailed, executed, migrate, rank_parameters, same_on_every_rank  # noqa: E402

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST306" / "numpy_feature_cache.in.py"

# rank 0's np.save takes a while; each np.load writes the shape it read to <dir>/loaded-rank<R>.txt
SLOW_SAVE_SPY = '''\
import os

_CACHE_DIR = os.environ.get("DISTIFY_E2E_CACHE_SPY")
if _CACHE_DIR:
    import time

    import numpy

    _save, _load = numpy.save, numpy.load

    def _slow_save(*args, **kwargs):
        time.sleep(3)
        return _save(*args, **kwargs)

    def _recorded_load(*args, **kwargs):
        out = _load(*args, **kwargs)
        rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "single"
        with open(os.path.join(_CACHE_DIR, f"loaded-rank{rank}.txt"), "w") as f:
            f.write(repr(tuple(out.shape)))
        return out

    numpy.save, numpy.load = _slow_save, _recorded_load
'''
BARRIER = {"ddp": "    dist.barrier()  # every rank waits for rank 0's np.save\n",
           "fsdp": "    dist.barrier()  # every rank waits for rank 0's np.save\n",
           "horovod": "    hvd.barrier()  # every rank waits for rank 0's np.save\n"}


@pytest.mark.parametrize("backend", [executed("DST306/numpy_feature_cache", b, b, id=b) for b in ("ddp", "fsdp", "horovod")])
def test_every_rank_reads_the_cache_rank_0_wrote(backend, tmp_path):
    script = tmp_path / "script" / "train.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    assert text.count(BARRIER[backend]) == 1, text

    def run(path: Path, name: str):
        work = tmp_path / name
        (work / "cache").mkdir(parents=True)
        spy = work / "loads"
        spy.mkdir()
        _, ranks = rank_parameters(path, ["--cache-dir", work / "cache"], work, backend, SLOW_SAVE_SPY,
                                   {"DISTIFY_E2E_CACHE_SPY": str(spy)})
        return work, spy, ranks

    work, spy, ranks = run(script, "migrated")
    assert sorted(p.name for p in spy.iterdir()) == ["loaded-rank0.txt", "loaded-rank1.txt"]
    assert all(p.read_text() == "(256, 16)" for p in spy.iterdir())
    assert same_on_every_rank(ranks), "the ranks trained on different features"
    assert sorted(p.name for p in (work / "cache").iterdir()) == ["features.npy", "meta.pkl", "probe.pt"]

    control = tmp_path / "script" / "old.py"
    control.write_text(text.replace(BARRIER[backend], ""))
    with pytest.raises(RunFailed, match="FileNotFoundError|No such file"):
        run(control, "control")
