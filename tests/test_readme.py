"""The README's first lines are the two set-up commands, and CI runs the same test command."""

from __future__ import annotations

import re
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
