"""Issue 21, item 4, by meaning not spelling: a script may name the functions and classes of its
project's modules as ``from utils import f``, ``import utils`` then ``utils.f``, ``import utils as
U`` then ``U.f``, ``from utils import f as g``, or (in a package) ``from . import utils``. Each
multi-file golden of fixtures/projects/ is migrated in every spelling: the edits are the same as
for the plain spelling (the plain output, re-spelled, is the output of the re-spelled script), the
helper modules come out byte for byte alike and the findings are the same (code, file, line).

The spellings are made by libcst's scope analysis: the references of each imported name, and only
those, are rewritten."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Dict, List, Tuple

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ScopeProvider

from distify.engine import Mode
from distify.options import Options
from distify.project import migrate_project

PROJECTS = Path(__file__).resolve().parent.parent / "fixtures" / "projects"
SPELLINGS = ("module", "alias", "as", "relative")


def _is_project_module(home: Path, name: str) -> bool:
    parts = name.split(".")
    return home.joinpath(*parts).with_suffix(".py").is_file() or (home.joinpath(*parts) / "__init__.py").is_file()


def respell(code: str, home: Path, spelling: str) -> str:
    """`code` with every ``from <project module> import a, b`` of its top level spelled as
    `spelling`, and every reference to `a` and `b` rewritten to match."""
    wrapper = MetadataWrapper(cst.parse_module(code))
    scopes = wrapper.resolve(ScopeProvider)
    module = wrapper.module
    new_refs: Dict[cst.Name, cst.BaseExpression] = {}
    new_stmts: Dict[cst.SimpleStatementLine, cst.SimpleStatementLine] = {}
    scope = scopes[module.body[0]]
    for stmt in module.body:
        if not (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.ImportFrom)):
            continue
        imp = stmt.body[0]
        if imp.relative or imp.module is None or isinstance(imp.names, cst.ImportStar):
            continue
        name = cst.helpers.get_full_name_for_node(imp.module)
        if not _is_project_module(home, name) or (spelling == "relative" and "." in name):
            continue
        if spelling in ("module", "relative") and any(name.split(".")[0] in s.assignments for s in set(scopes.values())):
            continue  # `simclr = SimCLR(...)`: the module's name is a variable of the script
        handle = {"module": name, "relative": name, "alias": f"m{len(new_stmts)}_"}.get(spelling)
        for alias in imp.names:
            local = alias.evaluated_alias or alias.evaluated_name
            new = f"{local}_x" if spelling == "as" else None
            for assignment in scope[local]:
                if getattr(assignment, "node", None) is not imp:
                    continue
                for access in assignment.references:
                    node = access.node
                    if isinstance(node, cst.Name):
                        new_refs[node] = cst.Name(new) if new else cst.parse_expression(f"{handle}.{alias.evaluated_name}")
        if spelling == "as":
            line = f"from {name} import " + ", ".join(f"{a.evaluated_name} as {a.evaluated_name}_x" for a in imp.names)
        elif spelling == "module":
            line = f"import {name}"
        elif spelling == "alias":
            line = f"import {name} as {handle}"
        else:
            line = f"from . import {name}"
        new_stmts[stmt] = cst.parse_statement(line).with_changes(leading_lines=stmt.leading_lines)

    class _T(cst.CSTTransformer):
        def leave_Name(self, original, updated):
            return new_refs.get(original, updated)

        def leave_SimpleStatementLine(self, original, updated):
            return new_stmts.get(original, updated)

    return module.visit(_T()).code


def _layout(dst: Path, spelling: str, package: bool) -> Path:
    """The script of the project copied to `dst`, re-spelled (not for "plain"), the folder made a
    package when `package`."""
    if package:
        (dst / "__init__.py").write_text("")
    script = dst / "train.py"
    if spelling != "plain":
        script.write_text(respell(script.read_text(), dst, spelling))
    return script


def _migrated(name: str, spelling: str, base: Path, package: bool) -> Tuple[str, str, Dict[str, str], List[tuple]]:
    """(script before, script after, every other file after, findings) of project `name` in `spelling`."""
    home = base / f"{name}_{spelling}{'_pkg' if package else ''}"
    shutil.copytree(PROJECTS / name / "in", home)
    script = _layout(home, spelling, package)
    before = script.read_text()
    result = migrate_project([str(script)], Options(backend="ddp"), Mode.WRITE)
    findings = sorted((Path(f.path).name, x.code, x.line) for f in result.files for x in f.findings)
    findings += sorted((Path(o.path).name, x.code, x.line) for f in result.files for o in f.others for x in o.findings)
    others = {str(p.relative_to(home)): p.read_text() for p in sorted(home.rglob("*.py")) if p != script}
    return before, script.read_text(), others, findings


CASES = [(p.name, s) for p in sorted(PROJECTS.iterdir()) if (p / "expected.ddp").is_dir() for s in SPELLINGS]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The plain spelling's migration of each project (and of each as a package), made once."""
    base, done = tmp_path_factory.mktemp("plain"), {}

    def get(name: str, package: bool):
        if (name, package) not in done:
            done[name, package] = _migrated(name, "plain", base, package)
        return done[name, package]
    return get


@pytest.mark.parametrize("name,spelling", CASES)
def test_a_project_migrates_alike_in_every_spelling_of_its_imports(name, spelling, plain, tmp_path):
    package = spelling == "relative"
    before, out, others, findings = _migrated(name, spelling, tmp_path, package)
    if before == (PROJECTS / name / "in" / "train.py").read_text():
        pytest.skip(f"{name}: no import to re-spell as {spelling}")
    _, plain_out, plain_others, plain_findings = plain(name, package)
    assert plain_out != (PROJECTS / name / "in" / "train.py").read_text(), "the plain spelling is migrated"
    assert out == respell(plain_out, PROJECTS / name / "in", spelling)
    assert others == plain_others
    assert findings == plain_findings


def test_respell_rewrites_only_the_references_of_the_import(tmp_path):
    (tmp_path / "utils.py").write_text("def step(): pass\n")
    code = "from utils import step\n\ndef f(step_count):\n    x.step()\n    step(step=1)\n"
    assert respell(code, tmp_path, "alias") == "import utils as m0_\n\ndef f(step_count):\n    x.step()\n    m0_.step(step=1)\n"
    assert respell(code, tmp_path, "as") == "from utils import step as step_x\n\ndef f(step_count):\n    x.step()\n    step_x(step=1)\n"
