"""``distify verify``: prove a migration by running it.

    distify verify train.py [--backend ddp|horovod|fsdp] [--select CODES] [--ignore CODES] [--steps N]
                            [--nproc 2] [--timeout S] [--as-is] [--standalone]
                            [--against-original --batch-arg NAME] [--json]
                            -- SCRIPT_ARGS...

It migrates a copy of the script (the user's file is never touched; ``--as-is`` takes the script
as it is), then runs the copy on CPU with gloo and CUDA hidden, with the user's own arguments and
data: once with plain ``python``, once with ``--nproc`` processes under the backend's launcher
(torchrun for ddp and fsdp, or Horovod's gloo launcher), and with ``--against-original`` the original script with its
batch argument multiplied by ``--nproc``. The probe in ``distify/_probe`` (a sitecustomize on the
children's PYTHONPATH) records what each rank does; after ``--steps`` optimizer steps it lets the
script run on to its end with every data pass cut short, so what comes after training (the final
save, the last prints, evaluation) is judged as well. ``distify.verify_checks`` judges the records:
each check held, failed, was not exercised, or cannot apply to this script. The verdict is OK (exit
0) only when every check that applies was exercised and held; FAILED (1) when one failed; otherwise
NOT PROVEN (3), with what would exercise the rest. 2 is a usage error, 130 an interrupt.

With ``--against-original`` the original draws the training permutation the ranks' DistributedSampler
drew (the probe reseeds its RandomSampler per pass), so the ranks' k-th batches together are its
k-th batch and the weights can be compared on shuffled data. In both runs each sample of a map-style
Dataset is fetched with torch's, Python's and NumPy's global generators seeded by its index, so
augmentation drawn from them is the same for the same sample. Other randomness (dropout, generator
objects or a collate drawing while batches are made, torch.randint batches, draws in a step,
unseeded draws before training) is named with its line and leaves the comparison not exercised: the
probe sees which generators drew (``_probe/_distify_random.py``), the project's facts say where
(``distify.verify_facts``).

The copy is migrated as ``distify`` migrates the project (``distify.project.migrate_project``): the
script and every module of its project that distify rewrites. Where the runs happen. Each run gets
its own sandbox directory that mirrors the outermost of the user's current directory and the
script's project root (the script's directory when neither holds it): every entry there is a link
to the user's entry, except that the folders on the way to the script, to each rewritten module and
to the working directory are real, and the script and the rewritten modules are the migrated copies,
under their own names. The run's working directory is the mirror of the user's current directory,
so relative data paths, ``__file__``-relative paths and the project's imports resolve as in the
user's own run. The checks follow the run into every module of the project: the probe names the
innermost line of user code in the sandbox, and the save sites of every module the runs imported
count. Writes stay in the sandbox: the probe replaces a link by a private copy
(a folder by a real folder of links, a file by a copy) just before something writes through it, so
checkpoints, images and logs of the three runs never overwrite the user's files or each other.
Only what the script writes to absolute paths outside the sandbox (an ``--output-dir /data/runs``)
lands where the script says, as in a real run. The sandboxes and records live in one temporary
directory, removed at the end, on timeout and on Ctrl-C, after every process started is killed
(each run is a new session; its process groups are killed by id).

Under FSDP2 ranks hold different shards of each parameter: the probe gathers every DTensor
parameter whole (``full_tensor()``) before it digests or snapshots it, so "ranks identical after
each step" and ``--against-original`` compare the full weights; and since a sharded parameter is
identical on all ranks by construction, a separate check shows that each optimizer's parameters
are sharded and actually change (an optimizer built before fully_shard steps dead tensors).

Nothing here imports torch: the children do, and weights are compared by a child process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import typer

from distify import flags
from distify.options import FSDP_BACKEND, TORCH_BACKENDS, Options
from distify.verify_checks import (FAILED, HELD, NOT_APPLICABLE, NOT_EXERCISED, Check, Run, Sources, check_metrics,
                                   check_order, check_params, check_prefix, check_prints, check_random, check_run,
                                   check_shards, check_sharded_steps, check_weights, check_writers, reach_of,
                                   training_permutations)
from distify.library import RANDOM_GENERATORS, RANDOM_MODULES, RANDOM_NOT_DRAWS
from distify.verify_facts import project_facts

PROBE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_probe")
EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_NOT_PROVEN, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

# How a launcher tells a process it is one rank of many: a plain run must see none of them.
_LAUNCHER_PREFIXES = ("DISTIFY_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "HOROVOD_", "MPI_LOCAL")
_LAUNCHER_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                   "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"}



class VerifyError(Exception):
    """Bad input: exit 2 with this message."""


# --- the sandbox --------------------------------------------------------------------------------


def sandbox_root(script: Path, cwd: Path, project_root: Optional[Path] = None) -> Path:
    """The folder a sandbox mirrors: the outermost of the current directory and the script's project
    root (its package root, or ``[tool.distify] project-root``) that holds the script; the script's
    folder when neither does. Imports of the project and paths relative to the current directory or
    to ``__file__`` then resolve inside the sandbox as in the user's run."""
    script, cwd = script.resolve(), cwd.resolve()
    holders = [p.resolve() for p in (cwd, project_root) if p is not None and (p.resolve() == script.parent or p.resolve() in script.parents)]
    return min(holders, key=lambda p: len(p.parts)) if holders else script.parent


