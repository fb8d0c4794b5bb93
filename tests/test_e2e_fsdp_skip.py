"""Executed: FSDP2 and a forward that can skip parameters (issue 22; DST104 refuses it under FSDP).

What fully_shard does when a parameter gets no gradient on some rank in a step, measured here with
torch 2.13 (gloo, 2 ranks): it reduce-scatters the gradients each rank holds, so

- skipped on every rank alike (a member defined in ``__init__`` and never called): trains, and the
  ranks agree (``test_a_member_no_rank_uses_trains_under_fsdp``, the DST101 ``unused_head`` golden);
- skipped on one rank and used on another: the collectives differ in size; the root-only shard
  distify writes aborts ("collective mismatch"), a separately sharded submodule hangs. There is no
  ``find_unused_parameters`` for FSDP2, so distify refuses (exit 3). The test runs the refused script
  migrated anyway (``--ignore DST104``, the control: the fix taken away) and sees it fail.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import FSDP_SPY, REPO_ROOT, migrate, run_torchrun, sitecustomize_env  # noqa: E402

pytestmark = pytest.mark.e2e

FIXTURES = REPO_ROOT / "fixtures" / "DST101"


def test_a_member_no_rank_uses_trains_under_fsdp(tmp_path):
    import torch

    script = tmp_path / "train.py"
    migrate(FIXTURES / "unused_head.in.py", script, backend="fsdp")
    assert "fully_shard(model)" in script.read_text()
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    env = sitecustomize_env(tmp_path / "spy", FSDP_SPY, {"DISTIFY_E2E_FSDP_DIR": str(dumps)})
    run_torchrun(script, nproc=2, env=env, cwd=tmp_path)
    ranks = [torch.load(dumps / f"rank{r}.pt")["params"] for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) > 0
    assert all(torch.equal(a, b) for a, b in zip(*ranks)), "the ranks hold different weights"


def test_a_skip_that_differs_by_rank_is_refused_and_would_fail(tmp_path):
    source = (FIXTURES / "dropped_label.in.py").read_text()
    script = tmp_path / "train.py"
    script.write_text(source)
    refused = subprocess.run([sys.executable, "-m", "distify", "--backend", "fsdp", str(script)],
                             capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode == 3 and "DST104" in refused.stderr, refused.stderr
    assert script.read_text() == source
    # control: migrated without the refusal. Each process draws its own `random.random()` (a real
    # launch: fresh interpreters); at p = 0.5 the ranks disagree in the first step with probability 1/2,
    # over the 12 steps all but 2**-12 of the time.
    src = tmp_path / "src.py"
    src.write_text(source.replace("random.random() < 0.1", "random.random() < 0.5"))
    migrate(src, script, backend="fsdp", extra_args=["--ignore", "DST104"])
    assert "fully_shard(model)" in script.read_text()
    result = run_torchrun(script, nproc=2, cwd=tmp_path, check=False, real=True, timeout=120)
    assert result.returncode != 0, "a step skipping label_emb on one rank only trained without error"
    assert "mismatch" in result.output, result.describe()
