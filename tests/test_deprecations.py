"""Nothing distify writes provokes a deprecation warning.

Migrated scripts run with a sitecustomize that records every DeprecationWarning and FutureWarning
with its call stack (e2e_support.DEPRECATION_SPY); each warning is charged to whoever made the call:
distify (a line it wrote into the script, or the runtime), the user (a line of their own), or other
code. What distify writes must cause none (torch's own: torch.cuda.amp.*, torch.distributed.launch,
...). The corpus end-to-end runs (test_e2e_corpus.py) apply the same check to every runnable corpus
script under torchrun and horovodrun; here the standalone goldens run as plain ``python``, and two
controls show the check sees warnings at all and charges them to the right author.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, deprecation_spy_env, deprecations_by_author, run_python  # noqa: E402

pytestmark = pytest.mark.e2e

FIXTURES = REPO_ROOT / "fixtures"
STANDALONE = sorted(p.name[: -len(".in.py")] for p in (FIXTURES / "standalone").glob("*.in.py"))


def run_recorded(golden: Path, original: Path, tmp_path: Path, text=None, args=()) -> dict:
    """Run a copy of `golden` (or `text`) as plain python; its deprecations by author."""
    script = tmp_path / "script" / golden.name
    script.parent.mkdir(parents=True)
    if text is None:
        shutil.copyfile(golden, script)
    else:
        script.write_text(text)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = deprecation_spy_env(tmp_path / "spy", tmp_path / "warnings")
    # the fixture's own folder after the spy: its helper modules (cifar_utils.py) import as they
    # would next to the script
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(original.parent)])
    run_python(script, args, env=env, cwd=run_dir)
    return deprecations_by_author(tmp_path / "warnings", original, script)


@pytest.mark.parametrize("backend", ["ddp", pytest.param("horovod", marks=pytest.mark.horovod)])
@pytest.mark.parametrize("name", STANDALONE)
def test_standalone_output_provokes_no_deprecation(name, backend, tmp_path):
    found = run_recorded(FIXTURES / "standalone" / f"{name}.{backend}.py",
                         FIXTURES / "standalone" / f"{name}.in.py", tmp_path)
    assert found["distify"] == [], "\n".join(found["distify"])


def test_control_a_users_deprecated_amp_is_seen_and_charged_to_the_user(tmp_path):
    """amp_cuda_scaler's own `from torch.cuda.amp import GradScaler, autocast` warns (torch >= 2.4):
    the spy sees it, and charges it to the user's unchanged lines, not to distify."""
    found = run_recorded(FIXTURES / "corpus" / "amp_cuda_scaler.ddp.py",
                         FIXTURES / "corpus" / "amp_cuda_scaler.in.py", tmp_path, args=["--epochs", "1"])
    assert any("torch.cuda.amp" in w and "GradScaler" in w for w in found["user"]), found
    assert found["distify"] == [], "\n".join(found["distify"])


def test_control_b_a_deprecated_call_on_a_written_line_is_charged_to_distify(tmp_path):
    """The same deprecated call put on a line distify wrote (the init_process_group line) is
    charged to distify: the check would catch distify writing it."""
    golden = FIXTURES / "scenarios" / "module_level.ddp.py"
    line = "dist.init_process_group(**runtime.init_kwargs())"
    text = golden.read_text()
    assert line in text
    text = text.replace(line, line + "; torch.cuda.amp.GradScaler(enabled=False)", 1)
    found = run_recorded(golden, FIXTURES / "scenarios" / "module_level.in.py", tmp_path, text=text,
                         args=["--epochs", "1"])
    assert any("GradScaler" in w for w in found["distify"]), found
