"""Scripts that read torchrun's RANK / LOCAL_RANK themselves, run under horovodrun (which sets
neither): DST005 makes the runtime answer, so per-rank files stay per rank and a `rank == 0` guard
still picks one writer. Each case has a control: the migrated script with the original
environment read put back must show the collision the rule prevents."""
from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, fs_spy_env, migrate, read_fs_log, run_horovodrun  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.horovod]

FIXTURES = REPO_ROOT / "fixtures"


def _writers(tmp_path, script) -> dict:
    """{file name: set of ranks that wrote it} for one 2-rank horovodrun launch of `script`."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    log = tmp_path / "fs.log"
    env = fs_spy_env(tmp_path / "spy", log)
    result = run_horovodrun(script, (), nproc=2, env=env, cwd=workdir)
    assert result.returncode == 0, result.describe()
    writers = collections.defaultdict(set)
    for event in read_fs_log(log, under=workdir):
        if event.kind in ("write", "save"):
            writers[Path(event.path).name].add(event.rank)
    return dict(writers)


def _migrated(tmp_path, case: str) -> Path:
    target = tmp_path / f"{Path(case).name}.py"
    migrate(FIXTURES / f"{case}.in.py", target, backend="horovod")
    return target


def _restore_environment_read(script: Path, helper: str, var: str) -> None:
    text = script.read_text()
    assert f"runtime.{helper}()" in text
    script.write_text(text.replace(f"runtime.{helper}()", f'int(os.environ.get("{var}", 0))'))


@pytest.mark.parametrize("control", [False, True], ids=["migrated", "control-env-read-kept"])
def test_per_rank_files_stay_per_rank_under_horovodrun(tmp_path, control):
    script = _migrated(tmp_path, "DST304/per_rank_files")
    if control:
        _restore_environment_read(script, "local_rank", "LOCAL_RANK")
    writers = _writers(tmp_path, script)
    per_rank = {name: ranks for name, ranks in writers.items() if name.startswith(("train_rank", "predictions_"))}
    collisions = {name: ranks for name, ranks in per_rank.items() if len(ranks) > 1}
    if control:
        assert collisions, f"without the rule both ranks should collide on one file name: {writers}"
        return
    assert not collisions, f"a per-rank file written by several ranks: {collisions}"
    assert sorted(per_rank) == ["predictions_0.pt", "predictions_1.pt", "train_rank0.log", "train_rank1.log"]
    assert writers["summary.txt"] == {"0"}, writers


@pytest.mark.parametrize("control", [False, True], ids=["migrated", "control-env-read-kept"])
def test_rank_guard_from_the_environment_picks_one_writer(tmp_path, control):
    script = _migrated(tmp_path, "DST301/already_guarded")
    if control:
        _restore_environment_read(script, "rank", "RANK")
    writers = _writers(tmp_path, script)
    if control:
        assert writers.get("model.pt") == {"0", "1"}, writers
    else:
        assert writers.get("model.pt") == {"0"}, writers
