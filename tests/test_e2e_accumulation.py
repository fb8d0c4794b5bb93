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

from e2e_support import (  # noqa: E402
    SCENARIOS,
    assert_same_weights,
    load_state,
    migrate,
    run_horovodrun,
    run_python,
    run_torchrun,
)

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


# --- the step condition spelled as real scripts spell it (DST402 for DDP, DST111 for Horovod) ------
# Both spellings used to go unrecognised: DDP reduced on every micro-batch, and Horovod's
# DistributedOptimizer raised "Gradients were computed more than backward_passes_per_step times".

STEP_IF = "            if (step + 1) % args.accum_steps == 0:\n"
SPELLINGS = {
    "or_last_batch": STEP_IF.replace(" == 0:", " == 0 or step + 1 == len(loader):"),
    "named_flag": "            last = (step + 1) % args.accum_steps == 0\n            if last:\n",
}


def _respelled(spelling, backend, tmp_path):
    text = SOURCE.read_text()
    assert STEP_IF in text, "the scenario no longer has the step condition this test re-spells"
    source = tmp_path / "source.py"
    source.write_text(text.replace(STEP_IF, SPELLINGS[spelling]))
    target = tmp_path / "migrated.py"
    migrate(source, target, backend=backend)
    return source, target


def _launch(backend, script, cwd):
    if backend == "ddp":
        return run_torchrun(script, _args(B, ACCUM), nproc=NPROC, cwd=cwd)
    return run_horovodrun(script, _args(B, ACCUM), nproc=NPROC, cwd=cwd)


@pytest.mark.parametrize("backend", ["ddp", pytest.param("horovod", marks=pytest.mark.horovod)])
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_other_spellings_of_the_step_condition(spelling, backend, tmp_path):
    source, target = _respelled(spelling, backend, tmp_path)
    text = target.read_text()
    if backend == "ddp":
        assert "with model.no_sync() if " in text
    else:
        assert "backward_passes_per_step=args.accum_steps" in text
    big = tmp_path / "big"
    big.mkdir()
    run_python(source, _args(NPROC * ACCUM * B, 1), cwd=big)
    run = tmp_path / "run"
    run.mkdir()
    _launch(backend, target, run)
    assert_same_weights(load_state(big / "final.pt"), load_state(run / "final.pt"), atol=1e-5, label=spelling)
    if backend == "ddp":
        for counts in _counted_run(target, tmp_path):
            assert counts["allreduce"] == counts["steps"], counts  # one bucket, once per optimizer step


@pytest.mark.horovod
def test_control_horovod_without_backward_passes_per_step_fails(tmp_path):
    _, target = _respelled("named_flag", "horovod", tmp_path)
    text = target.read_text()
    assert ", backward_passes_per_step=args.accum_steps" in text
    target.write_text(text.replace(", backward_passes_per_step=args.accum_steps", ""))
    with pytest.raises(Exception, match="backward_passes_per_step"):
        _launch("horovod", target, tmp_path)
