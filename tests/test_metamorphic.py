"""No decision by spelling: meaning-preserving changes to a fixture input give the same migration.

For every fixture input and backend, one of three transformations (tests/metamorphic.py):

- `neutral`: every identifier the script defines renamed consistently to `v1`, `v2`, ..., and each
  method's instance (or class) parameter to a name of its own (`self` is a convention, not a fact);
- `misleading`: the same, to names such as `test_loader4` or `gpu_ds7` that say the wrong thing;
- `comments`: `# rank`, `# no_sync`, `# TODO: DistributedSampler`, `# local_rank gpu` around every
  statement.

The transformed input must migrate to distify's output of the original with the same renaming
applied (comments and layout aside; distify's own new names compared by position), with the same
finding codes. To keep the run within a few minutes on one core, each (fixture, backend) pair runs one
transformation, rotated so that every fixture meets all three over its three backends.

A fourth, `reorder` (tests/reordering.py), moves what the language leaves free to move: keyword
arguments with effect-free values, adjacent independent imports, definitions and simple assignments.
Every fixture meets it once, under one backend (rotated by fixture). The two migrations are compared in
the reordering's normal form (each block in its least order up to swapping commuting statements,
keyword runs sorted), so a difference is a decision distify took by position, not by meaning.

The quick run (`python -m pytest`) checks the first fixture of every fixture folder (each rule's
folder, the scenarios, the corpus...) under its three backends, so every transformation once per
folder; the other fixtures' cases are marked `sweep` and run with `--full` (CI), see conftest.py.
"""

from __future__ import annotations

import difflib
import zlib
from collections import Counter
from pathlib import Path

import pytest

from distify.engine import InputError, migrate_source
from metamorphic import add_comments, canonical, imported_in, names_of, rename
from reordering import normal_form, reorder
from test_fixtures import BACKENDS, FIXTURES, _options

TRANSFORMS = ("neutral", "misleading", "comments")
REORDER = "reorder"  # one more case per fixture, under one backend (rotated like the others)

# Cases known to fail, each with the spelling decision still behind it (issue #21, item 3); an entry
# that starts passing fails the run (strict xfail), so the list cannot go stale.
KNOWN_FAILURES: dict = {}  # "<group>/<case>" -> (the transformations that fail, why)


def cases():
    sampled = {}  # folder -> its first fixture: the quick run's sample
    for path in sorted(FIXTURES.rglob("*.in.py")):
        sampled.setdefault(path.parent, path)
        name = f"{path.parent.name}/{path.name[:-6]}"
        start = zlib.crc32(name.encode())  # stable per fixture: adding a fixture shifts no other
        for j, backend in enumerate(BACKENDS):
            kind = TRANSFORMS[(start + j) % len(TRANSFORMS)]
            case_id = f"{name}-{backend}-{kind}"
            marks = ()
            kinds, reason = KNOWN_FAILURES.get(name, ((), ""))
            if kind in kinds:
                marks = (pytest.mark.xfail(reason=reason, strict=True),)
            if sampled[path.parent] != path:
                marks += (pytest.mark.sweep,)
            yield pytest.param(path, backend, kind, id=case_id, marks=marks)
        backend = BACKENDS[start % len(BACKENDS)]
        marks = ()
        if REORDER in KNOWN_FAILURES.get(name, ((), ""))[0]:
            marks = (pytest.mark.xfail(reason=KNOWN_FAILURES[name][1], strict=True),)
        if sampled[path.parent] != path:
            marks += (pytest.mark.sweep,)
        yield pytest.param(path, backend, REORDER, id=f"{name}-{backend}-{REORDER}", marks=marks)


def _migrate(source: str, options):
    try:
        result = migrate_source(source.encode(), options)
    except InputError as e:
        return None, Counter({("error", str(type(e).__name__)): 1})
    return result.output.decode(), Counter((f.kind, f.code) for f in result.findings)


def _diff(a: str, b: str) -> str:
    return "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), "original, renamed", "transformed", lineterm="", n=2))


def difference(src: Path, backend: str, kind: str):
    """None when `kind` leaves the migration of `src` the same (modulo the renaming), else why not."""
    original = src.read_text()
    options = _options(src, backend)
    out, codes = _migrate(original, options)
    normalise = str
    if kind == REORDER:
        transformed = reorder(original)
        rename_output = str
        known = names_of(original)
        normalise = lambda text: normal_form(text, known)  # noqa: E731
        # not vacuous: something moved (every fixture has a movable import, keyword or definition);
        # and the normal form undoes what moved, or every migration would differ
        assert transformed != original, f"nothing in {src.name} is free to move: the case would prove nothing"
        assert canonical(normalise(transformed), known) == canonical(normalise(original), known)
    elif kind == "comments":
        transformed = add_comments(original)
        rename_output = str
    else:
        transformed, renaming = rename(original, kind, keep=imported_in(out or original))
        rename_output = renaming.apply
    compile(transformed, str(src), "exec", dont_inherit=True)

    t_out, t_codes = _migrate(transformed, options)
    if t_codes != codes:
        return f"finding codes differ: {sorted(codes.items())} vs {sorted(t_codes.items())}"
    if out is None:
        return None
    known = names_of(transformed)
    expected = canonical(normalise(rename_output(out)), known)
    got = canonical(normalise(t_out), known)
    return None if got == expected else f"{kind} changes the migration:\n{_diff(expected, got)}"


@pytest.mark.parametrize("src,backend,kind", list(cases()))
def test_same_migration_whatever_the_spelling(src: Path, backend: str, kind: str) -> None:
    why = difference(src, backend, kind)
    assert why is None, why


