"""Executed: training losses summed over the batch (DST131) on 2 ranks under every backend.

fixtures/DST131/sparse_autoencoder (a reconstruction error and an L1 penalty, both summed, in the
script's own loss function of what the model's forward returns) and fixtures/DST131/
trainer_sum_criterion (a trainer's `self.loss_fn = nn.SmoothL1Loss(reduction="sum")`, stepped
through a GradScaler). The gradient averaging of DDP, FSDP and Horovod divides a summed loss's
gradient by the number of ranks; scaled by the world size, each backend's run at batch 8 per rank
ends with the weights of the original at batch 16, and the epoch's loss per sample it prints (a
per-sample sum reduced over the ranks, DST206) is the original's. Control: the same migration
without the scaling ends elsewhere."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    REPO_ROOT, assert_same_weights, executed, load_state, migrate, run_horovodrun, run_python, run_torchrun,
)

pytestmark = pytest.mark.e2e

CASES = ("DST131/sparse_autoencoder", "DST131/trainer_sum_criterion")
SCALE = re.compile(r" \* (dist\.get_world_size\(\)|hvd\.size\(\))")


def _run(script: Path, workdir: Path, launch, batch: int):
    workdir.mkdir()
    result = launch(script, ["--batch-size", batch], cwd=workdir)
    losses = re.findall(r"loss per sample ([0-9.]+)", result.stdout)
    return load_state(workdir / "final.pt"), losses


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    out = {}
    for case in CASES:
        root = tmp_path_factory.mktemp(case.replace("/", "_"))
        out[case] = _run(REPO_ROOT / "fixtures" / f"{case}.in.py", root / "run",
                         lambda s, a, cwd: run_python(s, a, cwd=cwd), 16)
    return out


@pytest.mark.parametrize("case,backend", [
    executed(case, backend, case, backend) for case in CASES for backend in ("ddp", "fsdp", "horovod")
])
def test_a_summed_loss_trains_like_the_original(tmp_path, case, backend, originals):
    script = tmp_path / "train.py"
    migrate(REPO_ROOT / "fixtures" / f"{case}.in.py", script, backend=backend)
    text = script.read_text()
    assert len(SCALE.findall(text)) == 1, text
    launch = run_horovodrun if backend == "horovod" else run_torchrun
    two = lambda s, a, cwd: launch(s, a, nproc=2, cwd=cwd)  # noqa: E731
    weights, losses = _run(script, tmp_path / "run", two, 8)
    want_weights, want_losses = originals[case]
    assert_same_weights(weights, want_weights, atol=1e-5, label=f"{backend} vs original at twice the batch")
    assert losses == want_losses
    if backend in ("ddp", "horovod"):
        control = tmp_path / "control.py"
        control.write_text(SCALE.sub("", text))
        drifted, _ = _run(control, tmp_path / "control", two, 8)
        with pytest.raises(AssertionError, match="weights differ"):
            assert_same_weights(drifted, want_weights, atol=1e-5, label="control")


CONTRASTIVE = "DST131/contrastive_negatives"


@pytest.mark.runs(CONTRASTIVE, "ddp")
def test_a_contrastive_loss_is_warned_about_because_it_differs(tmp_path):
    """What DST131 warns about is real: the NT-Xent loss of fixtures/DST131/contrastive_negatives,
    each rank comparing only its own shard's samples, ends away from the original at twice the
    batch. Control: the same migration with a loss that pairs no samples (each with its own other
    view) ends with the original's weights, so the difference is the negatives, not the migration."""
    source = REPO_ROOT / "fixtures" / f"{CONTRASTIVE}.in.py"
    script = tmp_path / "train.py"
    result = migrate(source, script, backend="ddp")
    assert "DST131" in result.stderr and "compares the batch's samples with each other" in result.stderr
    two = lambda s, a, cwd: run_torchrun(s, a, nproc=2, cwd=cwd)  # noqa: E731
    one = lambda s, a, cwd: run_python(s, a, cwd=cwd)  # noqa: E731
    want, _ = _run(source, tmp_path / "orig", one, 16)
    got, _ = _run(script, tmp_path / "run", two, 8)
    with pytest.raises(AssertionError, match="weights differ"):
        assert_same_weights(got, want, atol=1e-5, label="contrastive")
    own_view = "    return (first - second).pow(2).mean()\n"
    body = "    embeddings = F.normalize(torch.cat([first, second]), dim=1)\n"
    for path in (source, script):
        text = path.read_text() if path is script else source.read_text()
        assert body in text
        start = text.index(body)
        end = text.index("    return F.cross_entropy(similarity, positives)\n") + len("    return F.cross_entropy(similarity, positives)\n")
        (tmp_path / f"paired_{path.name}").write_text(text[:start] + own_view + text[end:])
    want, _ = _run(tmp_path / f"paired_{source.name}", tmp_path / "orig2", one, 16)
    got, _ = _run(tmp_path / "paired_train.py", tmp_path / "run2", two, 8)
    assert_same_weights(got, want, atol=1e-5, label="a loss of each sample alone")
