"""The multi-file corpus projects (fixtures/corpus/projects/<name>/): each is a small training project
written in the layout and call shapes of a public multi-file project (fixtures/corpus/README.md says
which), used as input by the multi-file migration tests.

What is checked here is the input itself, not any migration:

* every project has an entry script `train.py` whose docstring names the public project it follows
  and what it exercises (the multi-file tests and their readers rely on that note);
* every project is listed in fixtures/corpus/README.md;
* (e2e) every entry script runs under plain `python` from a copy of its folder, on CPU, and its last
  stdout line, `final ...`, is the same in two runs (a reference the executed tests can compare with).
"""
from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, run_python  # noqa: E402

PROJECTS = REPO_ROOT / "fixtures" / "corpus" / "projects"
README = REPO_ROOT / "fixtures" / "corpus" / "README.md"


def _projects():
    return sorted(p for p in PROJECTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def _is_entry(path: Path) -> bool:
    """A top-level script of the project that runs when executed: it has an `if __name__ == "__main__":`."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            sides = [node.test.left, *node.test.comparators]
            if any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides):
                return True
    return False


def _entries():
    for project in _projects():
        for script in sorted(project.glob("*.py")):
            if _is_entry(script):
                yield pytest.param(project, script.name, id=f"{project.name}/{script.name}")


def test_there_are_projects() -> None:
    assert len(_projects()) >= 6


@pytest.mark.parametrize("project", _projects(), ids=lambda p: p.name)
def test_entry_script_says_what_it_exercises(project: Path) -> None:
    entry = project / "train.py"
    assert entry.is_file(), f"{project.name} has no train.py"
    doc = ast.get_docstring(ast.parse(entry.read_text())) or ""
    assert doc.startswith("Project idiom:"), f"{project.name}/train.py: the docstring must name the public project"
    assert "Exercises:" in doc and "Run: `python train.py" in doc, f"{project.name}/train.py: say what it exercises"
    assert _is_entry(entry), f"{project.name}/train.py does not run as a script"


def test_every_project_is_listed_in_the_corpus_readme() -> None:
    text = README.read_text()
    missing = [p.name for p in _projects() if f"`projects/{p.name}/`" not in text]
    assert not missing, f"not listed in fixtures/corpus/README.md: {missing}"


def _final_line(project: Path, script: str, workdir: Path) -> str:
    copy = workdir / project.name
    shutil.copytree(project, copy)
    result = run_python(copy / script, cwd=copy, timeout=120)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("final "), (
        f"{project.name}/{script}: the last stdout line must start with 'final '\n{result.describe()}")
    return lines[-1]


@pytest.mark.e2e
@pytest.mark.parametrize("project, script", list(_entries()))
def test_project_runs_under_plain_python_deterministically(project: Path, script: str, tmp_path: Path) -> None:
    first = _final_line(project, script, tmp_path / "first")
    second = _final_line(project, script, tmp_path / "second")
    assert first == second, f"{project.name}/{script} is not deterministic: {first!r} then {second!r}"
