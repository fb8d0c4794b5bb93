"""Goldens of multi-file projects (fixtures/projects/<name>/in/ and expected.<backend>/): the
script and every module of the project it rewrites, compared file by file, and a second run that
changes nothing. Regenerate with DISTIFY_UPDATE_GOLDENS=1 and read every changed file."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from distify.engine import Mode, Status
from distify.options import BACKENDS, Options
from distify.project import migrate_project

PROJECTS = Path(__file__).resolve().parent.parent / "fixtures" / "projects"
UPDATE = os.environ.get("DISTIFY_UPDATE_GOLDENS") == "1"
CASES = [(p.name, b) for p in sorted(PROJECTS.iterdir()) if (p / "in").is_dir() for b in BACKENDS]


def migrated_copy(name: str, backend: str, dst: Path):
    """Copy the project `name` to `dst`, migrate it in place; the ProjectResult."""
    shutil.copytree(PROJECTS / name / "in", dst)
    return migrate_project([str(dst / "train.py")], Options(backend=backend), Mode.WRITE)


@pytest.mark.parametrize("name,backend", CASES)
def test_project_golden(name, backend, tmp_path):
    result = migrated_copy(name, backend, tmp_path / "p")
    statuses = [f.status for f in result.files] + [o.status for f in result.files for o in f.others]
    assert Status.ERROR not in statuses and Status.FAILED not in statuses, result.files
    expected = PROJECTS / name / f"expected.{backend}"
    for got in sorted((tmp_path / "p").rglob("*.py")):
        rel = got.relative_to(tmp_path / "p")
        want = expected / rel
        original = (PROJECTS / name / "in" / rel).read_text()
        if UPDATE and got.read_text() != original:
            want.parent.mkdir(parents=True, exist_ok=True)
            want.write_text(got.read_text())
        assert got.read_text() == (want.read_text() if want.is_file() else original), f"{rel} ({backend})"
    # idempotence: the migrated project, migrated again, is unchanged
    again = migrate_project([str(tmp_path / "p" / "train.py")], Options(backend=backend), Mode.CHECK)
    assert not again.changed and all(not o.output or o.output == o.source for f in again.files for o in f.others)
