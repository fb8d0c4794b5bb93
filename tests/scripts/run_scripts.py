"""Run many training scripts as `python SCRIPT`, paying for torch's import once.

Reads a JSON list of jobs ({"script", "cwd", "out", optional "syspath"}) from argv[1], imports torch (and horovod.torch
with --horovod), then forks one child per job: the child changes to the job's folder, sends its
output to the job's file and runs the script as __main__ with no arguments (the script's argparse
defaults: "its own arguments"). Each child gets --timeout seconds. Writes {script: [status, detail]}
as JSON to argv[2]; status is "ok", "error" (detail: the exception's last line) or "timeout".

Used by tests/test_goldens_run.py; nothing here knows about distify.
"""
from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import time
import traceback


def _child(job: dict) -> None:
    os.chdir(job["cwd"])
    fd = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = [job["script"]]
    sys.path[0] = job.get("syspath") or os.path.dirname(job["script"])
    code = 0
    try:
        runpy.run_path(job["script"], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported to the parent through the exit status
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # atexit handlers (the runtime's process-group cleanup) run as in a real interpreter exit
    import atexit

    atexit._run_exitfuncs()
    os._exit(code)


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            lines = [line.rstrip() for line in fh if line.strip()]
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""


def main() -> None:
    jobs_path, result_path = sys.argv[1], sys.argv[2]
    timeout = float(sys.argv[sys.argv.index("--timeout") + 1]) if "--timeout" in sys.argv else 60.0
    import torch  # noqa: F401 - imported once, before the forks

    if "--horovod" in sys.argv:
        import horovod.torch  # noqa: F401
    with open(jobs_path) as fh:
        jobs = json.load(fh)
    results = {}
    for job in jobs:
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            _child(job)
        deadline = time.monotonic() + timeout
        status = None
        while status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(raw)
                status = ["ok", ""] if code == 0 else ["error", f"exit {code}: {_last_line(job['out'])}"]
            elif time.monotonic() > deadline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                status = ["timeout", f"still running after {timeout:.0f} s"]
            else:
                time.sleep(0.02)
        results[job["script"]] = status
    with open(result_path, "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    main()
