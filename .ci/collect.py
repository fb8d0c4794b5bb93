"""Which tests each pytest command of CI selects: `python .ci/collect.py` prints them as JSON.

It reads the commands where they are written -- the README's test command (`.ci/run` step 1 runs it
verbatim, in a fresh virtualenv) and the `python -m pytest ... --full -m ...` line of `.ci/run`
(step 2, with the variables `.ci/run` exports before it) -- and collects each, with
`--collect-only`, in this one process: the libraries are imported once, the test modules again
for a command whose environment differs from the previous one's. Printed: {"step1": [...],
"full": [...], "step2": [...]}, where "full" is step 2's command without its `-m` selection.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST = ["python", "-m", "pytest"]


def readme_test_command() -> list:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    commands = [shlex.split(line) for line in block.splitlines() if line.strip()]
    tests = [c for c in commands if c[:3] == PYTEST]
    assert len(tests) == 1, "the README must show one pytest command"
    return tests[0]


def ci_steps() -> dict:
    """{"step1": (args, env), "step2": (args, env), "full": (args, env)}: pytest's arguments and
    the variables set for it."""
    step1 = readme_test_command()
    exported: dict = {}
    step2 = None
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            exported.update(w.split("=", 1) for w in words[1:] if "=" in w)
        elif words[:3] == PYTEST:
            assert step2 is None, ".ci/run runs pytest twice itself; this script knows one such line"
            step2 = (words[3:], dict(exported))
    assert step2 is not None, ".ci/run runs no pytest command"
    args, env = step2
    assert "-m" in args, "step 2 has no marker selection"
    at = args.index("-m")
    return {"step1": (step1[3:], {}), "full": (args[:at] + args[at + 2:], env), "step2": step2}


class _Recorder:
    def __init__(self) -> None:
        self.ids: list = []

    def pytest_collection_finish(self, session) -> None:
        self.ids = [item.nodeid for item in session.items]


def collect(args: list, env: dict, fresh: bool) -> list:
    """The node ids `pytest ARGS` selects under `env`; `fresh`: import the test modules again
    (they read the environment when imported)."""
    import pytest

    tests = str(ROOT / "tests") + os.sep
    for name, module in list(sys.modules.items()) if fresh else ():
        if (getattr(module, "__file__", None) or "").startswith(tests):
            del sys.modules[name]
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        recorder = _Recorder()
        code = pytest.main([*args, "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"],
                           plugins=[recorder])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if code != 0:
        raise SystemExit(f"collecting {args} failed with exit {code}")
    return recorder.ids


def main() -> None:
    os.chdir(ROOT)
    steps = ci_steps()
    for name in set().union(*(env for _, env in steps.values())):  # only what CI gives each command
        os.environ.pop(name, None)
    out = {}
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            last = None
            for step, (args, env) in steps.items():
                out[step] = collect(args, env, fresh=env != last)
                last = env
        finally:
            sys.stdout = stdout
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
