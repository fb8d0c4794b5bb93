"""The pre-commit hooks, run by the real `pre-commit` in a temporary git repository.

The hooks are installed from this repository at its current commit (pre-commit clones it and builds
distify into its own virtualenv). A commit of an unmigrated training script fails under
`distify-check` with the file untouched; under `distify-fix` the first commit fails with the file
rewritten, and the rewritten file then commits cleanly.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "scenarios" / "module_level.in.py"

pytestmark = pytest.mark.e2e


def _git(*args, cwd, check=True, env=None):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check, env=env)


@pytest.fixture(scope="module")
def hook_rev():
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    if _git("status", "--porcelain", "--", ".pre-commit-hooks.yaml", "migrate", "rules", "pyproject.toml", cwd=ROOT).stdout.strip():
        pytest.skip("the hook sources have uncommitted changes: pre-commit installs a commit")
    return _git("rev-parse", "HEAD", cwd=ROOT).stdout.strip()


@pytest.fixture(scope="module")
def precommit_home(tmp_path_factory):
    return tmp_path_factory.mktemp("pre-commit-home")


def _repo(tmp_path: Path, rev: str, hook: str, args: str = "") -> Path:
    repo = tmp_path / "project"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    _git("config", "user.email", "dev@example.com", cwd=repo)
    _git("config", "user.name", "Dev", cwd=repo)
    (repo / ".pre-commit-config.yaml").write_text(
        "repos:\n"
        f"  - repo: {ROOT}\n"
        f"    rev: {rev}\n"
        "    hooks:\n"
        f"      - id: {hook}\n"
        "        files: '(^|/)train[^/]*\\.py$'\n"
        + (f"        args: {args}\n" if args else "")
    )
    (repo / "train.py").write_bytes(SCRIPT.read_bytes())
    (repo / "utils.py").write_text("def helper():\n    return 1\n")
    _git("add", ".", cwd=repo)
    return repo


def _commit(repo: Path, env):
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--all-files"], cwd=repo, capture_output=True, text=True, env=env,
        timeout=900,
    )


def _env(home: Path):
    env = dict(os.environ, PRE_COMMIT_HOME=str(home))
    env.pop("PRE_COMMIT", None)
    return env


def test_check_hook_fails_and_writes_nothing(tmp_path, hook_rev, precommit_home):
    repo = _repo(tmp_path, hook_rev, "distify-check")
    env = _env(precommit_home)
    subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, check=True, capture_output=True, env=env)
    result = _git("commit", "-qm", "add training script", cwd=repo, check=False, env=env)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "distify (check)" in result.stdout + result.stderr
    assert (repo / "train.py").read_bytes() == SCRIPT.read_bytes()


def test_fix_hook_rewrites_then_the_fixed_script_commits(tmp_path, hook_rev, precommit_home):
    repo = _repo(tmp_path, hook_rev, "distify-fix")
    env = _env(precommit_home)
    subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, check=True, capture_output=True, env=env)
    first = _git("commit", "-qm", "add training script", cwd=repo, check=False, env=env)
    assert first.returncode != 0, "the hook should fail the commit that needed rewriting"
    text = (repo / "train.py").read_text()
    assert "init_process_group" in text and "DistributedSampler(" in text and "DDP(" in text
    _git("add", "train.py", cwd=repo)
    second = _git("commit", "-qm", "add training script", cwd=repo, check=False, env=env)
    assert second.returncode == 0, second.stdout + second.stderr


def test_fix_hook_selects_the_fsdp_backend(tmp_path, hook_rev, precommit_home):
    """`args: [--backend, fsdp]` in the user's config: the fix hook shards the model (fully_shard,
    no DDP wrapper), and the sharded script then commits cleanly (the second run changes nothing)."""
    repo = _repo(tmp_path, hook_rev, "distify-fix", args="[--backend, fsdp]")
    env = _env(precommit_home)
    subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, check=True, capture_output=True, env=env)
    first = _git("commit", "-qm", "add training script", cwd=repo, check=False, env=env)
    assert first.returncode != 0, "the hook should fail the commit that needed rewriting"
    text = (repo / "train.py").read_text()
    assert "init_process_group" in text and "DistributedSampler(" in text and "fully_shard(" in text
    assert "DDP(" not in text
    _git("add", "train.py", cwd=repo)
    second = _git("commit", "-qm", "add training script", cwd=repo, check=False, env=env)
    assert second.returncode == 0, second.stdout + second.stderr


def test_lint_hook_fails_on_a_mistake_and_passes_once_fixed(tmp_path, hook_rev, precommit_home):
    """distify-lint on a hand-written DDP script: a missing set_epoch fails the commit (the file
    untouched); with set_epoch restored the same commit goes through."""
    good = (ROOT / "tests" / "lint_scripts" / "ddp_trainer.py").read_text()
    line = "        self.train_data.sampler.set_epoch(epoch)\n"
    assert line in good
    repo = _repo(tmp_path, hook_rev, "distify-lint")
    (repo / "train.py").write_text(good.replace(line, ""))
    _git("add", ".", cwd=repo)
    env = _env(precommit_home)
    subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, check=True, capture_output=True, env=env)
    first = _git("commit", "-qm", "add training script", cwd=repo, check=False, env=env)
    assert first.returncode != 0, first.stdout + first.stderr
    assert "DST952" in first.stdout + first.stderr
    assert (repo / "train.py").read_text() == good.replace(line, "")
    (repo / "train.py").write_text(good)
    _git("add", "train.py", cwd=repo)
    second = _git("commit", "-qm", "add training script", cwd=repo, check=False, env=env)
    assert second.returncode == 0, second.stdout + second.stderr


def test_lint_hook_checks_an_fsdp_script(tmp_path, hook_rev, precommit_home):
    """distify-lint on a hand-written FSDP2 script (no args: lint finds the backend in the script):
    an optimizer built before fully_shard fails the commit; the script as written passes."""
    good = (ROOT / "tests" / "lint_scripts" / "fsdp2_lm.py").read_text()
    line = "    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
    shard = "    for layer in model.layers:\n"
    assert line in good and shard in good
    bad = good.replace(line, "").replace(shard, line + shard)
    repo = _repo(tmp_path, hook_rev, "distify-lint")
    (repo / "train.py").write_text(bad)
    _git("add", ".", cwd=repo)
    env = _env(precommit_home)
    subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, check=True, capture_output=True, env=env)
    first = _git("commit", "-qm", "add training script", cwd=repo, check=False, env=env)
    assert first.returncode != 0, first.stdout + first.stderr
    assert "DST954" in first.stdout + first.stderr
    (repo / "train.py").write_text(good)
    _git("add", "train.py", cwd=repo)
    second = _git("commit", "-qm", "add training script", cwd=repo, check=False, env=env)
    assert second.returncode == 0, second.stdout + second.stderr


def test_fix_hook_fails_on_a_script_distify_refuses(tmp_path, hook_rev, precommit_home):
    """A refused script (a fixed cuda:1, DST904) exits 3: the fix hook fails the commit with the file
    untouched, where it used to pass (exit 0) on a script distify could not migrate."""
    refused = ROOT / "fixtures" / "DST904" / "second_gpu.in.py"
    repo = _repo(tmp_path, hook_rev, "distify-fix")
    (repo / "train.py").write_bytes(refused.read_bytes())
    _git("add", ".", cwd=repo)
    env = _env(precommit_home)
    subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, check=True, capture_output=True, env=env)
    result = _git("commit", "-qm", "add training script", cwd=repo, check=False, env=env)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "DST904" in result.stdout + result.stderr and "refused" in result.stdout + result.stderr
    assert (repo / "train.py").read_bytes() == refused.read_bytes()
