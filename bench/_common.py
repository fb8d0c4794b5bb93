"""Helpers shared by the benchmark scripts (standard library only; never imports torch)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
WORKLOADS = os.path.join(BENCH, "workloads")
FIXTURES = os.path.join(ROOT, "fixtures")
PY = sys.executable
# glibc's allocator "controlled" (P4, P5): every allocation below 256 MiB comes from a heap that is
# never trimmed, so whether per-step gradient memory goes back to the kernel no longer depends on
# what happened to be freed earlier in the process (see P5's 4 MiB control run)
CONTROLLED_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}

# launcher variables a parent shell (pytest under srun, a torchrun job...) might leak into our runs
_LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "HOROVOD_", "TORCHELASTIC_", "DISTIFY_")
_LAUNCHER_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                   "MASTER_ADDR", "MASTER_PORT"}


def clean_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCHER_NAMES and not k.startswith(_LAUNCHER_PREFIXES)}
    env["PYTHONUNBUFFERED"] = "1"
    # measure what an installed distify runs: pip compiles its .py files to .pyc at install time,
    # an editable install writes them on the first run. A shell that sets PYTHONDONTWRITEBYTECODE
    # would make every measured run compile distify's modules from source again (tens of ms).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(extra)
    return env


def parse_args(description: str, argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (smoke test)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (used by run_all.py)")
    return p.parse_args(argv)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def spread(xs: Sequence[float]) -> str:
    """'min..max' of a sample, for the tables."""
    return f"{min(xs):.3f}..{max(xs):.3f}"


def wall(cmd: Sequence[str], env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
         ok: Sequence[int] = (0,), timeout: float = 600) -> "tuple[float, subprocess.CompletedProcess]":
    """Wall time of one subprocess (fork/exec to exit) and its completed process."""
    for attempt in range(2):
        t = time.perf_counter()
        proc = subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        dt = time.perf_counter() - t
        # torch 2.13 + gloo: now and then a rank aborts during interpreter teardown, after its work
        # is done ("terminate called without an active exception"); that run's time is unusable
        if proc.returncode in ok or attempt or "terminate called without an active exception" not in proc.stderr:
            break
    if proc.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return dt, proc


def alternate(funcs: Dict[str, Callable[[], float]], repeats: int) -> Dict[str, List[float]]:
    """Run each measurement `repeats` times, interleaved (A B A B ...), so that slow phases of a shared
    machine hit every variant alike."""
    out: Dict[str, List[float]] = {k: [] for k in funcs}
    for i in range(repeats):
        order = list(funcs) if i % 2 == 0 else list(reversed(list(funcs)))
        for k in order:
            out[k].append(funcs[k]())
    return out


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def goal(name: str, value: float, target: float, higher_is_better: bool, unit: str = "") -> dict:
    if target is None:  # reported, no goal
        return {"name": name, "value": value, "target": None, "op": "", "unit": unit, "met": None}
    met = value >= target if higher_is_better else value <= target
    op = ">=" if higher_is_better else "<="
    return {"name": name, "value": value, "target": target, "op": op, "unit": unit, "met": bool(met)}


def goal_line(g: dict) -> str:
    if g["target"] is None:
        return f"{g['name']} = {g['value']:.3f}{g['unit']} (no goal)"
    return (f"{g['name']} = {g['value']:.3f}{g['unit']} (goal {g['op']} {g['target']}{g['unit']}): "
            f"{'MET' if g['met'] else 'MISSED'}")


def finish(key: str, title: str, table: str, goals: List[dict], args: argparse.Namespace,
           extra: str = "", data: Optional[dict] = None) -> None:
    """Print the table and one `RATIO` line per goal; write JSON for run_all.py when asked."""
    print(f"## {key} {title}\n")
    print(table)
    if extra:
        print("\n" + extra)
    print()
    for g in goals:
        print(f"RATIO {key} {goal_line(g)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"key": key, "title": title, "table": table, "extra": extra, "goals": goals,
                       "data": data or {}, "quick": bool(args.quick)}, f, indent=1)


def machine() -> Dict[str, str]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = subprocess.run(
        [PY, "-c", "import torch, libcst._version as v; print(torch.__version__, v.__version__)"],
        capture_output=True, text=True).stdout.split()
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": versions[0] if versions else "?",
        "libcst": versions[1] if len(versions) > 1 else "?",
        "platform": platform.platform(),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "loadavg": load,
    }


def migrate_copy(src: str, dst: str, *flags: str) -> str:
    """distify's ddp output of `src` written to `dst` (through stdin/stdout, as an editor would)."""
    with open(src, "rb") as f:
        proc = subprocess.run([PY, "-m", "distify", "-", *flags], input=f.read(), capture_output=True,
                              env=clean_env())
    if proc.returncode not in (0, 1) or not proc.stdout:
        raise RuntimeError(f"distify failed on {src}: {proc.stderr.decode()[-2000:]}")
    with open(dst, "wb") as f:
        f.write(proc.stdout)
    return dst


def epoch_times(stdout: str) -> List[float]:
    """The `epoch_time E SECONDS ...` lines the bench workloads print."""
    return [float(line.split()[2]) for line in stdout.splitlines() if line.startswith("epoch_time ")]


def torchrun(nproc: int) -> List[str]:
    return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
