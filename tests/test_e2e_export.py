"""Executed: a model exported after training (fixtures/DST304/torchscript_export: torch.jit.trace,
traced.save, torch.jit.save(torch.jit.script(model)), then torch.jit.load of the export on every
rank) is exported from the module, not from the wrapper, and written by rank 0 alone. On 2 ranks
(torchrun for ddp, horovodrun --gloo for horovod) a spy records which rank writes each export: rank
0 writes both, once; each export loads and holds the bare model's parameter names (no `module.`),
and answers like the trained model (the script's own check prints True, once). FSDP refuses the
export of a sharded model (its golden is the refusal). Controls: DDP without the unwrap fails
(TorchScript cannot compile DDP's forward); Horovod without the guards has both ranks write."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, RunFailed, executed, launcher, migrate, sitecustomize_env  # noqa: E402

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST304" / "torchscript_export.in.py"

# every TorchScript write (ScriptModule.save, torch.jit.save) appends "<rank> <file name>" to a log
WRITE_SPY = '''\
import os

_EXPORT_LOG = os.environ.get("DISTIFY_E2E_EXPORT_LOG")
if _EXPORT_LOG:
    def _patch_exports(torch):
        rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "single"

        def _record(f):
            with open(_EXPORT_LOG, "a") as log:
                log.write(f"{rank} {os.path.basename(str(f))}\\n")

        jit_save = torch.jit.save

        def _jit_save(m, f, *args, **kwargs):
            _record(f)
            return jit_save(m, f, *args, **kwargs)

        script_save = torch.jit.ScriptModule.save

        def _script_save(self, f, *args, **kwargs):
            _record(f)
            return script_save(self, f, *args, **kwargs)

        torch.jit.save, torch.jit.ScriptModule.save = _jit_save, _script_save

    _after_torch_import(_patch_exports)
'''


def _run(script: Path, work: Path, backend: str):
    work.mkdir(parents=True)
    log = work / "writes.log"
    env = sitecustomize_env(work / "spy", WRITE_SPY, {"DISTIFY_E2E_EXPORT_LOG": str(log)})
    result = launcher(backend)(script, ["--out", work / "export"], nproc=2, env=env, cwd=work)
    return result, sorted(log.read_text().splitlines()) if log.exists() else []


@pytest.mark.parametrize("backend", [executed("DST304/torchscript_export", b, b, id=b) for b in ("ddp", "horovod")])
def test_the_export_is_of_the_module_and_written_once(backend, tmp_path):
    import torch

    script = tmp_path / "script" / "train.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    result, writes = _run(script, tmp_path / "migrated", backend)
    assert writes == ["0 regressor_scripted.pt", "0 regressor_traced.pt"], writes
    assert result.stdout.count("export matches the model: True") == 1, result.stdout
    names = {"body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"}
    for name in ("regressor_traced.pt", "regressor_scripted.pt"):
        exported = torch.jit.load(str(tmp_path / "migrated" / "export" / name))
        assert set(exported.state_dict()) == names

    control = tmp_path / "script" / "old.py"
    if backend == "ddp":
        old = text.replace("torch.jit.trace(model.module,", "torch.jit.trace(model,").replace(
            "torch.jit.script(model.module)", "torch.jit.script(model)")
        assert old != text
        control.write_text(old)
        with pytest.raises(RunFailed, match="NotSupportedError|RuntimeError"):
            _run(control, tmp_path / "control", backend)
        return
    guard = "    if hvd.rank() == 0:\n"
    old = text.replace(guard + "        traced.save(", "    traced.save(").replace(
        guard + "        torch.jit.save(", "    torch.jit.save(")
    assert old != text
    control.write_text(old)
    _, writes = _run(control, tmp_path / "control", backend)
    assert writes == ["0 regressor_scripted.pt", "0 regressor_traced.pt", "1 regressor_scripted.pt",
                      "1 regressor_traced.pt"], writes
