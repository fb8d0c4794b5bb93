"""Helpers for the end-to-end tests that launch real training processes.

Everything here runs scripts in subprocesses with the current interpreter; nothing imports the
scripts under test. Outputs always go to directories the caller passes in (pytest's tmp_path).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = REPO_ROOT / "fixtures" / "scenarios"

# Variables through which a launcher (torchrun, SLURM, MPI, Horovod, Kubeflow) tells a process that it
# is one rank of many. A "plain python" run must see none of them.
_LAUNCHER_PREFIXES = (
    "DISTIFY_",
    "MPI_LOCAL",
    "TORCHELASTIC_",
    "SLURM_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MV2_",
    "HOROVOD_",
)
_LAUNCHER_NAMES = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
}

DEFAULT_TIMEOUT = 180


@dataclass(frozen=True)
class RunResult:
    argv: tuple
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout and stderr together (epoch logs may go to either: print vs logging)."""
        return self.stdout + "\n" + self.stderr

    def describe(self) -> str:
        return (
            f"command: {' '.join(map(str, self.argv))}\nexit code: {self.returncode}\n"
            f"--- stdout ---\n{self.stdout[-6000:]}\n--- stderr ---\n{self.stderr[-6000:]}"
        )


class RunFailed(AssertionError):
    pass


def free_port() -> int:
    """A TCP port that was free a moment ago (for an explicit MASTER_PORT / rendezvous endpoint)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(extra: Optional[Mapping[str, str]] = None) -> dict:
    """The current environment without any launcher variables, single-threaded, unbuffered."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _LAUNCHER_NAMES and not key.startswith(_LAUNCHER_PREFIXES)
        or key == "DISTIFY_CACHE_DIR"  # the CLI's cache (the test's own, from conftest), not a launcher's
    }
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONHASHSEED"] = "0"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if extra:
        env.update(extra)
    return env


