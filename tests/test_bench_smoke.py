"""Smoke test of the benchmarks: each bench script runs in --quick mode and prints its RATIO line(s).

Not a timing assertion: the numbers of a --quick run mean nothing. The scripts run concurrently
(each is one mostly sequential process tree) to keep the test near a minute on two cores.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["p1_throughput.py", "p2_startup.py", "p3_comm.py", "p4_overhead.py", "p5_scaling.py", "p6_cache.py",
           "p7_engine.py"]

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith(("SLURM_", "OMPI_", "HOROVOD_", "TORCHELASTIC_", "DISTIFY_"))}
    env["OMP_NUM_THREADS"] = "1"
    out = tmp_path_factory.mktemp("bench")
    procs = {
        s: subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "bench", s), "--quick", "--json", str(out / (s + ".json"))],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for s in SCRIPTS
    }
    results = {}
    for s, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        results[s] = (p.returncode, stdout, stderr, out / (s + ".json"))
    return results


@pytest.mark.e2e  # the benchmarks launch training processes (2-process runs among them): the full matrix
@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_runs_and_prints_ratio(runs, script):
    rc, stdout, stderr, json_path = runs[script]
    assert rc == 0, f"{script} exited {rc}\n{stdout[-2000:]}\n{stderr[-3000:]}"
    key = script[:2].upper()
    ratio_lines = [ln for ln in stdout.splitlines() if ln.startswith(f"RATIO {key} ")]
    assert ratio_lines, f"{script} printed no RATIO line:\n{stdout[-2000:]}"
    assert all(" = " in ln for ln in ratio_lines)
    assert json_path.exists()


def test_results_writer_keeps_readings(tmp_path):
    """run_all.py carries the written readings over when it rewrites RESULTS.md."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import run_all
    finally:
        sys.path.pop(0)
    p = tmp_path / "R.md"
    p.write_text("x\n<!-- keep:P1 -->\nmy reading\n<!-- /keep:P1 -->\n", encoding="utf-8")
    blocks = run_all.kept(str(p))
    assert blocks == {"P1": "my reading\n"}
    assert run_all.keep_block("P1", blocks, "dflt\n") == "<!-- keep:P1 -->\nmy reading\n<!-- /keep:P1 -->"
