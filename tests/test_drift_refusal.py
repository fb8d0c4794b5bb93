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


def test_drift_in_a_project_module_refuses_every_file(tmp_path):
    """The loop (and the optimizer over a model handed in) live in another module of the project:
    the migration goes through the project view, whose audit finds DST954 in loop.py. Like the
    one-file path it must refuse (exit 3, no file written), not write both files with a warning."""
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        "from loop import fit\n\n\ndef main():\n"
        "    ds = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
        "    loader = DataLoader(ds, batch_size=4, shuffle=True)\n"
        "    model = nn.Linear(4, 1)\n    fit(model, loader, 2)\n"
        "    torch.save(model.state_dict(), 'm.pt')\n\n\nif __name__ == '__main__':\n    main()\n")
    (tmp_path / "loop.py").write_text(
        "import torch\nfrom torch import nn\n\n\ndef fit(model, loader, epochs):\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    scaler = torch.amp.GradScaler('cpu', enabled=False)\n"
        "    for epoch in range(epochs):\n        for x, y in loader:\n            opt.zero_grad()\n"
        "            scaler.scale(nn.functional.mse_loss(model(x), y)).backward()\n"
        "            scaler.step(opt)\n            scaler.update()\n")
    before = {p: p.read_bytes() for p in tmp_path.glob("*.py")}
    done = subprocess.run([sys.executable, "-m", "distify", "train.py", "--backend", "ddp", "--no-cache"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert {p: p.read_bytes() for p in tmp_path.glob("*.py")} == before
    assert "loop.py:6:11: DST954" in done.stderr and "files not migrated" in done.stderr, done.stderr