def build_sandbox(run_dir: Path, script: Path, text: bytes, cwd: Path, project_root: Optional[Path] = None,
                  others: Optional[Dict[Path, bytes]] = None) -> Tuple[Path, Path]:
    """Mirror the user's tree into run_dir (see the module docstring): `text` is the script, and each
    of `others` (real path -> bytes: the project's modules the migration rewrote) is written over its
    place. Every folder on the way to a written file is real, every other entry a link to the user's.
    Returns (the script's path in the sandbox, the working directory for the run)."""
    script, cwd = script.resolve(), cwd.resolve()
    root = sandbox_root(script, cwd, project_root)
    files = {script: text}
    for path, data in (others or {}).items():
        path = Path(path).resolve()
        if root not in path.parents:
            raise VerifyError(f"{path}: a module distify rewrote lies outside {root}, the folder verify mirrors")
        files[path] = data
    real = {root}
    for path in files:
        real.update(p for p in path.parents if root in p.parents)
    if root in cwd.parents:  # the run's working directory: a link there would resolve to the user's folder
        real.update(p for p in (cwd, *cwd.parents) if root in p.parents)
    for folder in sorted(real, key=lambda p: len(p.parts)):
        mirror = run_dir / folder.relative_to(root)
        mirror.mkdir(parents=True, exist_ok=True)
        for entry in sorted(os.listdir(folder)):
            if folder / entry not in real and folder / entry not in files:
                os.symlink(folder / entry, mirror / entry)
    for path, data in files.items():
        (run_dir / path.relative_to(root)).write_bytes(data)
    copy = run_dir / script.relative_to(root)
    workdir = run_dir / cwd.relative_to(root) if cwd == root or root in cwd.parents else copy.parent
    return copy, workdir


# --- processes ----------------------------------------------------------------------------------


