"""The README's first lines are the two set-up commands, and CI runs them as written.

`.ci/fresh-venv` runs both, verbatim, in a brand-new virtualenv (`.ci/run` calls it); the tests here
check that what it runs is what the README says, and that the first command's distify part exits 0.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None and text.index(block.group(0)) < 40, "the README must open with the commands"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    install, test = commands
    assert "pip install" in install and "distify examples/" in install
    example = re.search(r"distify (examples/\S+\.py)", install).group(1)
    assert (ROOT / example).is_file()
    assert "pytest" in test


def test_ci_runs_the_readme_test_command():
    test = readme_commands()[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in [line.strip() for line in ci], ".ci/run must run the README's test command"


def test_ci_runs_both_readme_commands_verbatim_in_a_fresh_venv():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "bash .ci/fresh-venv" in ci, ".ci/run must replay the README in a fresh virtualenv"
    printed = subprocess.run(["bash", str(ROOT / ".ci" / "fresh-venv"), "--print"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    assert printed.splitlines() == readme_commands()
    script = (ROOT / ".ci" / "fresh-venv").read_text()
    assert "--system-site-packages" not in script and re.search(r"python3? -m venv ", script)


def test_readme_first_command_exits_0():
    """The distify half of the install command: a preview that shows the rewrite and exits 0 (a
    README command that exits 1 does not pass), leaving the example untouched."""
    install = readme_commands()[0]
    distify = install.split("&&")[-1].split()
    assert distify[0] == "distify"
    example = ROOT / distify[1]
    before = example.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "distify", *distify[1:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "+" in proc.stdout and "DistributedSampler" in proc.stdout, proc.stdout
    assert example.read_bytes() == before
    assert shlex.split(install.split("&&")[0])[:2] == ["pip", "install"]
