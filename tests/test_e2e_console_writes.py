"""Output by any route appears once: a ``sys.stdout.write`` progress line under torchrun (2 ranks, gloo).

``fixtures/DST302/console_writes.in.py`` writes its per-batch progress with ``sys.stdout.write``
(as PyTorch-GAN's scripts do) and its end-of-run summary with ``pprint``. Migrated, each line is
written once, under torchrun (ddp, fsdp) and horovodrun; the control (ddp) removes distify's guard
from the progress line and sees it once per rank.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, executed, launcher, migrate  # noqa: E402

pytestmark = pytest.mark.e2e

SRC = REPO_ROOT / "fixtures" / "DST302" / "console_writes.in.py"
GUARDS = {"ddp": "runtime.is_main_process()", "fsdp": "runtime.is_main_process()", "horovod": "hvd.rank() == 0"}
GUARDED = "            if {}:\n                sys.stdout.write("
PROGRESS = re.compile(r"\[Epoch (\d)/2\] \[Batch (\d)/(\d)\]")


def _progress(stdout: str) -> list:
    return PROGRESS.findall(stdout)


def _run(script: Path, backend: str = "ddp"):
    result = launcher(backend)(script, timeout=180, check=False)
    assert result.returncode == 0, result.describe()
    return result


@pytest.mark.parametrize("backend", [executed("DST302/console_writes", b, b) for b in ("ddp", "horovod", "fsdp")])
def test_a_stdout_write_progress_line_is_written_once(tmp_path, backend):
    script = tmp_path / "train.py"
    migrate(SRC, script, backend)
    assert GUARDED.format(GUARDS[backend]) in script.read_text()
    result = _run(script, backend)
    # 64 samples, 2 ranks, batch 8: 4 batches per rank and epoch, each written once
    assert _progress(result.stdout) == [(str(e), str(b), "4") for e in range(2) for b in range(4)], result.describe()
    assert result.stdout.count("'final_loss'") == 1, result.describe()  # pprint's summary


def test_control_without_the_guard_every_rank_writes_it(tmp_path):
    script = tmp_path / "train.py"
    migrate(SRC, script, "ddp")
    script.write_text(script.read_text().replace(GUARDED.format(GUARDS["ddp"]), "            sys.stdout.write("))
    result = _run(script)
    lines = _progress(result.stdout)
    assert len(lines) == 16 and all(lines.count(x) == 2 for x in set(lines)), result.describe()
