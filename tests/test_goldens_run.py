"""Every golden runs under plain `python` wherever its original does (issue #14's general test).

A rewrite that crashes (a name used above its import, `.module` on a model that is no longer
wrapped, a device string turned into a torch.device) must not hide behind a golden that is only
compared as text. Each fixture's original `<case>.in.py` and its expected outputs run as
`python SCRIPT` – their own argparse defaults, a fresh folder of their own, CUDA hidden, no launcher
– and every golden must finish wherever its original finishes. An original that cannot run here
(a data set to download, a package that is not installed, a GPU it insists on, longer than the time
limit) is skipped with its own reason, so the skip list says exactly what is not proven.

torch is imported once and each script runs in a forked child (tests/scripts/run_scripts.py):
about 190 fixtures x (original + golden) would otherwise pay torch's import 400 times.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import MODULE_STANDINS, REPO_ROOT, clean_env, sitecustomize_env  # noqa: E402

# About 330 script runs (originals and goldens of both backends): some 10 to 20 minutes on 2 cores,
# more than CI's budget leaves today, so it runs on demand (DISTIFY_E2E_GOLDENS_RUN=1) until it is
# made cheaper (see the closing note of the session that added it).
pytestmark = pytest.mark.e2e
on_demand = pytest.mark.skipif(
    os.environ.get("DISTIFY_E2E_GOLDENS_RUN") != "1",
    reason="runs every golden under plain python (~330 scripts): set DISTIFY_E2E_GOLDENS_RUN=1",
)

FIXTURES = REPO_ROOT / "fixtures"
RUNNER = Path(__file__).resolve().parent / "scripts" / "run_scripts.py"
TIMEOUT = 60  # seconds a script may take; the fixtures train a few tiny epochs
BACKENDS = ("ddp", "horovod", "fsdp")


def _cases(backend: str):
    for src in sorted(FIXTURES.rglob("*.in.py")):
        golden = src.with_name(src.name[: -len(".in.py")] + f".{backend}.py")
        if golden.is_file():
            yield src, golden


def _case_id(src: Path) -> str:
    return str(src.relative_to(FIXTURES))[: -len(".in.py")]


def _run_all(tmp: Path, backend: str) -> dict:
    jobs = []
    for i, (src, golden) in enumerate(_cases(backend)):
        for kind, script in (("original", src), ("golden", golden)):
            folder = tmp / f"{i:03d}-{kind}"
            folder.mkdir()
            copy = folder / script.name
            copy.write_bytes(script.read_bytes())
            jobs.append({"script": str(copy), "cwd": str(folder), "out": str(folder / "output.txt"),
                         "syspath": str(script.parent), "key": f"{_case_id(src)}:{kind}"})
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    env = clean_env({"CUDA_VISIBLE_DEVICES": "", **sitecustomize_env(tmp / "standins", MODULE_STANDINS)})
    argv = [sys.executable, str(RUNNER), str(tmp / "jobs.json"), str(tmp / "results.json"), "--timeout", str(TIMEOUT)]
    if backend == "horovod":
        argv.append("--horovod")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    by_script = json.loads((tmp / "results.json").read_text())
    return {job["key"]: (*by_script[job["script"]], job["out"]) for job in jobs}


_RESULTS: dict = {}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    def get(backend: str) -> dict:
        if backend not in _RESULTS:
            _RESULTS[backend] = _run_all(tmp_path_factory.mktemp(f"goldens-{backend}"), backend)
        return _RESULTS[backend]

    return get


def _params():
    for backend in BACKENDS:
        marks = [on_demand, pytest.mark.horovod] if backend == "horovod" else [on_demand]
        for src, _ in _cases(backend):
            yield pytest.param(backend, _case_id(src), marks=marks, id=f"{backend}-{_case_id(src)}")


@on_demand
def test_there_are_goldens_to_run():
    assert sum(1 for _ in _cases("ddp")) > 100 and sum(1 for _ in _cases("horovod")) > 100


@pytest.mark.parametrize("backend,case", list(_params()))
def test_golden_runs_where_its_original_runs(results, backend, case):
    got = results(backend)
    status, detail, _ = got[f"{case}:original"]
    if status != "ok":
        pytest.skip(f"the original does not run here ({status}: {detail})")
    status, detail, out = got[f"{case}:golden"]
    assert status == "ok", f"{case}.{backend}.py fails under plain python where its original runs: {detail}\n" + (
        Path(out).read_text(errors="replace")[-3000:]
    )


def test_runner_tells_a_crashing_script_from_a_running_one(tmp_path):
    """The control, always on and cheap: the runner reports a script that raises (a name used above
    its import, as a misplaced import would) as an error with its message, a script that loops
    forever as a timeout, and a script that finishes as ok."""
    scripts = {
        "runs.py": "import torch\nprint(torch.ones(2).sum().item())\n",
        "crashes.py": "dist.init_process_group()\nimport torch.distributed as dist\n",
        "hangs.py": "while True:\n    pass\n",
    }
    jobs = []
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)
        jobs.append({"script": str(tmp_path / name), "cwd": str(tmp_path), "out": str(tmp_path / f"{name}.out")})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    subprocess.run([sys.executable, str(RUNNER), str(tmp_path / "jobs.json"), str(tmp_path / "results.json"),
                    "--timeout", "5"], env=clean_env(), check=True, timeout=120)
    got = {Path(k).name: v for k, v in json.loads((tmp_path / "results.json").read_text()).items()}
    assert got["runs.py"] == ["ok", ""]
    assert got["crashes.py"][0] == "error" and "NameError: name 'dist' is not defined" in got["crashes.py"][1]
    assert got["hangs.py"][0] == "timeout"
