"""Executed: a model trained outside its forward (issue 22, item 1: the DDP contract).

Two shapes: fixtures/DST102/fit_method_on_model (the module's own Keras-style ``fit`` loop calls
``self(x)``, backward and step) and fixtures/DST102/submodules_in_training (the loop calls
``model.encoder`` and ``model.decoder``, never the model). DDP averages the gradients of a forward
called through its wrapper only, so both are refused under DDP (and the submodules under FSDP too,
whose shards are gathered around a forward only); the backends that can run them are launched on 2
ranks (torchrun for fsdp, horovodrun --gloo for horovod) and must end with identical ranks and the
weights of the original at twice the batch (seeded, no shuffling, plain SGD / Adam).

Control: the DDP output distify wrote before the fact (the method or submodule reached through
``.module``, the file written), produced by the same engine with the fact switched off, is
launched under torchrun: the ranks end apart.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    REPO_ROOT, assert_same_weights, executed, load_state, migrate, rank_parameters, run_python, same_on_every_rank,
)

pytestmark = pytest.mark.e2e

FIT = REPO_ROOT / "fixtures" / "DST102" / "fit_method_on_model.in.py"
PARTS = REPO_ROOT / "fixtures" / "DST102" / "submodules_in_training.in.py"
B = 8


def _original(source: Path, work: Path) -> dict:
    work.mkdir(parents=True)
    run_python(source, ["--batch-size", 2 * B], cwd=work)
    return load_state(work / "final.pt")


@pytest.mark.parametrize("source,backend", [
    executed("DST102/fit_method_on_model", "fsdp", FIT, "fsdp", id="fit-fsdp"),
    executed("DST102/fit_method_on_model", "horovod", FIT, "horovod", id="fit-horovod"),
    executed("DST102/submodules_in_training", "horovod", PARTS, "horovod", id="parts-horovod"),
])
def test_training_outside_forward_runs_where_the_backend_can(source, backend, tmp_path):
    script = tmp_path / "script" / "train.py"
    migrate(source, script, backend=backend)
    _, ranks = rank_parameters(script, ["--batch-size", B], tmp_path / "run", backend)
    assert same_on_every_rank(ranks), "the ranks ended with different parameters"
    assert_same_weights(_original(source, tmp_path / "original"), load_state(tmp_path / "run" / "final.pt"),
                        atol=1e-5, label=f"{backend}: 2 ranks x {B} vs batch {2 * B}")


@pytest.mark.parametrize("source", [FIT, PARTS], ids=["fit", "parts"])
def test_ddp_refuses_and_the_old_output_drifts(source, tmp_path, monkeypatch):
    from distify.engine import migrate_source
    from distify.options import Options

    out = migrate_source(source.read_bytes(), Options(backend="ddp"))
    assert out.refused and any(f.code == "DST102" for f in out.findings)
    # the fact switched off: what distify wrote before (the file, with `.module` reaching the method)
    import distify.rules.dst102_unwrap_module as dst102
    monkeypatch.setattr(dst102, "trains_inside", lambda *a: False)
    monkeypatch.setattr(dst102, "runs_submodule", lambda *a: False)
    old = migrate_source(source.read_bytes(), Options(backend="ddp"))
    assert not old.refused and "model.module." in old.output.decode()
    control = tmp_path / "old" / "train.py"
    control.parent.mkdir()
    control.write_bytes(old.output)
    _, ranks = rank_parameters(control, ["--batch-size", B], tmp_path / "control", "ddp")
    assert not same_on_every_rank(ranks), "control: the old output's ranks still agreed"