def child_env(extra: Dict[str, str]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_NAMES and not k.startswith(_LAUNCHER_PREFIXES)}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PROBE_DIR, os.environ.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def _children_of() -> Dict[int, List[int]]:
    kids: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def kill_tree(pid: int) -> None:
    """Kill the process `pid` (a session leader we started), everything below it and their process
    groups, by id: SIGTERM, then SIGKILL for what is left after 3 s."""
    own = os.getpgrp()

    def targets() -> Tuple[List[int], set]:
        pids, todo = [], [pid]
        kids = _children_of() if os.path.isdir("/proc") else {}
        while todo:
            p = todo.pop()
            pids.append(p)
            todo += kids.get(p, [])
        groups = {pid}
        for p in pids:
            try:
                groups.add(os.getpgid(p))
            except OSError:
                pass
        groups.discard(own)
        return pids, groups

    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids, groups = targets()
        for g in groups:
            try:
                os.killpg(g, sig)
            except OSError:
                pass
        for p in pids:
            try:
                os.kill(p, sig)
            except OSError:
                pass
        if sig == signal.SIGTERM:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and any(_alive(p) for p in pids):
                time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def execute(run: Run, workdir: Path, env: Dict[str, str], timeout: float, log: Path) -> None:
    """Run `run.argv` in its own session; kill everything it started when it ends, times out or
    the user presses Ctrl-C (re-raised)."""
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(run.argv, cwd=str(workdir), env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            run.returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            run.timed_out = True
        finally:
            kill_tree(proc.pid)
            if proc.returncode is None:
                proc.wait()
    run.seconds = time.monotonic() - start
    run.output = log.read_text(errors="replace")


def compare_weights(a: Path, b: Path) -> dict:
    """Max |difference| between two probe snapshots, computed by a child process (no torch here)."""
    code = ("import json, sys, torch\n"
            "a = torch.load(sys.argv[1]); b = torch.load(sys.argv[2])\n"
            "if sorted(a) != sorted(b) or any(len(a[k]) != len(b[k]) for k in a): print(json.dumps({'error': 'different optimizers or parameters'})); sys.exit()\n"
            "d = max([float((x.double() - y.double()).abs().max()) if x.shape == y.shape else float('inf') for k in a for x, y in zip(a[k], b[k])] or [0.0])\n"
            "print(json.dumps({'max_abs_diff': d}))\n")
    env = child_env({})
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code, str(a), str(b)], capture_output=True, text=True, env=env, timeout=300)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (out.stderr or out.stdout).strip()[-500:]}




# --- the command --------------------------------------------------------------------------------


@dataclass
class Plan:
    script: Path
    script_args: List[str]
    backend: str
    steps: int
    nproc: int
    timeout: float
    as_is: bool
    standalone: bool
    against_original: bool
    batch_arg: Optional[str]
    options: Optional[Options] = None  # what the copy is migrated with: flags and [tool.distify], as `distify` would
    project_root: Optional[Path] = None  # set by verify: the script's project (what the sandbox mirrors)
    others: Dict[Path, bytes] = field(default_factory=dict)  # set by verify: the project's other modules, migrated


def scale_batch(args: List[str], name: str, factor: int) -> Tuple[List[str], Optional[str], str]:
    """(args with NAME's value multiplied, the argparse dest to scale in the child if NAME is not in
    args, a note). Accepts NAME as 'batch-size', '--batch-size' or 'batch_size'."""
    bare = name.lstrip("-")
    flags = {"--" + bare, "--" + bare.replace("_", "-"), "--" + bare.replace("-", "_")}
    out = list(args)
    for i, arg in enumerate(out):
        key, eq, value = arg.partition("=")
        if key in flags:
            if eq:
                target, raw = i, value
            elif i + 1 < len(out):
                target, raw = i + 1, out[i + 1]
            else:
                raise VerifyError(f"{key} has no value in the script's arguments")
            try:
                scaled = str(int(raw) * factor)
            except ValueError:
                raise VerifyError(f"{key} {raw!r} is not an integer batch size") from None
            out[target] = f"{key}={scaled}" if eq else scaled
            return out, None, f"{key} {scaled}"
    return out, bare.replace("-", "_"), f"{factor} x the default of --{bare}"


def _horovod_missing() -> Optional[str]:
    probe = subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True, text=True,
                           env=child_env({"PYTHONPATH": os.environ.get("PYTHONPATH", "")}), timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["import failed"])[-1]
        return f"Horovod runs skipped: horovod.torch is not importable ({last}); install Horovod built with PyTorch and gloo to check this backend"
    return None


