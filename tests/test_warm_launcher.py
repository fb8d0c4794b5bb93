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


AT_EXIT = """\
import atexit, os, sys, tempfile, weakref

model = object.__new__(type("Model", (), {}))  # a global of the script, as a trained model is
seen = weakref.ref(model)

# The handler is compiled outside the script's globals, as a library's is (verify's probe): it must
# not be what keeps them alive. One write: the ranks share one pipe.
handler = {}
exec("def report(seen, os, sys, tempfile):\\n"
     "    tmp = os.path.basename(tempfile.gettempdir())\\n"
     "    sys.stdout.write(f'at exit: global alive={seen() is not None} tmp={tmp};' + chr(10))\\n"
     "    sys.stdout.flush()\\n", handler)
atexit.register(handler["report"], seen, os, sys, tempfile)
"""


@pytest.mark.parametrize("launcher", [pytest.param("torchrun", id="torchrun"), pytest.param("python", id="python")])
def test_at_exit_the_script_globals_live_and_tempfile_reads_the_new_environment(launcher, tmp_path):
    """An interpreter runs its atexit handlers while ``__main__``'s globals are alive (verify's probe
    snapshots the optimizers there), and ``tempfile`` takes its folder from the environment it was
    started with. A forked rank must do both (forked_main): the warm launch prints what the real
    one prints. Controls, run by hand on 2026-12-04: with the script run by ``runpy.run_path``
    (forked_main before) the warm line says ``alive=False``; without forked_main's reset of
    ``tempfile.tempdir`` it names the warm parent's folder."""
    launch = {"torchrun": run_torchrun, "python": run_python}[launcher]
    lines = {}
    for mode in ("real", "warm"):
        folder = tmp_path / mode
        (folder / "own-tmp").mkdir(parents=True)
        script = folder / "at_exit.py"
        script.write_text(AT_EXIT)
        result = launch(script, env={"TMPDIR": str(folder / "own-tmp")}, cwd=folder, real=mode == "real")
        lines[mode] = sorted(re.findall(r"at exit: global alive=\w+ tmp=[\w-]+;", result.stdout))
    assert lines["real"] and all("alive=True tmp=own-tmp" in line for line in lines["real"]), lines
    assert lines["warm"] == lines["real"], lines


def test_warm_verify_refuses_a_launch_it_does_not_know(tmp_path):
    """tests/scripts/warm_verify.py translates the three command lines distify.verify launches; any
    other shape (a launcher changed in distify.verify) stops the command instead of running it
    some other way."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
    try:
        import warm_verify
    finally:
        sys.path.pop(0)
    py = sys.executable
    log = tmp_path / "log"
    torchrun = warm_verify.request_of([py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                       "s.py", "--a"], tmp_path, {}, log, 5)
    assert (torchrun["launcher"], torchrun["nproc"], torchrun["script"], torchrun["args"]) == ("torchrun", 2, "s.py", ["--a"])
    hvd = warm_verify.request_of([py, "-m", "horovod.runner.launch", "--gloo", "-np", "2", "-H", "localhost:2", py,
                                  "s.py"], tmp_path, {}, log, 5)
    assert (hvd["launcher"], hvd["nproc"], hvd["script"], hvd["args"]) == ("horovodrun", 2, "s.py", [])
    assert warm_verify.request_of([py, "s.py", "x"], tmp_path, {}, log, 5)["launcher"] == "python"
    for unknown in ([py, "-m", "torch.distributed.run", "--nnodes", "2", "s.py"], ["mpirun", "-np", "2", py, "s.py"],
                    [py, "-m", "horovod.runner.launch", "-np", "2", py, "s.py"]):
        with pytest.raises(ValueError, match="warm_verify: unknown"):
            warm_verify.request_of(unknown, tmp_path, {}, log, 5)
