"""Run many training scripts as `python SCRIPT`, paying for torch's import once.

Reads a JSON list of jobs ({"script", "cwd", "out", optional "syspath" and "fallback"}) from argv[1],
imports torch and what the scripts would each import again (see _warm_up), then forks one child per
job: the child changes to the job's folder, sends its output to the job's file and runs the script
as __main__ with no arguments (the script's argparse defaults: "its own arguments"). Each child gets
--timeout seconds; --jobs N children run at a time. A job's "fallback" (a job of the same form) runs
only when the job does not finish ok. Writes {script: [status, detail, seconds]} for every script
that ran as JSON to argv[2]; status is "ok", "error" (detail: the exit status and the output's last
line) or "timeout".

Used by tests/test_goldens_run.py; nothing here knows about distify.
"""
from __future__ import annotations

import ast
import importlib
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forked_main import run_as_main  # noqa: E402  (the child's side, shared with warm_ranks.py)


def _child(job: dict) -> None:
    run_as_main(job["script"], (), job["cwd"], job["out"], None, None, job.get("syspath"))


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            lines = [line.rstrip() for line in fh if line.strip()]
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""


def _source(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _imported_modules(source: str):
    """The absolute module names a script imports anywhere (top level or inside functions)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def _compiles(job: dict) -> bool:
    return "compile(" in _source(job["script"])


def _warm_up(jobs: list) -> None:
    """Import, once and before any fork, what the children would otherwise each import again.

    torch imports much of itself lazily: the first optimizer a script builds imports torch._dynamo,
    some 1.5 s of the 1.6 s a small training script takes in a fresh child. Every other module the
    scripts import is imported here too, with three exceptions, so that what a script finds loaded
    stays what a plain run finds: torch's own submodules (one loaded here would be reachable as an
    attribute in every script, `torch.distributed.algorithms.ddp_comm_hooks` without its import;
    what torch._dynamo imports is the exception, a plain run has it from its first optimizer on);
    a script's own modules (a name found next to a script or in its job folder, which must stay
    that script's); and any module that fails to import here (the child meets that failure itself).
    """
    import torch._dynamo  # noqa: F401 - what torch.optim imports at every script's first optimizer

    local = set()
    names = set()
    jobs = jobs + [job["fallback"] for job in jobs if job.get("fallback")]
    for job in jobs:
        for folder in {job.get("syspath") or os.path.dirname(job["script"]), job["cwd"]}:
            try:
                local.update(entry.split(".")[0] for entry in os.listdir(folder))
            except OSError:
                pass
        names.update(_imported_modules(_source(job["script"])))
    for name in sorted(names):
        top = name.split(".")[0]
        if top in local or top == "torch" or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - not installed, or it fails: the child will say so
            pass


def main() -> None:
    jobs_path, result_path = sys.argv[1], sys.argv[2]
    timeout = float(sys.argv[sys.argv.index("--timeout") + 1]) if "--timeout" in sys.argv else 60.0
    parallel = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 1
    import torch  # noqa: F401 - imported once, before the forks

    with open(jobs_path) as fh:
        jobs = json.load(fh)
    started = time.monotonic()
    _warm_up(jobs)
    print(f"run_scripts: warm-up {time.monotonic() - started:.1f} s", file=sys.stderr)
    # Scripts that call torch.compile run last, after torch's compiler is imported here (1.4 s
    # once, instead of in each of them): the others never find it loaded, as in a plain run.
    pending = sorted(jobs, key=_compiles)[::-1]  # popped from the end: in order, compiling ones last
    compiler_loaded = False
    results = {}
    running = {}  # pid -> (job, start time)
    while pending or running:
        while pending and len(running) < parallel:
            job = pending.pop()
            if not compiler_loaded and _compiles(job):
                import torch._inductor.compile_fx  # noqa: F401

                compiler_loaded = True
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.setpgid(0, 0)
                _child(job)
            running[pid] = (job, time.monotonic())
        for pid, (job, began) in list(running.items()):
            done, raw = os.waitpid(pid, os.WNOHANG)
            elapsed = time.monotonic() - began
            if done:
                code = os.waitstatus_to_exitcode(raw)
                status = ["ok", ""] if code == 0 else ["error", f"exit {code}: {_last_line(job['out'])}"]
            elif elapsed > timeout:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                status = ["timeout", f"still running after {timeout:.0f} s"]
            else:
                continue
            del running[pid]
            results[job["script"]] = status + [round(elapsed, 2)]
            if status[0] != "ok" and job.get("fallback"):
                pending.append(job["fallback"])  # next to run
        time.sleep(0.01)
    print(f"run_scripts: {len(results)} scripts in {time.monotonic() - started:.1f} s", file=sys.stderr)
    with open(result_path, "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    main()