def verify(plan: Plan) -> dict:
    """Migrate, run, judge. Returns the report (see render); raises VerifyError for bad input and
    KeyboardInterrupt when interrupted (after cleaning up)."""
    if not plan.script.is_file():
        raise VerifyError(f"{plan.script}: no such file")
    source = plan.script.read_bytes()
    checks: List[Check] = []
    findings = []
    options = plan.options or Options(backend=plan.backend, standalone=plan.standalone)
    if plan.as_is:
        from distify.project import Project

        migrated = source
        plan.project_root = Path(Project.around(str(plan.script), options.project_root, tuple(options.exclude)).root)
        checks.append(Check("migrate", "the script to check", HELD, "as it is (--as-is)"))
    else:
        from distify.engine import Status
        from distify.project import migrate_project

        project = migrate_project([str(plan.script)], options)  # the script and the modules of its project it rewrites
        entry = project.files[0]
        if entry.status is Status.ERROR:
            raise VerifyError(f"{plan.script}: {entry.message}")
        if entry.status is Status.FAILED:
            raise RuntimeError(entry.message)
        plan.project_root = Path(project.root)
        migrated = entry.output or entry.source
        rewritten = [f for f in project.files if f.output and f.output != f.source]
        plan.others = {Path(f.path): f.output for f in rewritten if f is not entry}
        findings = [f.format(str(r.path)) for r in project.files for f in r.findings if f.kind == "warning"]
        if entry not in rewritten and not plan.others:
            why = entry.message or "nothing to change"
            checks.append(Check("migrate", "distify migrates a copy", FAILED,
                                f"distify left the script unchanged ({why}); use --as-is to check a script that is "
                                "already distributed" + "".join("\n" + w for w in findings)))
            return _report(plan, checks, [], findings)
        fixes = sum(1 for r in project.files for f in r.findings if f.kind != "warning")
        modules = f" in {len(rewritten)} files" if len(rewritten) > 1 else ""
        checks.append(Check("migrate", "distify migrates a copy", HELD,
                            f"{fixes} change{'s' if fixes != 1 else ''}{modules}, {len(findings)} warning{'s' if len(findings) != 1 else ''}"
                            f"{' (--standalone)' if plan.standalone else ''}; your file{'s are' if modules else ' is'} untouched"))

    text = migrated.decode("utf-8", errors="replace")
    tmp = Path(tempfile.mkdtemp(prefix="distify-verify-")).resolve()
    runs: List[Run] = []
    try:
        runs = _run_all(plan, tmp, migrated)
        plain, multi = runs[0], runs[1]
        original = runs[2] if len(runs) > 2 else None
        rel = str(plan.script.resolve().relative_to(sandbox_root(plan.script, Path.cwd(), plan.project_root)))
        sources = Sources(rel, text, multi.sandbox)  # the project's modules as the runs ran them
        facts = project_facts([(rel, text), *_imported_modules(runs[:2], multi.sandbox)])
        launcher = "torchrun" if plan.backend in TORCH_BACKENDS else "horovodrun --gloo"
        checks.append(check_run("plain", "runs with plain python", plain, plan.steps))
        checks.append(check_run("launch", f"runs under {launcher} with {plan.nproc} processes", multi, plan.steps))
        events = multi.events()
        reach = reach_of(multi)
        checks += [check_params(events, sources), check_shards(events, sources), check_order(events, sources),
                   check_writers(multi, sources, str(tmp / "records"), facts, reach),
                   check_prefix([plain, multi], original, sources, facts, reach), check_prints(events, sources, reach),
                   check_metrics(events, sources, reach)]
        if plan.backend == FSDP_BACKEND:
            checks.append(check_sharded_steps(events, sources))
        random_check = check_random(events, sources)
        if random_check is not None:
            checks.append(random_check)
        if original is not None:
            a, b = multi.records / "params.rank0.pt", original.records / "params.rank0.pt"
            diff = compare_weights(a, b) if a.exists() and b.exists() else {}
            checks.append(check_weights(multi, original, plan.nproc, original.label.split(": ", 1)[-1], diff, sources, facts))
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return _report(plan, checks, runs, findings)


_MODULE_LIMIT, _MODULE_BYTES = 64, 1 << 20


def _imported_modules(runs: Sequence[Run], sandbox: Path) -> List[Tuple[str, str]]:
    """(path relative to the sandbox, source) of each module of the project the runs imported (the
    probe's ``modules`` records), at most 64 of them, each under 1 MiB."""
    paths = sorted({p for run in runs if not run.skipped for evs in run.events().values() for e in evs
                    if e["k"] == "modules" for p in e["paths"]})
    out = []
    for rel in paths[:_MODULE_LIMIT]:
        try:
            if (sandbox / rel).stat().st_size <= _MODULE_BYTES:
                out.append((rel, (sandbox / rel).read_text(errors="replace")))
        except OSError:
            continue
    return out