def _run(argv: Sequence, cwd, env, timeout: float, check: bool) -> RunResult:
    argv = tuple(str(a) for a in argv)
    try:
        proc = subprocess.run(
            argv, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise RunFailed(
            f"timed out after {timeout}s\n" + RunResult(argv, -1, out, err).describe()
        ) from None
    result = RunResult(argv, proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise RunFailed("process failed\n" + result.describe())
    return result


# --- launches --------------------------------------------------------------------------------
# By default the ranks of a launch are forked from one warm process that imported torch once
# (tests/scripts/warm_ranks.py): each rank gets the environment its launcher would give it, runs the
# script as __main__ and exits as a fresh interpreter would, but without paying torch's import (about
# 2 s of CPU a process, three processes a torchrun launch). DISTIFY_E2E_LAUNCH=real launches every
# run through torchrun / horovodrun / python instead; a test of the launcher itself, or of what
# happens at interpreter exit, passes real=True.
LAUNCH_MODE = os.environ.get("DISTIFY_E2E_LAUNCH", "warm")
WARM_RANKS = Path(__file__).resolve().parent / "scripts" / "warm_ranks.py"


class _WarmLauncher:
    """The one warm process of this test session, started at its first use."""

    def __init__(self):
        self._proc = None

    def _server(self):
        if self._proc is None or self._proc.poll() is not None:
            import atexit

            self._proc = subprocess.Popen(
                [sys.executable, str(WARM_RANKS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, env=clean_env(), cwd=str(WARM_RANKS.parent), text=True,
            )
            atexit.register(self._proc.kill)
        return self._proc

    def run(self, launcher: str, script: Path, args, nproc: int, env, cwd, timeout: float, check: bool) -> RunResult:
        import json
        import tempfile

        argv = (f"warm:{launcher}", "-np", str(nproc), str(script), *(str(a) for a in args))
        with tempfile.TemporaryDirectory(prefix="distify-warm-") as folder:
            out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
            request = {"launcher": launcher, "script": str(script), "args": [str(a) for a in args],
                       "nproc": nproc, "env": clean_env(env), "cwd": str(cwd), "timeout": timeout,
                       "stdout": out, "stderr": err}
            server = self._server()
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            line = server.stdout.readline()
            if not line:
                self._proc = None
                raise RunFailed(f"the warm launcher died running {script}")
            answer = json.loads(line)
            read = lambda path: open(path, encoding="utf-8", errors="replace").read() if os.path.exists(path) else ""
            stdout, stderr = read(out), read(err)
        if answer["detail"]:
            stderr += f"\n{launcher} (warm): {answer['detail']}\n"
        result = RunResult(argv, answer["returncode"], stdout, stderr)
        if answer.get("timeout"):
            raise RunFailed(f"timed out after {timeout}s\n" + result.describe())
        if check and result.returncode != 0:
            raise RunFailed(f"{launcher} failed\n" + result.describe())
        return result


_WARM = _WarmLauncher()


def _warm(real: bool) -> bool:
    return not real and LAUNCH_MODE != "real"


def run_python(
    script,
    args: Iterable = (),
    env: Optional[Mapping[str, str]] = None,
    cwd=None,
    timeout: float = DEFAULT_TIMEOUT,
    check: bool = True,
    real: bool = False,
) -> RunResult:
    """`python script args...` as one process with no launcher variables in its environment."""
    script = Path(script)
    if _warm(real):
        return _WARM.run("python", script, args, 1, env, cwd or script.parent, timeout, check)
    return _run(
        [sys.executable, script, *args],
        cwd=cwd or script.parent,
        env=clean_env(env),
        timeout=timeout,
        check=check,
    )


def run_torchrun(
    script,
    args: Iterable = (),
    nproc: int = 2,
    env: Optional[Mapping[str, str]] = None,
    cwd=None,
    timeout: float = DEFAULT_TIMEOUT,
    check: bool = True,
    real: bool = False,
) -> RunResult:
    """`torchrun --standalone --nproc-per-node N script args...` (CPU, gloo).

    --standalone picks a free rendezvous port itself; GLOO_SOCKET_IFNAME is not needed on a
    machine whose hostname resolves locally, but callers may pass it in env.
    """
    script = Path(script)
    if _warm(real):
        return _WARM.run("torchrun", script, args, nproc, env, cwd or script.parent, timeout, check)
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        script,
        *args,
    ]
    result = _run(argv, cwd=cwd or script.parent, env=clean_env(env), timeout=timeout, check=False)
    if check:
        checked(result, "torchrun", script.name)
    return result


def run_horovodrun(
    script,
    args: Iterable = (),
    nproc: int = 2,
    env: Optional[Mapping[str, str]] = None,
    cwd=None,
    timeout: float = 240,
    check: bool = True,
    real: bool = False,
) -> RunResult:
    """`horovodrun --gloo -np N -H localhost:N python script args...` (through `python -m
    horovod.runner.launch`, so no `horovodrun` on PATH is needed)."""
    script = Path(script)
    if _warm(real):
        return _WARM.run("horovodrun", script, args, nproc, env, cwd or script.parent, timeout, check)
    argv = [
        sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", str(nproc), "-H", f"localhost:{nproc}",
        sys.executable, script, *args,
    ]
    return _run(argv, cwd=cwd or script.parent, env=clean_env(env), timeout=timeout, check=check)


# torch 2.13 + gloo on CPU used to abort a rank at interpreter exit now and then, after
# destroy_process_group() returned and all its work was done, with "terminate called without an
# active exception" (torchrun then reports exit code -6). The runtime's cleanup fixed it; a launch
# that ends so is a regression of that fix, and fails like any other failed launch (it used to be
# relaunched, which would have hidden the regression). Warm launches never run C++ teardown, so only
# real launches can show it.
GLOO_EXIT_ABORT = "terminate called without an active exception"


def is_gloo_exit_abort(result: RunResult) -> bool:
    """True when a launch failed only because a rank aborted at exit (see GLOO_EXIT_ABORT)."""
    import re

    if result.returncode == 0 or GLOO_EXIT_ABORT not in result.stderr:
        return False
    codes = set(re.findall(r"failed \(exitcode: (-?\d+)\)", result.stderr))
    workers_part = result.stderr.split("failed (exitcode:")[0]
    return codes == {"-6"} and "Traceback (most recent call last)" not in workers_part


def checked(result: RunResult, launcher: str, name: str) -> RunResult:
    """``result``, or RunFailed when the launch did not exit 0 (saying so when a rank aborted at
    exit: the runtime's exit fix regressed)."""
    if result.returncode != 0:
        why = (" (a rank aborted at interpreter exit: the runtime's clean-up regressed)"
               if is_gloo_exit_abort(result) else "")
        raise RunFailed(f"{launcher} failed{why}\n" + result.describe())
    return result


# The fixture cases this process migrated, as (case, backend): the case is the input's path under
# fixtures/ without ".in.py" ("DST207/patience"). An end-to-end test declares what it executes with
# `@pytest.mark.runs(case, backend, ...)` (or `executed(...)` on a parameter); tests/conftest.py fails
# a passing test that did not migrate a case it declares, and tests/test_executed_matrix.py reads the
# declarations to check that every golden of the shapes it lists is executed under its backend.
MIGRATED: list = []
FIXTURES = REPO_ROOT / "fixtures"


def case_of(src) -> Optional[str]:
    """``DST207/patience`` for fixtures/DST207/patience.in.py; None for a file outside fixtures/."""
    src = Path(src).resolve()
    if src.name.endswith(".in.py") and FIXTURES in src.parents:
        return str(src.relative_to(FIXTURES))[: -len(".in.py")]
    return None


def executed(case: str, backend: str, *values, id: Optional[str] = None):
    """A pytest parameter (``values``) of a test that migrates fixtures/<case>.in.py for ``backend``
    and launches it: marked ``runs(case, backend)``, and ``horovod`` under Horovod."""
    import pytest

    marks = [pytest.mark.runs(case, backend)] + ([pytest.mark.horovod] if backend == "horovod" else [])
    return pytest.param(*values, marks=marks, id=id)


def migrate(src, dst, backend: str = "ddp", extra_args: Iterable = (), timeout: float = 120) -> RunResult:
    """Copy src to dst and rewrite dst in place with the real CLI (`python -m distify`).

    Exit code 0 (nothing to change) and 1 (changed) are success; anything else fails with the
    CLI's stderr in the message.
    """
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    argv = [sys.executable, "-m", "distify", dst, "--backend", backend, *extra_args]
    result = _run(argv, cwd=dst.parent, env=clean_env(), timeout=timeout, check=False)
    if result.returncode not in (0, 1):
        raise RunFailed(f"distify failed on {src.name}\n" + result.describe())
    if case_of(src):
        MIGRATED.append((case_of(src), backend))
    return result


def original_weights(tmp_path_factory, folder, train_args):
    """``get(name, batch)``: the final weights of ``folder/<name>.in.py`` run unmigrated with plain
    python at that batch size (``train_args(name, batch)`` builds its arguments; it must make the
    script save ``final.pt``). Each (name, batch) runs once per caller, in its own folder."""
    cache = {}

    def get(name, batch):
        if (name, batch) not in cache:
            workdir = tmp_path_factory.mktemp(f"{name}-orig-b{batch}")
            run_python(Path(folder) / f"{name}.in.py", train_args(name, batch), cwd=workdir)
            cache[name, batch] = load_state(workdir / "final.pt")
        return cache[name, batch]

    return get


def load_state(path) -> dict:
    """A state_dict saved with torch.save, loaded on CPU with plain torch.load."""
    import torch

    state = torch.load(str(path), map_location="cpu")
    if not isinstance(state, Mapping):
        raise AssertionError(f"{path} holds a {type(state).__name__}, not a state_dict")
    return state


def assert_same_weights(a: Mapping, b: Mapping, atol: float = 1e-5, label: str = "") -> float:
    """Same keys, same shapes, max |a - b| < atol. Returns the max abs difference."""
    import torch

    prefix = f"{label}: " if label else ""
    keys_a, keys_b = set(a), set(b)
    if keys_a != keys_b:
        raise AssertionError(
            f"{prefix}state_dict keys differ\n  only in first: {sorted(keys_a - keys_b)}\n"
            f"  only in second: {sorted(keys_b - keys_a)}"
        )
    worst_key, worst = None, 0.0
    for key in sorted(keys_a):
        ta, tb = a[key], b[key]
        if not (isinstance(ta, torch.Tensor) and isinstance(tb, torch.Tensor)):
            if ta != tb:
                raise AssertionError(f"{prefix}non-tensor entry {key!r} differs: {ta!r} != {tb!r}")
            continue
        if ta.shape != tb.shape:
            raise AssertionError(
                f"{prefix}{key!r} has shape {tuple(ta.shape)} vs {tuple(tb.shape)}"
            )
        if ta.numel() == 0:
            continue
        diff = (ta.detach().double() - tb.detach().double()).abs().max().item()
        if diff != diff:  # NaN
            raise AssertionError(f"{prefix}{key!r} contains NaN")
        if diff > worst:
            worst_key, worst = key, diff
    if worst >= atol:
        raise AssertionError(
            f"{prefix}weights differ: max |diff| = {worst:.3e} at {worst_key!r} (atol {atol:.0e})"
        )
    return worst


def epoch_lines(output: str) -> list:
    """Lines (split on \\n and tqdm's \\r) that start with 'epoch <number>'."""
    import re

    return [
        line
        for line in re.split(r"[\r\n]+", output)
        if re.match(r"epoch \d+\b", line)
    ]


# --- test-only sitecustomize files ----------------------------------------------------------------

# Shared head of every test-only sitecustomize below. A spy body calls _after_torch_import(patch) to
# have patch(torch) run once, right after the first `import torch` has executed torch/__init__.py
# (so torch.save, torch.optim, ... exist) and before the importing script sees the module.
_AFTER_TORCH_IMPORT = '''\
"""Test-only sitecustomize written by tests/e2e_support.py (sitecustomize_env)."""
import sys

from distify._probe._distify_import_hook import after_import


def _after_torch_import(patch):
    after_import("torch", patch)
'''


def sitecustomize_env(spy_dir, body: str, extra_env: Optional[Mapping[str, str]] = None) -> dict:
    """Write spy_dir/sitecustomize.py (the _after_torch_import scaffold, then `body`) and return the
    environment additions that make every Python process load it: PYTHONPATH with spy_dir first
    (an inherited PYTHONPATH is kept after it), plus extra_env.

    `body` is module-level code; it typically checks its own environment variable and then calls
    `_after_torch_import(_patch)` with a `def _patch(torch): ...`.
    """
    spy_dir = Path(spy_dir)
    spy_dir.mkdir(parents=True, exist_ok=True)
    (spy_dir / "sitecustomize.py").write_text(_AFTER_TORCH_IMPORT + "\n\n" + body)
    pythonpath = os.pathsep.join(p for p in (str(spy_dir), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": pythonpath, **{key: str(value) for key, value in (extra_env or {}).items()}}


# --- recording which process writes what --------------------------------------------------------

# Records, per process, into $DISTIFY_E2E_FS_LOG: torch.save targets ("save"), os.mkdir calls
# ("mkdir"; with DISTIFY_E2E_SLOW_MKDIR=<seconds> each new folder takes that long to appear) and
# every file opened for writing ("write": open(path, "w"/"a"/"x"/"+"), which is also
# how torch.save, torchvision's save_image, matplotlib's savefig, json.dump and csv writers reach a
# file). The rank is the launcher's (RANK for torchrun, HOROVOD_RANK for horovodrun; "-" for none).
_FS_SPY = '''\
import os
import sys
import threading

_LOG = os.environ.get("DISTIFY_E2E_FS_LOG")
_busy = threading.local()


def _record(kind, path):
    if getattr(_busy, "on", False):
        return
    try:
        path = os.path.realpath(os.fsdecode(os.fspath(path)))
    except (TypeError, ValueError):
        return
    if path == os.path.realpath(_LOG):
        return
    rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "-"
    line = "%s\\t%d\\t%s\\t%s\\n" % (kind, os.getpid(), rank, path)
    _busy.on = True
    try:
        with open(_LOG, "a") as fh:
            fh.write(line)
    finally:
        _busy.on = False


if _LOG:
    _SLOW_MKDIR = float(os.environ.get("DISTIFY_E2E_SLOW_MKDIR") or 0)

    def _audit(event, args):
        if event == "os.mkdir" and args and args[-1] in (-1, None):
            _record("mkdir", args[0])
            if _SLOW_MKDIR and not os.path.isdir(args[0]):
                import time

                time.sleep(_SLOW_MKDIR)  # a slow filesystem: whoever waits for the folder must wait
        elif event == "open" and len(args) >= 2 and isinstance(args[1], str) and set(args[1]) & set("wax+"):
            if isinstance(args[0], (str, bytes, os.PathLike)):
                _record("write", args[0])

    sys.addaudithook(_audit)

    def _patch(torch):
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(f, (str, bytes, os.PathLike)):
                _record("save", f)
            return real_save(obj, f, *args, **kwargs)

        save.__wrapped__ = real_save
        torch.save = save

    _after_torch_import(_patch)
'''

# Records every parameter passed to a torch.optim.Optimizer (deduplicated: hvd.DistributedOptimizer
# re-runs __init__ on the same params) and saves them at exit as <dir>/rank<RANK or HOROVOD_RANK>.pt.
# only rank 0 sees the checkpoint named by DISTIFY_E2E_RANK0_ONLY (os.path.isfile answers False for
# it on every other rank: several nodes, no shared disk)
RANK0_ONLY_SPY = '''
import os

_ONLY = os.environ.get("DISTIFY_E2E_RANK0_ONLY")
if _ONLY and (os.environ.get("HOROVOD_RANK") or os.environ.get("RANK") or "0") != "0":
    import os.path as _osp

    _isfile = _osp.isfile

    def _hidden(path):
        return False if os.path.abspath(path) == os.path.abspath(_ONLY) else _isfile(path)

    _osp.isfile = _hidden
'''

PARAM_SPY = '''\
import os

_DIR = os.environ.get("DISTIFY_E2E_PARAM_DIR")

if _DIR:
    import atexit

    def _patch(torch):
        optimizer_cls = torch.optim.Optimizer
        real_init = optimizer_cls.__init__
        params, seen = [], set()

        def __init__(self, *args, **kwargs):
            real_init(self, *args, **kwargs)
            for group in self.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)

        optimizer_cls.__init__ = __init__

        def dump():
            rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "single"
            tensors = [p.detach().cpu().clone() for p in params]
            torch.save(tensors, os.path.join(_DIR, "rank%s.pt" % rank))

        atexit.register(dump)

    _after_torch_import(_patch)
'''


def spied_parameters(script, tmp_path, launch, launcher: str) -> list:
    """Launch `script` on two ranks with `launch` (run_torchrun / run_horovodrun) under PARAM_SPY
    and return each rank's parameters at exit (every tensor an optimizer of the run steps)."""
    import torch

    dumps = Path(tmp_path) / "dumps"
    dumps.mkdir()
    env = sitecustomize_env(Path(tmp_path) / "spy", PARAM_SPY, {"DISTIFY_E2E_PARAM_DIR": str(dumps)})
    run = Path(tmp_path) / "run"
    run.mkdir()
    checked(launch(script, [], nproc=2, env=env, cwd=run, check=False), launcher, Path(script).name)
    return [torch.load(dumps / f"rank{r}.pt") for r in (0, 1)]


def launcher(backend: str):
    """The launch of a backend's migration: horovodrun for Horovod, torchrun for DDP and FSDP."""
    return run_horovodrun if backend == "horovod" else run_torchrun


def rank_parameters(script, args, workdir, backend: str, spy: str = "", env: Optional[Mapping[str, str]] = None,
                    **launch):
    """Launch `script args` on two ranks with the backend's launcher in `workdir`, with the spy that
    records each rank's parameters at exit (FSDP: the full tensors each rank gathers from the shards,
    FSDP_SPY; otherwise each rank's own, PARAM_SPY) followed by `spy` (more sitecustomize code) and
    the variables `env`. (the launch's result, [rank 0's parameters, rank 1's])."""
    import torch

    workdir = Path(workdir)
    dumps = workdir / "dumps"
    dumps.mkdir(parents=True)
    fsdp = backend == "fsdp"
    body = (FSDP_SPY if fsdp else PARAM_SPY) + "\n" + spy
    env = sitecustomize_env(workdir / "spy", body, {**(env or {}),
                            ("DISTIFY_E2E_FSDP_DIR" if fsdp else "DISTIFY_E2E_PARAM_DIR"): str(dumps)})
    result = launcher(backend)(script, args, nproc=2, env=env, cwd=workdir, **launch)
    ranks = [torch.load(dumps / f"rank{r}.pt") for r in (0, 1)]
    return result, [r["params"] for r in ranks] if fsdp else ranks


def same_on_every_rank(ranks) -> bool:
    """Both ranks dumped the same non-empty list of bit-identical tensors."""
    import torch

    return len(ranks[0]) == len(ranks[1]) > 0 and all(torch.equal(a, b) for a, b in zip(*ranks))


# FSDP: like PARAM_SPY, but the parameters are DTensor shards, so each rank gathers the FULL
# tensors (p.full_tensor(), a collective) and also counts what it holds locally: parameters
# (p.to_local()) and the optimizers' state tensors. The dump happens where every rank still has the
# process group: just before dist.destroy_process_group() (distify's runtime calls it at exit), or
# at exit in a run without a group (the original script). <dir>/rank<RANK or single>.pt holds
# {"params": [full tensors, optimizer order], "counts": {...}}.
FSDP_SPY = '''\
import os

_FSDP_DIR = os.environ.get("DISTIFY_E2E_FSDP_DIR")

if _FSDP_DIR:
    import atexit

    def _patch_fsdp(torch):
        import torch.distributed as dist

        optimizer_cls = torch.optim.Optimizer
        real_init = optimizer_cls.__init__
        params, seen, optimizers, done = [], set(), [], []

        def __init__(self, *args, **kwargs):
            real_init(self, *args, **kwargs)
            optimizers.append(self)
            for group in self.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)

        optimizer_cls.__init__ = __init__

        def local(t):
            return t.to_local() if hasattr(t, "to_local") else t

        def dump():
            if done or not params:  # (the launcher's own process imports torch too)
                return
            done.append(True)
            full = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone() for p in params]
            state = [t for o in optimizers for s in o.state.values() for t in s.values()
                     if torch.is_tensor(t) and t.dim() > 0]
            counts = {
                "params_local": sum(local(p).numel() for p in params),
                "params_full": sum(p.numel() for p in params),
                "params_sharded": sum(1 for p in params if hasattr(p, "to_local")),
                "params": len(params),
                "optim_local": sum(local(t).numel() for t in state),
                "optim_full": sum(t.numel() for t in state),
            }
            rank = os.environ.get("RANK") or "single"
            torch.save({"params": full, "counts": counts}, os.path.join(_FSDP_DIR, "rank%s.pt" % rank))

        real_init_group, real_destroy = dist.init_process_group, dist.destroy_process_group

        def init_process_group(*args, **kwargs):
            out = real_init_group(*args, **kwargs)
            atexit.register(dump)  # runs before the exit handlers registered earlier (the runtime's cleanup)
            return out

        def destroy_process_group(*args, **kwargs):
            if dist.is_initialized():
                dump()
            return real_destroy(*args, **kwargs)

        dist.init_process_group = init_process_group
        dist.destroy_process_group = destroy_process_group
        atexit.register(dump)

    _after_torch_import(_patch_fsdp)
'''


# Stand-ins for torchvision and matplotlib where they are not installed (the test machine has
# neither). A script imports them as users do (`from torchvision.utils import save_image`,
# `import matplotlib.pyplot as plt`); save_image and savefig write a small file through open(),
# everything else of the stand-in accepts any call and does nothing. Installed packages are used
# as they are.
MODULE_STANDINS = '''\
import importlib.util as _ilu
import sys as _sys
import types as _types


def _anything(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return lambda *a, **k: None


def _standin(name, attrs):
    mod = _types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__getattr__ = _anything
    mod.__path__ = []
    _sys.modules[name] = mod
    return mod


def _write(fp, data):
    if hasattr(fp, "write"):
        fp.write(data)
    else:
        with open(fp, "wb") as fh:
            fh.write(data)


if _ilu.find_spec("torchvision") is None:
    def save_image(tensor, fp, *args, **kwargs):
        _write(fp, b"\\x89PNG stand-in: " + repr(tuple(tensor.shape)).encode())

    def make_grid(tensor, *args, **kwargs):
        return tensor

    _tv = _standin("torchvision", {})
    _tv.utils = _standin("torchvision.utils", {"save_image": save_image, "make_grid": make_grid})

if _ilu.find_spec("matplotlib") is None:
    def savefig(fname, *args, **kwargs):
        _write(fname, b"%PDF stand-in")

    class _Figure:
        def savefig(self, fname, *args, **kwargs):
            savefig(fname)

        def __getattr__(self, attr):
            return _anything(attr)

    def subplots(*args, **kwargs):
        return _Figure(), _Figure()

    _mpl = _standin("matplotlib", {"use": lambda *a, **k: None})
    _mpl.pyplot = _standin(
        "matplotlib.pyplot", {"savefig": savefig, "figure": lambda *a, **k: _Figure(), "subplots": subplots}
    )
'''


def fs_spy_env(spy_dir, log_path) -> dict:
    """Environment additions that make every Python process record its torch.save / mkdir calls
    into log_path (one line per call: kind, pid, RANK, absolute path)."""
    return sitecustomize_env(spy_dir, _FS_SPY, {"DISTIFY_E2E_FS_LOG": str(log_path)})


@dataclass(frozen=True)
class FsEvent:
    kind: str
    pid: int
    rank: str
    path: str


def read_fs_log(log_path, under=None) -> list:
    """Events from a spy log, optionally only those for paths under `under`."""
    log_path = Path(log_path)
    if not log_path.exists():
        return []
    root = os.path.realpath(str(under)) if under is not None else None
    events = []
    for line in log_path.read_text().splitlines():
        kind, pid, rank, path = line.split("\t", 3)
        if root is not None and not (path == root or path.startswith(root + os.sep)):
            continue
        events.append(FsEvent(kind, int(pid), rank, path))
    return events


# --- deprecation warnings, and whose code provoked them -----------------------------------------

# Records every DeprecationWarning and FutureWarning of the process, with the call stack that raised
# it, as one JSON line in $DISTIFY_E2E_WARN_DIR/<pid>.jsonl. Those two categories are recorded instead
# of printed; every other warning is printed as usual.
DEPRECATION_SPY = '''\
import os as _os

_WARN_DIR = _os.environ.get("DISTIFY_E2E_WARN_DIR")

if _WARN_DIR:
    import json as _json
    import sys as _sys
    import warnings as _warnings

    _shown = _warnings.showwarning

    def _record_deprecation(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, (DeprecationWarning, FutureWarning)):
            return _shown(message, category, filename, lineno, file, line)
        stack, frame = [], _sys._getframe(1)
        while frame is not None:
            stack.append((frame.f_code.co_filename, frame.f_lineno))
            frame = frame.f_back
        entry = {"category": category.__name__, "message": str(message), "filename": filename,
                 "lineno": lineno, "stack": stack}
        with open(_os.path.join(_WARN_DIR, "%d.jsonl" % _os.getpid()), "a") as fh:
            fh.write(_json.dumps(entry) + "\\n")

    _warnings.showwarning = _record_deprecation
    _warnings.simplefilter("always", DeprecationWarning)
    _warnings.simplefilter("always", FutureWarning)
'''


def deprecation_spy_env(spy_dir, warn_dir) -> dict:
    """Environment additions that make every Python process record its deprecation warnings into
    warn_dir (see DEPRECATION_SPY); read them with :func:`deprecations_by_author`."""
    Path(warn_dir).mkdir(parents=True, exist_ok=True)
    return sitecustomize_env(spy_dir, DEPRECATION_SPY, {"DISTIFY_E2E_WARN_DIR": str(warn_dir)})


def _written_lines(original: str, migrated: str) -> set:
    """1-based numbers of the lines of `migrated` that distify wrote (not in `original`)."""
    import difflib

    a, b = original.splitlines(), migrated.splitlines()
    written = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            written.update(range(j1 + 1, j2 + 1))
    return written


def deprecations_by_author(warn_dir, original, migrated) -> dict:
    """The recorded deprecation warnings, sorted by who provoked them: ``{"distify": [...], "user":
    [...], "other": [...]}``, each entry ``"Category: message (file:line)"``.

    The author is read off the first frame of the warning's call stack, innermost first, that is
    neither torch nor the machinery between a call and the warning (warnings, typing_extensions,
    importlib, the spy itself): distify when that frame is in the ``distify`` package (the
    runtime) or on a line of the migrated script that distify wrote (compared with `original`), the
    user on any other line of the script, "other" elsewhere (a launcher, Horovod's own code).
    """
    import importlib.util
    import json

    torch_dir = os.path.dirname(importlib.util.find_spec("torch").origin) + os.sep
    distify_dirs = tuple(
        os.path.dirname(importlib.util.find_spec(name).origin) + os.sep
        for name in ("distify", "distify.runtime", "distify.rules")
    )
    migrated = os.path.realpath(str(migrated))
    written = _written_lines(Path(original).read_text(), Path(migrated).read_text())

    def machinery(path: str) -> bool:
        name = os.path.basename(path)
        return (path.startswith(torch_dir) or path.startswith("<frozen ") or name == "sitecustomize.py"
                or name in ("warnings.py", "typing_extensions.py") or "/importlib/" in path)

    found: dict = {"distify": [], "user": [], "other": []}
    for log in sorted(Path(warn_dir).glob("*.jsonl")):
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            author, where = "other", f"{entry['filename']}:{entry['lineno']}"
            for path, lineno in entry["stack"]:
                if machinery(path):
                    continue
                real = os.path.realpath(path)
                if real == migrated:
                    author = "distify" if lineno in written else "user"
                elif real.startswith(distify_dirs):
                    author = "distify"
                where = f"{path}:{lineno}"
                break
            found[author].append(f"{entry['category']}: {entry['message']} ({where})")
    return found


# Loader spy: numbers DataLoaders by construction, logs each pass's indices as JSON lines to
# <dir>/loaders-rank<R>.jsonl; optimizer spy: dumps stepped parameters to <dir>/params-rank<R>.pt.
LOADER_SPY = '''\
import os

_DIR = os.environ.get("DISTIFY_E2E_DATA_DIR")

if _DIR:
    import atexit
    import json

    def _rank():
        return os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "single"

    def _patch(torch):
        from torch.utils.data import dataloader as dl

        counter = [0]
        real_init = dl.DataLoader.__init__

        def __init__(self, *args, **kwargs):
            real_init(self, *args, **kwargs)
            self.__dict__["_spy_id"] = counter[0]
            self.__dict__["_spy_passes"] = 0
            counter[0] += 1

        dl.DataLoader.__init__ = __init__
        records = []
        real_iter_init = dl._BaseDataLoaderIter.__init__

        def iter_init(self, loader):
            real_iter_init(self, loader)
            lid = loader.__dict__.get("_spy_id", -1)
            npass = loader.__dict__.get("_spy_passes", 0)
            loader.__dict__["_spy_passes"] = npass + 1
            rec = {"loader": lid, "pass": npass, "size": len(loader.dataset), "indices": []}
            records.append(rec)
            self._spy_record = rec

        dl._BaseDataLoaderIter.__init__ = iter_init
        real_next_index = dl._BaseDataLoaderIter._next_index

        def _next_index(self):
            index = real_next_index(self)
            rec = getattr(self, "_spy_record", None)
            if rec is not None:
                rec["indices"].extend(int(i) for i in (index if isinstance(index, (list, tuple)) else [index]))
            return index

        dl._BaseDataLoaderIter._next_index = _next_index

        real_randint = torch.randint

        def randint(*args, **kwargs):
            out = real_randint(*args, **kwargs)
            if kwargs.get("generator") is None:
                records.append({"draw": out.flatten().tolist()})
            return out

        torch.randint = randint

        optimizer_cls = torch.optim.Optimizer
        real_opt_init = optimizer_cls.__init__
        params, seen, initial = [], set(), []

        def opt_init(self, *args, **kwargs):
            real_opt_init(self, *args, **kwargs)
            for group in self.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)
                        initial.append(p.detach().cpu().clone())

        optimizer_cls.__init__ = opt_init

        def dump():
            with open(os.path.join(_DIR, "loaders-rank%s.jsonl" % _rank()), "w") as fh:
                for rec in records:
                    fh.write(json.dumps(rec) + "\\n")
            torch.save([p.detach().cpu().clone() for p in params], os.path.join(_DIR, "params-rank%s.pt" % _rank()))
            torch.save(initial, os.path.join(_DIR, "initial-rank%s.pt" % _rank()))

        atexit.register(dump)

    _after_torch_import(_patch)
'''
