"""Executed: a detection-style forward with an early return (fixtures/DST104/early_return_forward)
on 2 ranks under every backend. The classifier head is reached before and after `if targets is
None: return ...`, so the model is wrapped without find_unused_parameters (DDP) and sharded (FSDP:
a first version of the contract fact refused it). Each backend's run at batch 8 per rank ends with
the weights of the original run whole at batch 16 (the loss is a batch mean, the loader unshuffled).
Control: the same migration with the averaging taken out (DDP's wrap) ends elsewhere."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    REPO_ROOT, assert_same_weights, executed, load_state, migrate, run_horovodrun, run_python, run_torchrun,
)

pytestmark = pytest.mark.e2e

CASE = "DST104/early_return_forward"
SOURCE = REPO_ROOT / "fixtures" / f"{CASE}.in.py"


def _final(script: Path, workdir: Path, launch, batch: int) -> dict:
    workdir.mkdir()
    launch(script, ["--batch-size", batch], cwd=workdir)
    return load_state(workdir / "final.pt")


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    return _final(SOURCE, tmp_path_factory.mktemp("orig") / "run", lambda s, a, cwd: run_python(s, a, cwd=cwd), 16)


@pytest.mark.parametrize("backend", [executed(CASE, b, b) for b in ("ddp", "fsdp", "horovod")])
def test_an_early_return_forward_trains_like_the_original(tmp_path, backend, original):
    script = tmp_path / "train.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    assert "find_unused_parameters=True" not in text
    launch = run_horovodrun if backend == "horovod" else run_torchrun
    found = _final(script, tmp_path / "run", lambda s, a, cwd: launch(s, a, nproc=2, cwd=cwd), 8)
    assert_same_weights(found, original, atol=1e-5, label=f"{backend} vs original at twice the batch")
    if backend == "ddp":
        control = tmp_path / "control.py"
        control.write_text(text.replace("model = runtime.DDP(TinyDetector())", "model = TinyDetector()")
                           .replace("model.module.state_dict()", "model.state_dict()"))
        drifted = _final(control, tmp_path / "control", lambda s, a, cwd: launch(s, a, nproc=2, cwd=cwd), 8)
        with pytest.raises(AssertionError, match="weights differ"):
            assert_same_weights(drifted, original, atol=1e-5, label="control")