def test_control_a_spelling_test_put_back_fails(monkeypatch) -> None:
    """Control: DST403 once asked whether "rank" occurs in the seed's source text. Put that test back
    and the misleading renaming (the script's `args` becomes a `rank_...` name) changes the result,
    so the metamorphic check sees it; with today's data-flow test it does not."""
    import distify.rules.dst403_seed_per_rank as dst403

    case = FIXTURES / "DST403" / "seeded.in.py"
    assert difference(case, "ddp", "misleading") is None
    monkeypatch.setattr(dst403, "_rank_seeded", lambda ctx, site: "rank" in ctx.code(site.call.args[0].value))
    assert difference(case, "ddp", "misleading") is not None


def test_control_a_method_name_prefix_put_back_fails(monkeypatch) -> None:
    """Control: DST121 once took the methods of the sharded model named save_..., from_... (and other
    prefixes) for housekeeping, also for a class of the script's own. Put that test back and renaming
    hf_style_local's own save_pretrained registers it as a forward method; with today's fact (what
    the method does) it does not."""
    import distify.rules.dst121_fully_shard as dst121

    case = FIXTURES / "corpus" / "hf_style_local.in.py"
    assert difference(case, "fsdp", "neutral") is None
    monkeypatch.setattr(dst121, "runs_forward", lambda classes, q, cls, name, foreign: not name.startswith(("save", "from_")))
    assert difference(case, "fsdp", "neutral") is not None


def test_control_the_instance_by_its_spelling_fails(monkeypatch) -> None:
    """Control: the renaming gives every method's instance a name of its own (`def fit(s12)`). Take
    the instance by its spelling again (only a first parameter spelled `self` counts, as some 35
    tests in the fact layer and the rules once did) and the Trainer's loaders, model and epoch loop
    are no longer followed through the renamed instance (DST951: an unsharded loader, DST905: an
    optimizer of no wrapped model): the migration changes; with the fact
    (Facts.instance, the method's first positional parameter) it does not."""
    import distify.facts as facts

    case = FIXTURES / "scenarios" / "trainer_class.in.py"
    assert difference(case, "ddp", "neutral") is None
    real = facts.instance_of

    def spelled(scope, methods, stmt_scope):
        found = real(scope, methods, stmt_scope)
        return found if found is not None and found[0] == "self" else None

    monkeypatch.setattr(facts, "instance_of", spelled)
    why = difference(case, "ddp", "neutral") or ""
    assert "DST951" in why and "DST905" in why  # the loader left unsharded, the model unwrapped


def test_control_a_reordering_that_moves_nothing_is_caught(monkeypatch) -> None:
    """Control: a reorder transformation that leaves the input as it is would pass every case
    vacuously; the case says so instead."""
    import test_metamorphic as me

    case = FIXTURES / "DST305" / "logging_basic_config.in.py"
    monkeypatch.setattr(me, "reorder", lambda source: source)
    with pytest.raises(AssertionError, match="free to move"):
        difference(case, "ddp", REORDER)


def test_rotation_gives_every_fixture_every_transformation() -> None:
    seen, reordered_under = {}, set()
    for p in cases():
        path, backend, kind = p.values
        seen.setdefault(path, set()).add(kind)
        if kind == REORDER:
            reordered_under.add(backend)
    assert seen and all(kinds == {*TRANSFORMS, REORDER} for kinds in seen.values())
    assert reordered_under == set(BACKENDS)


def test_the_quick_runs_sample_meets_every_folder_and_transformation() -> None:
    """The cases left unmarked (the quick run's; `sweep` ones run with --full) check every fixture
    folder under every transformation."""
    sample = {}
    for p in cases():
        path, _, kind = p.values
        if not any(mark.name == "sweep" for mark in p.marks):
            sample.setdefault(path.parent, set()).add(kind)
    assert set(sample) == {path.parent for path in FIXTURES.rglob("*.in.py")}
    assert all(kinds == {*TRANSFORMS, REORDER} for kinds in sample.values())


def test_control_a_first_keyword_only_lookup_fails(monkeypatch) -> None:
    """Control: make DST305 read a call's keyword only when it comes first (a decision by position).
    basicConfig(level=..., format=...) reordered puts `format` first, the level is no longer found and
    the migration changes, so the reorder check sees it; with today's lookup by keyword it does not."""
    import distify.rules.dst305_logging as dst305

    case = FIXTURES / "DST305" / "logging_basic_config.in.py"
    assert difference(case, "ddp", REORDER) is None

    def first_keyword_only(call, keyword):
        first = next((a for a in call.args if a.keyword is not None), None)
        return first.value if first is not None and first.keyword.value == keyword else None

    monkeypatch.setattr(dst305, "kwarg_value", first_keyword_only)
    assert difference(case, "ddp", REORDER) is not None


def test_control_setup_after_the_first_import_fails(monkeypatch) -> None:
    """Control: make DST001 put the process-group setup right after the script's first import (a
    decision by position: which modules are imported before the setup then depends on the order the
    imports are written in). Reversing the imports moves a different import before the setup, so the
    reorder check sees it; with today's anchor (the first statement that runs) it does not."""
    import distify.rules.dst001_process_group as dst001

    case = FIXTURES / "DST951" / "endless_generator_over_a_call.in.py"
    assert difference(case, "ddp", REORDER) is None
    import libcst as cst

    def after_the_first_import(owner, body):
        imports = [i for i, stmt in enumerate(body) if isinstance(stmt, cst.SimpleStatementLine)
                   and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom))]
        return body[imports[0] + 1]

    monkeypatch.setattr(dst001, "first_statement", after_the_first_import)
    assert "changes the migration" in (difference(case, "ddp", REORDER) or "")