def _run_all(plan: Plan, tmp: Path, migrated: bytes) -> List[Run]:
    """The plain run, the multi-process run, and with --against-original the original at N x batch,
    in that order (the original draws the shuffle the multi-process run's ranks drew)."""
    py = sys.executable
    n = str(plan.nproc)
    horovod_skip = _horovod_missing() if plan.backend == "horovod" else None
    if plan.backend in TORCH_BACKENDS:
        multi = lambda s, a: [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", n, s, *a]  # noqa: E731
    else:
        multi = lambda s, a: [py, "-m", "horovod.runner.launch", "--gloo", "-np", n, "-H", f"localhost:{n}", py, s, *a]  # noqa: E731
    snapshot = {"DISTIFY_VERIFY_SNAPSHOT": "1"} if plan.against_original else {}
    runs = [_launch(plan, tmp, 0, "plain python", migrated, [py], plan.script_args, horovod_skip, {}),
            _launch(plan, tmp, 1, f"{plan.nproc} processes", migrated, multi, plan.script_args, horovod_skip, snapshot)]
    if plan.against_original:
        args, dest, note = scale_batch(plan.script_args, plan.batch_arg, plan.nproc)
        extra = dict(snapshot, DISTIFY_VERIFY_AFTER="exit",
                     DISTIFY_VERIFY_PERMS=json.dumps(training_permutations(runs[1].events()) if not runs[1].skipped else {}))
        if dest:
            extra["DISTIFY_VERIFY_SCALE"] = f"{dest}:{plan.nproc}"
        run = _launch(plan, tmp, 2, f"original: {note}", plan.script.read_bytes(), [py], args, horovod_skip, extra)
        if dest and run.ok and not any(e["k"] == "scaled" for evs in run.events().values() for e in evs):
            run.returncode, run.output = -1, f"--{dest.replace('_', '-')} is neither in the script's arguments nor an argparse option of the script"
        runs.append(run)
    return runs


def _launch(plan: Plan, tmp: Path, index: int, label: str, text: bytes, argv_of, args: List[str], skip: Optional[str],
            extra: Dict[str, str]) -> Run:
    run_dir = tmp / f"run{index}"
    records = tmp / "records" / str(index)
    records.mkdir(parents=True)
    run_dir.mkdir()
    # the original of --against-original runs the project as the user has it; the migrated runs, as distify rewrote it
    others = plan.others if index < 2 else {}
    copy, workdir = build_sandbox(run_dir, plan.script, text, Path.cwd(), plan.project_root, others)
    argv = argv_of(str(copy), list(args)) if callable(argv_of) else [*argv_of, str(copy), *args]
    run = Run(label, argv, records, run_dir)
    if skip:
        run.skipped = skip
        return run
    child_tmp = tmp / "tmp" / str(index)  # the launchers' and libraries' temporary files go with ours
    child_tmp.mkdir(parents=True)
    env = child_env({"DISTIFY_VERIFY_SCRIPT": str(copy), "DISTIFY_VERIFY_RECORDS": str(records),
                     "DISTIFY_VERIFY_SANDBOX": str(run_dir), "DISTIFY_VERIFY_STEPS": str(plan.steps or 10**12),
                     "TMPDIR": str(child_tmp), "DISTIFY_VERIFY_RANDOM": _RANDOM_SPEC, **extra})
    if plan.backend == FSDP_BACKEND:
        # fully_shard keeps each rank's own slice of its own initial weights (no broadcast): the
        # FSDP script relies on ranks initialising alike, which the probe would otherwise undo
        env["DISTIFY_VERIFY_DIVERGE"] = "0"
    execute(run, workdir, env, plan.timeout, tmp / f"output{index}.log")
    return run


# what draws random numbers, for the probe (distify.library is the one place that says it)
_RANDOM_SPEC = json.dumps({"modules": RANDOM_MODULES, "not_draws": sorted(RANDOM_NOT_DRAWS), "generators": RANDOM_GENERATORS})

OK, FAILED_VERDICT, NOT_PROVEN = "ok", "failed", "not_proven"
EXIT_OF = {OK: EXIT_OK, FAILED_VERDICT: EXIT_FAILED, NOT_PROVEN: EXIT_NOT_PROVEN}
SCHEMA_VERSION = 2


def _report(plan: Plan, checks: List[Check], runs: List[Run], findings: List[str]) -> dict:
    """The report (its JSON form is documented in the README: "The JSON report")."""
    statuses = {c.status for c in checks}
    if FAILED in statuses:
        verdict = FAILED_VERDICT
    elif NOT_EXERCISED in statuses or len(runs) < 2:
        verdict = NOT_PROVEN
    else:
        verdict = OK
    return {"schema": SCHEMA_VERSION, "script": str(plan.script), "backend": plan.backend, "nproc": plan.nproc,
            "steps": plan.steps, "as_is": plan.as_is, "verdict": verdict, "exit_code": EXIT_OF[verdict],
            "checks": [c.as_json() for c in checks], "runs": [r.as_json() for r in runs], "warnings": findings}


_MARK = {HELD: "held", FAILED: "FAILED", NOT_EXERCISED: "not exercised", NOT_APPLICABLE: "n/a"}
_STYLE = {HELD: "green", FAILED: "bold red", NOT_EXERCISED: "yellow", NOT_APPLICABLE: "dim"}
_WIDTH = max(map(len, _MARK.values()))


def _count(checks: List[dict], status: str) -> int:
    return sum(1 for c in checks if c["status"] == status)


def _verdict_line(report: dict) -> str:
    checks = report["checks"]
    if report["verdict"] == FAILED_VERDICT:
        failed = [c["title"] for c in checks if c["status"] == FAILED]
        return f"verdict: FAILED - {len(failed)} check{'s' if len(failed) > 1 else ''} failed: {'; '.join(failed)}"
    if report["verdict"] == NOT_PROVEN:
        open_ = [c for c in checks if c["status"] == NOT_EXERCISED]
        wanted = "; ".join(dict.fromkeys(c["prove"] for c in open_ if c["prove"]))
        return (f"verdict: NOT PROVEN - {len(open_)} check{'s' if len(open_) != 1 else ''} not exercised: "
                f"{'; '.join(c['title'] for c in open_)}" + (f"\n  to prove it: {wanted}" if wanted else ""))
    held, na = _count(checks, HELD), _count(checks, NOT_APPLICABLE)
    return f"verdict: OK - {held} check{'s hold' if held != 1 else ' holds'}, {na} not applicable to this script"


def _where_lines(check: dict) -> List[str]:
    return [f"{w['path']}:{w['line']}: {w['source']}" for w in check["where"]]


def render_text(report: dict) -> str:
    mode = "as it is" if report["as_is"] else f"migrated for {report['backend']}"
    lines = [f"distify verify {report['script']} ({mode}, {report['nproc']} processes, "
             f"{report['steps'] or 'all'} steps)"]
    pad = " " * (_WIDTH + 4)
    for c in report["checks"]:
        detail = c["detail"].splitlines() or [""]
        lines.append(f"  {_MARK[c['status']]:<{_WIDTH}}  {c['title']}: {detail[0]}")
        lines += [f"{pad}{d}" for d in detail[1:]]
        if c["status"] in (FAILED, NOT_EXERCISED):
            lines += [f"{pad}at {w}" for w in _where_lines(c)]
        if c["status"] == NOT_EXERCISED and c["prove"]:
            lines.append(f"{pad}to exercise it: {c['prove']}")
    lines.append(_verdict_line(report))
    return "\n".join(lines) + "\n"


def render_rich(report: dict, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    mode = "as it is" if report["as_is"] else f"migrated for {report['backend']}"
    table = Table(title=f"distify verify {escape(report['script'])} ({mode}, {report['nproc']} processes, "
                        f"{report['steps'] or 'all'} steps)", show_lines=False)
    table.add_column("", no_wrap=True)
    table.add_column("check")
    table.add_column("evidence")
    for c in report["checks"]:
        evidence = escape(c["detail"])
        if c["status"] in (FAILED, NOT_EXERCISED) and c["where"]:
            evidence += "".join(f"\n[dim]at {escape(w)}[/dim]" for w in _where_lines(c))
        if c["status"] == NOT_EXERCISED and c["prove"]:
            evidence += f"\n[yellow]to exercise it: {escape(c['prove'])}[/yellow]"
        table.add_row(f"[{_STYLE[c['status']]}]{_MARK[c['status']]}[/]", escape(c["title"]), evidence)
    console = console or Console()
    console.print(table)
    style = {OK: "bold green", FAILED_VERDICT: "bold red", NOT_PROVEN: "bold yellow"}[report["verdict"]]
    console.print(f"[{style}]{escape(_verdict_line(report))}[/]")


app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]})


