"""Golden fixtures: every `fixtures/<group>/<case>.in.py` against its expected output per backend.

For each case and backend: the output equals `<case>.<backend>.py` (or the input itself when that
file does not exist: the case must come out unchanged), it compiles, a second run changes nothing,
and the warnings equal `<case>.<backend>.warnings` (none when absent).

Regenerate after an intended change with `DISTIFY_UPDATE_GOLDENS=1 pytest tests/test_fixtures.py`,
then read every changed expected file as a reviewer would. Regeneration writes and overwrites expected
files but never deletes one: a case whose expected file would go away fails and names the file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.rules.base import Options

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BACKENDS = ("ddp", "horovod", "fsdp")
UPDATE = os.environ.get("DISTIFY_UPDATE_GOLDENS") == "1"


def cases():
    for path in sorted(FIXTURES.rglob("*.in.py")):
        for backend in BACKENDS:
            yield pytest.param(path, backend, id=f"{path.parent.name}/{path.name[:-6]}-{backend}")


def _expected_paths(src: Path, backend: str):
    stem = src.name[: -len(".in.py")]
    return src.with_name(f"{stem}.{backend}.py"), src.with_name(f"{stem}.{backend}.warnings")


def expected_refusal(src: Path, backend: str) -> bool:
    """What the goldens say: the case comes out unchanged and its warnings say the file was not
    migrated (a rule refused it), so the command must exit with the refusal code."""
    expected, warnings = _expected_paths(src, backend)
    text = warnings.read_text() if warnings.exists() else ""
    return not expected.exists() and re.search(r"\bnot (migrated|converted)\b", text) is not None


FLAGS = {"--scale-lr": "scale_lr", "--fp16-allreduce": "fp16_allreduce", "--adasum": "adasum", "--seed-per-rank": "seed_per_rank",
         "--standalone": "standalone", "--bf16": "bf16"}


def _options(src: Path, backend: str) -> Options:
    """Options for a case: `<case>.flags` may hold flags such as `--scale-lr --fp16-allreduce`."""
    flags_path = src.with_name(src.name[: -len(".in.py")] + ".flags")
    kwargs = {}
    if flags_path.exists():
        for flag in flags_path.read_text().split():
            kwargs[FLAGS[flag]] = True
    if kwargs.get("adasum") and backend != "horovod":
        kwargs.pop("adasum")
    if kwargs.get("bf16") and backend != "fsdp":
        kwargs.pop("bf16")
    return Options(backend=backend, **kwargs)


def regenerate(path: Path, content, why_none: str) -> None:
    """``DISTIFY_UPDATE_GOLDENS=1``: write ``content`` to the expected file ``path``. ``None`` means the
    case now expects no such file; an existing one is then never deleted here, because a rule that
    stopped firing would turn its golden into "must come out unchanged" (and its end-to-end runs into
    skips) without anyone reading a diff. The test fails instead and says which file to delete by hand."""
    if content is not None:
        path.write_bytes(content)
    elif path.exists():
        pytest.fail(f"DISTIFY_UPDATE_GOLDENS: {path} exists, but the case now {why_none}. Regeneration never "
                    f"deletes an expected file: if that is the intended behaviour, delete it yourself (git rm) "
                    f"and say why in the commit.", pytrace=False)


def _warning_lines(findings) -> str:
    return "".join(f"{f.line}:{f.col}: {f.code} {f.message}\n" for f in findings if f.kind == "warning")


@pytest.mark.parametrize("src,backend", list(cases()))
def test_fixture(src: Path, backend: str) -> None:
    source = src.read_bytes()
    expected_path, warnings_path = _expected_paths(src, backend)
    options = _options(src, backend)
    result = migrate_source(source, options)
    warnings = _warning_lines(result.findings)

    if UPDATE:
        regenerate(expected_path, result.output if result.output != source else None, "comes out unchanged")
        regenerate(warnings_path, warnings.encode() or None, "reports no warning")

    expected = expected_path.read_bytes() if expected_path.exists() else source
    assert result.output.decode() == expected.decode(), f"{src.name} ({backend}) differs from {expected_path.name}"
    compile(result.output, str(expected_path), "exec", dont_inherit=True)

    again = migrate_source(result.output, options)
    assert again.output == result.output, "a second run changed the output (not idempotent)"

    expected_warnings = warnings_path.read_text() if warnings_path.exists() else ""
    assert warnings == expected_warnings
    # a refusal (exit 3, tests/test_exit_codes.py) exactly where the goldens say the file is not migrated
    assert result.refused == expected_refusal(src, backend)


def test_regeneration_never_deletes_an_expected_file(tmp_path: Path) -> None:
    """A golden whose case now comes out unchanged (or warning-free) stays on disk and the update run
    fails, naming it; writing and overwriting still work, and an absent file stays absent."""
    golden = tmp_path / "case.ddp.py"
    golden.write_text("x = 1\n")
    with pytest.raises(pytest.fail.Exception, match=r"case\.ddp\.py exists, but the case now comes out unchanged"):
        regenerate(golden, None, "comes out unchanged")
    assert golden.read_text() == "x = 1\n"
    regenerate(golden, b"x = 2\n", "comes out unchanged")
    assert golden.read_bytes() == b"x = 2\n"
    absent = tmp_path / "case.ddp.warnings"
    regenerate(absent, None, "reports no warning")
    assert not absent.exists()


def test_every_fixture_group_has_cases() -> None:
    groups = [d for d in FIXTURES.iterdir() if d.is_dir()]
    assert groups
    for d in groups:
        # a group holds single-file cases (`*.in.py`) or project cases (folders with an `in/` tree)
        assert list(d.glob("*.in.py")) or list(d.glob("*/in")), f"fixture folder {d.name} has no case"


@pytest.mark.parametrize("src,backend", [c for c in cases() if "scenarios" in str(c.values[0])])
def test_output_does_not_depend_on_reporting_positions(src: Path, backend: str) -> None:
    """--quiet skips position resolution; the rewrite itself must not change with it."""
    options = _options(src, backend)
    with_positions = migrate_source(src.read_bytes(), options).output
    without = migrate_source(src.read_bytes(), options.replace(positions=False)).output
    assert without == with_positions
