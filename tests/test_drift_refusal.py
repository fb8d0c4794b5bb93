"""A migration whose own audit finds an optimizer stepping parameters no wrapper owns (DST954) is
refused, not written with a warning: the written script's replicas would drift apart from the first
step, with no error (issue 22). The project is the corpus' UNet layout, where the model is a
parameter of `train_model()` built by its caller in another scope."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "fixtures" / "corpus" / "projects" / "unet_evaluate_module"


def _run(tmp_path: Path, backend: str):
    home = tmp_path / "proj"
    shutil.copytree(PROJECT, home)
    before = {p: p.read_bytes() for p in home.rglob("*.py")}
    done = subprocess.run([sys.executable, "-m", "distify", "train.py", "--backend", backend, "--no-cache"],
                          cwd=home, capture_output=True, text=True, timeout=300)
    after = {p: p.read_bytes() for p in home.rglob("*.py")}
    return done, before == after


def test_an_output_whose_replicas_would_drift_is_refused(tmp_path):
    done, untouched = _run(tmp_path, "ddp")
    assert done.returncode == 3, done.stdout + done.stderr
    assert untouched
    assert "DST954" in done.stderr and "file not migrated" in done.stderr


@pytest.mark.parametrize("backend", ["horovod"])
def test_the_same_project_under_horovod_is_written(tmp_path, backend):
    """Horovod averages through the optimizer it wraps, wherever the model was built: no drift, so
    the project is migrated (the refusal is not a blanket one)."""
    done, untouched = _run(tmp_path, backend)
    assert done.returncode == 1, done.stdout + done.stderr
    assert not untouched