@app.command(help="Prove a migration by running it: migrate a copy of SCRIPT, run it with plain python and "
                  "with --nproc processes on CPU, and check what each rank did. Arguments after '--' go to the script.")
def verify_command(
    paths: List[str] = typer.Argument(..., metavar="SCRIPT", hidden=True),
    backend: Optional[str] = flags.backend("ddp"),
    select: Optional[List[str]] = flags.select(),
    ignore: Optional[List[str]] = flags.ignore(),
    steps: int = typer.Option(20, "--steps", metavar="N", min=0, help="Train fully for this many optimizer steps, then run the rest of the script with every data pass cut short (0: train fully to the end)."),
    nproc: int = typer.Option(2, "--nproc", metavar="N", min=2, help="Processes of the multi-process run."),
    timeout: float = typer.Option(600.0, "--timeout", metavar="SECONDS", min=1.0, help="Seconds each run may take before everything it started is killed."),
    as_is: bool = typer.Option(False, "--as-is", help="Check the script as it is (already distributed): no migration."),
    standalone: Optional[bool] = typer.Option(None, "--standalone", help="Migrate with --standalone (runtime helpers written into the script)."),
    against_original: bool = typer.Option(False, "--against-original", help="Also run the original with the batch argument x nproc and compare the weights."),
    batch_arg: Optional[str] = typer.Option(None, "--batch-arg", metavar="NAME", help="The script's batch-size option for --against-original (e.g. --batch-size)."),
    as_json: bool = flags.as_json(),
) -> None:
    from distify import config
    from distify.runner import UsageError, migration_options

    try:  # the copy is migrated as `distify` would migrate the script: same flags, same [tool.distify]
        options = migration_options(config.load(paths[:1]), backend, select, ignore, standalone=standalone)
    except (config.ConfigError, UsageError) as e:
        _usage(str(e))
    if against_original and not batch_arg:
        _usage("--against-original needs --batch-arg NAME (the script's batch-size option)")
    plan = Plan(Path(paths[0]), list(paths[1:]), options.backend, steps, nproc, timeout, as_is, options.standalone,
                against_original, batch_arg, options)
    try:
        report = verify(plan)
    except VerifyError as e:
        _usage(str(e))
    except KeyboardInterrupt:
        sys.stderr.write("distify verify: interrupted; every process it started was killed and its files removed\n")
        raise typer.Exit(EXIT_INTERRUPTED)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    elif sys.stdout.isatty():
        render_rich(report)
    else:
        sys.stdout.write(render_text(report))
    raise typer.Exit(EXIT_OF[report["verdict"]])


def _usage(message: str) -> None:
    sys.stderr.write(f"distify verify: error: {message}\n")
    raise typer.Exit(EXIT_INPUT)


def main(argv: Sequence[str]) -> int:
    """``distify verify ARGV...``; returns the exit status."""
    try:
        code = app(args=list(argv), prog_name="distify verify", standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except SystemExit as e:  # click's usage errors
        return e.code if isinstance(e.code, int) else EXIT_INPUT
    except Exception as e:  # noqa: BLE001 - click's UsageError and friends (typer may carry its own click)
        if callable(getattr(e, "show", None)) and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            return EXIT_INPUT
        sys.stderr.write(f"distify verify: internal error: {type(e).__name__}: {e}\n")
        return 123
    return code if isinstance(code, int) else EXIT_OK
