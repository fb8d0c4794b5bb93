"""The warm launcher (tests/scripts/warm_ranks.py) keeps the contract the end-to-end tests rely on.

Most end-to-end tests fork their ranks from one warm process instead of starting torchrun or
horovodrun (e2e_support.LAUNCH_MODE). That is only sound while a script sees what the real launcher
gives it: these tests compare the two launches of one script, variable by variable, and check the
launcher's behaviour on failure. Each uses real launches on purpose (real=True).
"""
from __future__ import annotations

import re

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from e2e_support import RunFailed, run_horovodrun, run_python, run_torchrun  # noqa: E402

pytestmark = pytest.mark.e2e

DUMP = """\
import json, os, sys
rank = os.environ.get("HOROVOD_RANK") or os.environ.get("RANK") or "single"
seen = {k: v for k, v in os.environ.items() if k in json.loads(os.environ["BASE_KEYS"]) or k in ("OMP_NUM_THREADS",)}
json.dump({"env": sorted(set(os.environ) - set(json.loads(os.environ["BASE_KEYS"]))), "values": dict(os.environ),
           "argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0], "main": __name__},
          open(f"dump-{rank}.json", "w"))
print("hello from", rank)
"""

# What a real launcher gives that the warm one cannot or need not: torchrun's error file and signal
# list belong to its agent process; without an agent, rank 0 hosts the store (USE_AGENT_STORE).
AGENT_ONLY = {"TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE"}
PER_RUN = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "HOROVOD_GLOO_RENDEZVOUS_PORT",
           "TORCHELASTIC_USE_AGENT_STORE"}


def _dumps(launch, tmp_path, name, real):
    folder = tmp_path / name
    folder.mkdir()
    script = folder / "dump.py"
    script.write_text(DUMP)
    base = json.dumps(sorted(os.environ) + ["BASE_KEYS", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "OMP_NUM_THREADS"])
    result = launch(script, ["--flag", "x y"], env={"BASE_KEYS": base}, cwd=folder, real=real)
    return result, {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("dump-*.json"))}


@pytest.mark.parametrize("launcher", [
    pytest.param("torchrun", id="torchrun"),
    pytest.param("horovodrun", id="horovodrun", marks=pytest.mark.horovod),
    pytest.param("python", id="python"),
])
def test_a_warm_launch_gives_the_script_what_the_real_launcher_gives(launcher, tmp_path):
    launch = {"torchrun": run_torchrun, "horovodrun": run_horovodrun, "python": run_python}[launcher]
    real_result, real = _dumps(launch, tmp_path, "real", real=True)
    warm_result, warm = _dumps(launch, tmp_path, "warm", real=False)
    assert sorted(real) == sorted(warm) and real, (real_result.describe(), warm_result.describe())
    for name in real:
        r, w = real[name], warm[name]
        assert set(r["env"]) - AGENT_ONLY == set(w["env"]), f"{launcher} {name}: variables differ"
        for key in set(r["env"]) - AGENT_ONLY - PER_RUN:
            assert r["values"][key] == w["values"][key], f"{launcher} {name}: {key} differs"
        assert r["argv"] == w["argv"] == ["--flag", "x y"]
        assert (r["main"], os.path.basename(r["cwd"]), os.path.basename(r["path0"])) == ("__main__", "real", "real")
        assert (w["main"], os.path.basename(w["cwd"]), os.path.basename(w["path0"])) == ("__main__", "warm", "warm")
    ranks = len(real)
    assert warm_result.stdout.count("hello from") == real_result.stdout.count("hello from") == ranks


def test_warm_ranks_draw_their_own_random_numbers_as_fresh_processes_do(tmp_path):
    """A fresh interpreter seeds torch's and numpy's generators from the OS: unseeded, two ranks
    initialise different weights. Forked ranks must too, or a test of a broadcast that makes them
    agree could not fail."""
    script = tmp_path / "draw.py"
    script.write_text("import os, random, numpy, torch\n"
                      "print(f'draw {torch.rand(1).item()} {numpy.random.rand()} {random.random()}', flush=True)\n")
    result = run_torchrun(script, cwd=tmp_path)
    # the two ranks write to one pipe: each line in one write (print writes its arguments one by
    # one, which the ranks interleave), read wherever it lands
    draws = [list(m) for m in re.findall(r"draw (\S+) (\S+) (\S+)", result.stdout)]
    assert len(draws) == 2, result.describe()
    assert all(a != b for a, b in zip(*draws)), draws


def test_a_failing_rank_fails_the_warm_launch_and_stops_the_others(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n    sys.exit(3)\n"
        "time.sleep(120)\n"  # rank 0 would outlive the test unless the launcher stops it
    )
    result = run_torchrun(script, cwd=tmp_path, check=False, timeout=60)
    assert result.returncode == 3, result.describe()
    assert "rank 1 failed (exitcode: 3)" in result.stderr
    with pytest.raises(RunFailed):
        run_torchrun(script, cwd=tmp_path, timeout=60)


def test_a_warm_rank_still_running_at_the_timeout_is_reported(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(120)\n")
    with pytest.raises(RunFailed, match="timed out"):
        run_torchrun(script, cwd=tmp_path, timeout=3)
