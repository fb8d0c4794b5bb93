"""`distify verify ARGS`, with the runs it launches forked from this warm process (tests only).

    python tests/scripts/warm_verify.py verify SCRIPT [OPTIONS]

The command is distify's own (`distify.runner.main`, as `python -m distify` runs it) in every respect
but one: ``distify.verify.execute``, which starts each run (plain python, torchrun, Horovod's gloo
launcher), hands the run to the warm launcher (warm_ranks.launch) instead. The ranks then get the
environment those launchers give (warm_ranks: torchrun's and horovodrun's variables, Horovod's
rendezvous server), the probe's sitecustomize from the run's PYTHONPATH (forked_main), their own
OS-seeded generators, and the run's folder, log and timeout; what is not reproduced is the launcher
process and the interpreter's own start-up and teardown. tests/test_verify.py runs most of its cases
this way (each run's three fresh interpreters and the torchrun agent cost ~10 s of CPU a case) and
keeps real launches where the launch is under test: one case per backend, the timeout and Ctrl-C
clean-ups.

A launch whose command line has a shape this file does not know fails the command (a changed
launcher in distify.verify must be taught here, not silently launched for real).
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import warm_ranks  # noqa: E402


def request_of(argv, cwd, env, log, timeout) -> dict:
    """The warm launcher's request for a run of distify.verify (its argv; see verify._run_all)."""
    py = sys.executable
    argv = list(argv)
    if argv[1:3] == ["-m", "torch.distributed.run"]:
        head = argv[3:7]
        if head[0] != "--standalone" or head[1] != "--nproc-per-node":
            raise ValueError(f"warm_verify: unknown torchrun command {argv}")
        launcher, nproc, rest = "torchrun", int(head[2]), argv[6:]
    elif argv[1:3] == ["-m", "horovod.runner.launch"]:
        head = argv[3:9]
        if head[0] != "--gloo" or head[1] != "-np" or head[3] != "-H" or head[5] != py:
            raise ValueError(f"warm_verify: unknown horovodrun command {argv}")
        launcher, nproc, rest = "horovodrun", int(head[2]), argv[9:]
    elif len(argv) >= 2 and argv[0] == py and not argv[1].startswith("-"):
        launcher, nproc, rest = "python", 1, argv[1:]
    else:
        raise ValueError(f"warm_verify: unknown command {argv}")
    return {"launcher": launcher, "nproc": nproc, "script": rest[0], "args": rest[1:], "cwd": str(cwd),
            "stdout": str(log), "stderr": str(log), "env": dict(env), "timeout": timeout}


def warm_execute(run, workdir, env, timeout, log) -> None:
    """distify.verify.execute's contract (returncode, timed_out, seconds, output on `run`)."""
    start = time.monotonic()
    open(log, "wb").close()
    answer = warm_ranks.launch(request_of(run.argv, workdir, env, log, timeout))
    if answer.get("timeout"):
        run.timed_out = True
    else:
        run.returncode = answer["returncode"]
    run.seconds = time.monotonic() - start
    run.output = log.read_text(errors="replace") + (answer.get("detail") or "")


def main() -> None:
    warm_ranks.warm_up()
    import distify.verify
    from distify.runner import main as distify_main

    distify.verify.execute = warm_execute
    sys.argv = ["distify", *sys.argv[1:]]
    distify_main()


if __name__ == "__main__":
    main()
