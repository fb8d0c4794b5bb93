"""Gradient accumulation under DDP: one all-reduce per optimizer step, same weights.

A counting DDP comm hook (tests/scripts/count_allreduce.py) records every gradient-bucket
all-reduce in a real 2-process gloo run of the migrated script. With accumulation over A
micro-batches the migrated script must all-reduce once per optimizer step (x the number of buckets),
its bytes per step must equal the model's gradient size, and a control copy without the no_sync
context must all-reduce on every micro-batch (so the counter can tell the difference). The weights
must equal the original's without accumulation at the same global batch (2 ranks x A x B).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import SCENARIOS, assert_same_weights, load_state, migrate, run_python, run_torchrun  # noqa: E402

pytestmark = pytest.mark.e2e

B, ACCUM, NPROC, EPOCHS = 16, 2, 2, 2
COUNTER = Path(__file__).resolve().parent / "scripts" / "count_allreduce.py"
SOURCE = SCENARIOS / "accumulation.in.py"


def _args(batch, accum):
    return ["--batch-size", batch, "--accum-steps", accum, "--epochs", EPOCHS, "--checkpoint", "final.pt"]


def _counted_run(script: Path, workdir: Path):
    out = workdir / "counts"
    out.mkdir()
    run_torchrun(COUNTER, [out, script, *_args(B, ACCUM)], nproc=NPROC, cwd=workdir)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(NPROC)]


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    target = tmp_path_factory.mktemp("accum") / "accumulation.py"
    migrate(SOURCE, target, backend="ddp")
    assert ".no_sync()" in target.read_text()
    return target


def test_one_allreduce_per_optimizer_step(migrated, tmp_path):
    for counts in _counted_run(migrated, tmp_path):
        micro_batches = EPOCHS * (512 // NPROC // B)
        assert counts["steps"] == micro_batches // ACCUM
        buckets = counts["allreduce"] / counts["steps"]
        assert buckets == 1, f"expected one bucket all-reduce per optimizer step, got {counts}"
        assert counts["bytes"] == counts["steps"] * counts["param_bytes"], counts


def test_control_without_no_sync_reduces_every_micro_batch(migrated, tmp_path):
    text = migrated.read_text()
    start = text.index("            with model.no_sync()")
    header_end = text.index("\n", start) + 1
    block_end = text.index("            total += loss.item()")
    body = text[header_end:block_end].replace("\n                ", "\n            ")
    body = body.replace("                ", "            ", 1)
    control = tmp_path / "control.py"
    control.write_text(text[:start] + body + text[block_end:])
    compile(control.read_text(), str(control), "exec")
    for counts in _counted_run(control, tmp_path):
        assert counts["allreduce"] == counts["steps"] * ACCUM, counts


def test_accumulated_weights_match_the_big_batch(migrated, tmp_path_factory):
    big = tmp_path_factory.mktemp("accum-big")
    run_python(SOURCE, _args(NPROC * ACCUM * B, 1), cwd=big)
    ddp = tmp_path_factory.mktemp("accum-ddp")
    run_torchrun(migrated, _args(B, ACCUM), nproc=NPROC, cwd=ddp)
    assert_same_weights(load_state(big / "final.pt"), load_state(ddp / "final.pt"), atol=1e-5, label="accumulation")
