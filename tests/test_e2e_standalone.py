"""Executed equivalence of ``distify --standalone`` output, run where distify cannot be imported.

Every migrated script here runs with a sitecustomize that makes ``import distify`` fail (a control
run shows the same block stops the default output, which imports distify.runtime). Under it:

* DDP: 2 ranks under torchrun (gloo, CPU) at per-rank batch B end with the weights of the original
  at batch 2B, epoch lines appear once, and the script run as plain ``python`` (the one-process
  fallback of the inline helpers) equals the original at batch B;
* Horovod: the same under ``horovodrun --gloo -np 2``, and as plain ``python``.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    SCENARIOS,
    assert_same_weights,
    load_state,
    migrate,
    original_weights,
    run_python,
    run_horovodrun,
    run_torchrun,
)

pytestmark = pytest.mark.e2e

B = 16
NPROC = 2
EPOCHS = 2
DDP_ATOL = 1e-5
PLAIN_ATOL = 1e-6

SCENARIO_ARGS = {
    "module_level": (),
    "trainer_class": ("--checkpoint-dir", "ckpts"),
    "examples_style": ("--save-model",),
}

_BLOCK_DISTIFY = '''\
"""Test-only sitecustomize: `import distify` (and any distify.*) fails in this interpreter."""
import sys


class _NoDistify:
    def find_spec(self, name, path=None, target=None):
        if name == "distify" or name.startswith("distify."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: standalone test)", name=name)
        return None


sys.meta_path.insert(0, _NoDistify())
'''


def train_args(name, batch):
    return ["--batch-size", batch, "--epochs", EPOCHS, "--checkpoint", "final.pt", *SCENARIO_ARGS[name]]


def epoch_lines(output: str):
    """'epoch <n>' lines (horovodrun's '[rank]<stdout>:' prefixes removed, tqdm's \\r split)."""
    lines = [re.sub(r"^\[\d+\]<std(?:out|err)>:", "", line) for line in re.split(r"[\r\n]+", output)]
    return [line for line in lines if re.match(r"epoch \d+\b", line)]


@pytest.fixture(scope="module")
def no_distify(tmp_path_factory) -> dict:
    """Environment additions under which `import distify` fails."""
    folder = tmp_path_factory.mktemp("no-distify")
    (folder / "sitecustomize.py").write_text(_BLOCK_DISTIFY)
    return {"PYTHONPATH": str(folder)}


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    return original_weights(tmp_path_factory, SCENARIOS, train_args)


def standalone_script(name, backend, folder: Path) -> Path:
    target = folder / f"{name}.py"
    migrate(SCENARIOS / f"{name}.in.py", target, backend=backend, extra_args=["--standalone"])
    text = target.read_text()
    assert "# distify: standalone runtime" in text, text[:2000]
    imports = [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [ast.unparse(n) for n in imports if "distify" in ast.unparse(n)]
    return target


def test_the_block_stops_the_default_output(no_distify, tmp_path):
    """Control: the default output imports distify.runtime, and under the block it cannot start."""
    script = tmp_path / "default.py"
    migrate(SCENARIOS / "module_level.in.py", script, backend="ddp")
    result = run_python(script, train_args("module_level", B), env=no_distify, check=False)
    assert result.returncode != 0 and "No module named 'distify'" in result.stderr, result.describe()


@pytest.mark.parametrize("name", ["trainer_class", "module_level"])
def test_ddp_standalone_two_ranks_match_big_batch(name, no_distify, originals, tmp_path):
    script = standalone_script(name, "ddp", tmp_path / "script")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = run_torchrun(script, train_args(name, B), nproc=NPROC, env=no_distify, cwd=run_dir)
    weights = load_state(run_dir / "final.pt")
    assert not [k for k in weights if k.startswith("module.")]
    assert_same_weights(originals(name, NPROC * B), weights, atol=DDP_ATOL, label=f"{name} standalone ddp")
    assert len(epoch_lines(result.output)) == EPOCHS, result.output[-3000:]


@pytest.mark.parametrize("name", ["trainer_class", "module_level"])
def test_fsdp_standalone_two_ranks_match_big_batch_and_plain_python(name, no_distify, originals, tmp_path):
    """--backend fsdp --standalone: distify cannot be imported, the inline class gives the process
    group and device, torch's fully_shard shards; 2 ranks x B gather the big-batch weights, and
    plain python (a one-process group) the original's at B."""
    script = standalone_script(name, "fsdp", tmp_path / "script")
    assert "fully_shard(" in script.read_text()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = run_torchrun(script, train_args(name, B), nproc=NPROC, env=no_distify, cwd=run_dir)
    assert_same_weights(originals(name, NPROC * B), load_state(run_dir / "final.pt"), atol=DDP_ATOL,
                        label=f"{name} standalone fsdp")
    assert len(epoch_lines(result.output)) == EPOCHS, result.output[-3000:]
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    run_python(script, train_args(name, B), env=no_distify, cwd=plain_dir)
    assert_same_weights(originals(name, B), load_state(plain_dir / "final.pt"), atol=PLAIN_ATOL, label="fsdp plain python")


def test_ddp_standalone_runs_with_plain_python(no_distify, originals, tmp_path):
    name = "trainer_class"
    script = standalone_script(name, "ddp", tmp_path / "script")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = run_python(script, train_args(name, B), env=no_distify, cwd=run_dir)
    assert_same_weights(originals(name, B), load_state(run_dir / "final.pt"), atol=PLAIN_ATOL, label="plain python")
    assert len(epoch_lines(result.output)) == EPOCHS
    assert sorted(p.name for p in (run_dir / "ckpts").iterdir()) == ["epoch_000.pt", "epoch_001.pt"]




@pytest.mark.horovod
def test_horovod_standalone_two_ranks_match_big_batch_and_plain_python(no_distify, originals, tmp_path):
    name = "examples_style"
    script = standalone_script(name, "horovod", tmp_path / "script")
    hvd_dir = tmp_path / "hvd"
    hvd_dir.mkdir()
    result = run_horovodrun(script, train_args(name, B), nproc=NPROC, env=no_distify, cwd=hvd_dir)
    weights = load_state(hvd_dir / "final.pt")
    assert_same_weights(originals(name, NPROC * B), weights, atol=DDP_ATOL, label=f"{name} standalone horovod")
    assert len(epoch_lines(result.output)) == EPOCHS, result.output[-3000:]

    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    run_python(script, train_args(name, B), env=no_distify, cwd=plain_dir)
    assert_same_weights(originals(name, B), load_state(plain_dir / "final.pt"), atol=PLAIN_ATOL, label="plain python")
