"""The rule registry: every rule is documented, registered once, named after its file, has fixtures.

Each check is a small function returning the problems it found, so the same function is run on the
real registry (must find nothing) and on deliberately broken stand-ins (must find something): a check
that can never fail would protect nothing.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterable, List

import pytest

import distify.rules
from distify.rules import ALL_RULES, BY_CODE, STAGES, selected
import libcst as cst

from distify.anatomy import analyse
from distify.options import Options
from distify.rules.base import BACKENDS, DDP_BACKEND, Context, Rule

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
RULES_DIR = Path(distify.rules.__file__).resolve().parent
CODE_RE = re.compile(r"DST\d{3}")
SECTIONS = ("What it does", "Why", "Example")


# checks ------------------------------------------------------------------------------------------

def docstring_problems(rule: Rule) -> List[str]:
    """The class docstring (what ``--explain`` prints) has the three sections, in order, non-empty."""
    doc = type(rule).__dict__.get("__doc__")  # a subclass without a docstring must not borrow Rule's
    if not doc or not doc.strip():
        return [f"{rule.code or type(rule).__name__}: no docstring"]
    text = inspect.cleandoc(doc)
    problems = []
    positions = []
    for section in SECTIONS:
        m = re.search(rf"^\s*{re.escape(section)}:[ \t]*$", text, re.MULTILINE)
        if m is None:
            problems.append(f"{rule.code}: docstring has no '{section}:' section")
            continue
        positions.append((m.start(), m.end(), section))
    if problems:
        return problems
    if [s for _, _, s in sorted(positions)] != list(SECTIONS):
        problems.append(f"{rule.code}: docstring sections are not in the order {SECTIONS}")
    if not text.split("\n", 1)[0].strip() or positions[0][0] == 0:
        problems.append(f"{rule.code}: docstring has no one-line summary before 'What it does:'")
    ordered = sorted(positions)
    for i, (_, end, section) in enumerate(ordered):
        stop = ordered[i + 1][0] if i + 1 < len(ordered) else len(text)
        if not text[end:stop].strip():
            problems.append(f"{rule.code}: docstring section '{section}:' is empty")
    return problems


def attribute_problems(rule: Rule) -> List[str]:
    problems = []
    label = rule.code or type(rule).__name__
    if not isinstance(rule.code, str) or not CODE_RE.fullmatch(rule.code):
        problems.append(f"{label}: code {rule.code!r} does not match DST<3 digits>")
    for attr in ("name", "summary"):
        value = getattr(rule, attr, None)
        if not isinstance(value, str) or not value.strip():
            problems.append(f"{label}: {attr} is empty")
    if not rule.backends or not set(rule.backends) <= set(BACKENDS):
        problems.append(f"{label}: backends {sorted(rule.backends)!r} not a non-empty subset of {BACKENDS}")
    if getattr(type(rule), "apply", Rule.apply) is Rule.apply:
        problems.append(f"{label}: does not implement apply()")
    return problems


def collision_problems(rules: Iterable[Rule]) -> List[str]:
    seen = {}
    problems = []
    for rule in rules:
        for key, value in (("code", rule.code), ("name", rule.name)):
            if (key, value) in seen:
                problems.append(f"{key} {value!r} used by {seen[(key, value)]} and {type(rule).__name__}")
            seen[(key, value)] = type(rule).__name__
    return problems


def module_name_problems(rule: Rule) -> List[str]:
    """rules/dst201_distributed_sampler.py holds DST201 (and nothing else)."""
    module = type(rule).__module__
    stem = module.rsplit(".", 1)[-1]
    if not module.startswith("distify.rules."):
        return [f"{rule.code}: defined in {module}, not in a distify.rules module"]
    if not stem.startswith(rule.code.lower() + "_"):
        return [f"{rule.code}: lives in {stem}.py; the file name must start with '{rule.code.lower()}_'"]
    return []


def fixture_problems(codes: Iterable[str], fixtures: Path) -> List[str]:
    """Every code has fixtures/<code>/ with a case; every fixtures/DSTxxx folder is a known code."""
    codes = set(codes)
    problems = []
    for code in sorted(codes):
        folder = fixtures / code
        if not folder.is_dir():
            problems.append(f"{code}: no fixtures/{code}/ folder")
        elif not list(folder.glob("*.in.py")):
            problems.append(f"{code}: fixtures/{code}/ has no *.in.py case")
    for folder in sorted(p for p in fixtures.iterdir() if p.is_dir()):
        if re.fullmatch(r"DST\w*", folder.name, re.IGNORECASE) and folder.name not in codes:
            problems.append(f"fixtures/{folder.name}/ names no registered rule")
    return problems


def registration_problems(registered_modules: Iterable[str], rules_dir: Path) -> List[str]:
    """Every rules/dst*.py is in the registry, and every registered module exists."""
    on_disk = {p.stem for p in rules_dir.glob("dst*.py")}
    registered = set(registered_modules)
    problems = [f"rules/{m}.py is not registered in rules/__init__.py" for m in sorted(on_disk - registered)]
    problems += [f"registered module {m} has no rules/{m}.py" for m in sorted(registered - on_disk)]
    problems += [
        f"rules/{m}.py: a rule module must be named dst<3 digits>_<name>.py"
        for m in sorted(on_disk)
        if not re.fullmatch(r"dst\d{3}_[a-z0-9_]+", m)
    ]
    return problems


RULE_MODULE = re.compile(r"dst\d{3}_\w+")


def coupling_problems(rules_dir: Path) -> List[str]:
    """Rules share facts (the fact layer), edit builders (``distify.edits``) and decisions (the
    declared fields of ``ctx.plan``), never each other: no module of the rules package imports a rule
    module or the registry, and none reads or writes a free-form ``.state`` dict."""
    import ast

    problems = []
    for path in sorted(rules_dir.glob("*.py")):
        if path.stem == "__init__":
            continue  # the registry itself imports every rule
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            targets: List[str] = []
            if isinstance(node, ast.ImportFrom):
                base = ("distify.rules" + ("." + node.module if node.module else "")) if node.level else node.module or ""
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
                if base == "distify.rules" and not any(RULE_MODULE.fullmatch(a.name) for a in node.names):
                    problems.append(f"rules/{path.name}:{node.lineno}: imports the registry (distify.rules)")
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                stem = t.rsplit(".", 1)[-1]
                if t.startswith("distify.rules.") and RULE_MODULE.fullmatch(stem) and stem != path.stem:
                    problems.append(f"rules/{path.name}:{node.lineno}: imports the rule module {stem}")
            if isinstance(node, ast.Attribute) and node.attr == "state":
                problems.append(f"rules/{path.name}:{node.lineno}: reads or writes `.state` (declare a field of Plan)")
    return problems


# the real registry -------------------------------------------------------------------------------

def test_registry_is_not_empty_and_indexed_by_code() -> None:
    assert ALL_RULES
    assert set(BY_CODE) == {r.code for r in (*ALL_RULES, *STAGES)}
    assert all(BY_CODE[r.code] is r for r in (*ALL_RULES, *STAGES))


def test_each_row_of_the_registry_is_its_modules_rule() -> None:
    """The registry is data (code, module, backends) so that a run imports only the rules it
    applies: each row must say what the module's RULE says, in the engine's order."""
    rows = distify.rules._TABLE
    assert [(r.code, type(r).__module__.rsplit(".", 1)[-1], tuple(sorted(r.backends))) for r in ALL_RULES] == [
        (code, module, tuple(sorted(backends))) for code, module, backends in rows]
    assert [(s.code, s.__module__) for s in STAGES] == list(distify.rules._STAGES)
    for backend in BACKENDS:
        assert selected(backend) == tuple(r for r in ALL_RULES if backend in r.backends)
        assert selected(backend, ("DST2",), ("DST20",)) == tuple(
            r for r in ALL_RULES if backend in r.backends and r.code.startswith("DST2") and not r.code.startswith("DST20"))
    assert selected("ddp", codes=("DST961",)) == (BY_CODE["DST961"],)
    assert all(distify.rules.by_code(code) is rule for code, rule in BY_CODE.items())
    assert distify.rules.by_code("DST999") is None


def test_a_run_imports_only_the_rules_it_selects() -> None:
    """Selecting the ddp rules loads no module of a rule for FSDP or Horovod alone (nor the
    backend conversion); asking for the whole registry loads them all."""
    code = "import sys; from distify.rules import selected; selected('ddp'); print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                check=True).stdout.split())
    for r in ALL_RULES:
        assert (type(r).__module__ in loaded) == ("ddp" in r.backends), r.code
    assert "distify.convert" not in loaded


@pytest.mark.parametrize("rule", (*ALL_RULES, *STAGES), ids=lambda r: r.code)
def test_rule_docstring_has_three_parts(rule: Rule) -> None:
    assert docstring_problems(rule) == []


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.code)
def test_stages_are_no_rules_and_keep_a_code(stage) -> None:
    """An engine stage (the backend conversion) is not run as a rule, but --select/--ignore and
    --explain know its code as they know a rule's."""
    assert not isinstance(stage, Rule) and not hasattr(stage, "apply")
    assert attribute_problems(stage) == [f"{stage.code}: does not implement apply()"]  # code, name, summary, backends
    assert stage.code not in {r.code for b in BACKENDS for r in selected(b)}
    assert stage.__module__.startswith("distify.") and not stage.__module__.startswith("distify.rules")


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_rule_attributes(rule: Rule) -> None:
    assert attribute_problems(rule) == []


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.code)
def test_rule_module_is_named_after_its_code(rule: Rule) -> None:
    assert module_name_problems(rule) == []


def test_codes_and_names_are_unique() -> None:
    assert collision_problems((*ALL_RULES, *STAGES)) == []


def test_one_rule_per_module() -> None:
    modules = [type(r).__module__ for r in ALL_RULES]
    assert len(modules) == len(set(modules))


def test_every_rule_module_is_registered() -> None:
    registered = [type(r).__module__.rsplit(".", 1)[-1] for r in ALL_RULES]
    assert registration_problems(registered, RULES_DIR) == []


def test_every_rule_has_fixtures_and_every_fixture_folder_a_rule() -> None:
    assert fixture_problems(BY_CODE, FIXTURES) == []


def test_rules_share_facts_not_each_other() -> None:
    assert coupling_problems(RULES_DIR) == []
    assert not hasattr(Context(analyse(cst.parse_module("import torch\n")), Options()), "state")


def test_select_by_prefix() -> None:
    chosen = selected(DDP_BACKEND, select=["DST2"])
    assert chosen, "no DST2xx rule selected"
    assert all(r.code.startswith("DST2") for r in chosen)
    assert {r.code for r in chosen} == {
        r.code for r in ALL_RULES if r.code.startswith("DST2") and DDP_BACKEND in r.backends
    }
    assert [r.code for r in selected(DDP_BACKEND, select=["dst2"])] == [r.code for r in chosen]


def test_ignore_by_prefix() -> None:
    kept = selected(DDP_BACKEND, ignore=["DST3"])
    assert not any(r.code.startswith("DST3") for r in kept)
    everything = selected(DDP_BACKEND)
    assert any(r.code.startswith("DST3") for r in everything)
    assert [r.code for r in kept] == [r.code for r in everything if not r.code.startswith("DST3")]


def test_selection_follows_the_backend() -> None:
    for backend in BACKENDS:
        assert [r.code for r in selected(backend)] == [r.code for r in ALL_RULES if backend in r.backends]


def _distify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distify", *args], capture_output=True, text=True, timeout=120
    )


def test_explain_prints_the_docstring() -> None:
    proc = _distify("--explain", "DST201")
    assert proc.returncode == 0, proc.stderr
    rule = BY_CODE["DST201"]
    assert inspect.cleandoc(type(rule).__doc__) in proc.stdout
    assert proc.stdout.startswith(f"DST201 {rule.name}")


def test_explain_unknown_code_exits_2() -> None:
    proc = _distify("--explain", "DST999")
    assert proc.returncode == 2
    assert "DST999" in proc.stderr
    assert proc.stdout == ""


# the checks themselves catch what they are meant to catch ----------------------------------------

def _fake(doc, code="DST777", name="fake-rule", summary="does fake things", module=None, backends=None):
    attrs = {"code": code, "name": name, "summary": summary, "apply": lambda self, ctx: None}
    if doc is not None:
        attrs["__doc__"] = doc
    if backends is not None:
        attrs["backends"] = frozenset(backends)
    cls = type("FakeRule", (Rule,), attrs)
    cls.__module__ = module or f"distify.rules.{code.lower()}_fake"
    return cls()


GOOD_DOC = """Do a fake thing.

    What it does:
        Something.

    Why:
        A reason.

    Example:
        before

        becomes

        after
    """


def test_checks_accept_a_well_formed_rule() -> None:
    rule = _fake(GOOD_DOC)
    assert docstring_problems(rule) == []
    assert attribute_problems(rule) == []
    assert module_name_problems(rule) == []


@pytest.mark.parametrize(
    "doc",
    [
        None,
        "   ",
        GOOD_DOC.replace("What it does:", "What:"),
        GOOD_DOC.replace("Why:", "Because:"),
        GOOD_DOC.replace("Example:", "Examples are left out."),
        GOOD_DOC.replace("A reason.", ""),
        "Do a fake thing.\n\nWhy:\n    A reason.\n\nWhat it does:\n    Something.\n\nExample:\n    x\n",
    ],
    ids=["none", "blank", "no-what", "no-why", "no-example", "empty-section", "out-of-order"],
)
def test_docstring_check_rejects(doc) -> None:
    assert docstring_problems(_fake(doc)) != []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"code": "DST12"},
        {"code": "DSX123"},
        {"code": "dst123"},
        {"code": "DST1234"},
        {"name": ""},
        {"summary": "  "},
        {"backends": ()},
        {"backends": ("tpu",)},
    ],
)
def test_attribute_check_rejects(kwargs) -> None:
    assert attribute_problems(_fake(GOOD_DOC, **kwargs)) != []


def test_collision_check_rejects_duplicate_codes_and_names() -> None:
    assert collision_problems([_fake(GOOD_DOC), _fake(GOOD_DOC, name="other")]) != []
    assert collision_problems([_fake(GOOD_DOC), _fake(GOOD_DOC, code="DST778")]) != []
    assert collision_problems([_fake(GOOD_DOC), _fake(GOOD_DOC, code="DST778", name="other")]) == []


def test_module_name_check_rejects_a_mismatch() -> None:
    assert module_name_problems(_fake(GOOD_DOC, module="distify.rules.dst201_distributed_sampler")) != []
    assert module_name_problems(_fake(GOOD_DOC, module="distify.rules.dst7770_fake")) != []
    assert module_name_problems(_fake(GOOD_DOC, module="somewhere.else.dst777_fake")) != []


def test_fixture_check(tmp_path: Path) -> None:
    (tmp_path / "DST001").mkdir()
    (tmp_path / "DST001" / "case.in.py").write_text("import torch\n")
    (tmp_path / "scenarios").mkdir()
    assert fixture_problems(["DST001"], tmp_path) == []
    # a registered code without a folder
    assert fixture_problems(["DST001", "DST002"], tmp_path) != []
    # a folder without cases
    (tmp_path / "DST002").mkdir()
    (tmp_path / "DST002" / "case.ddp.py").write_text("")
    assert fixture_problems(["DST001", "DST002"], tmp_path) != []
    # a folder for a code nobody registers
    assert fixture_problems(["DST001"], tmp_path) != []


def test_registration_check(tmp_path: Path) -> None:
    for stem in ("dst001_setup", "dst201_sampler", "base"):
        (tmp_path / f"{stem}.py").write_text("")
    assert registration_problems(["dst001_setup", "dst201_sampler"], tmp_path) == []
    assert registration_problems(["dst001_setup"], tmp_path) != []  # a module left out
    assert registration_problems(["dst001_setup", "dst201_sampler", "dst301_gone"], tmp_path) != []
    (tmp_path / "dst30_short.py").write_text("")
    assert registration_problems(["dst001_setup", "dst201_sampler", "dst30_short"], tmp_path) != []


def test_coupling_check(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("from distify.rules.dst201_sampler import RULE\n")
    (tmp_path / "base.py").write_text("from distify.plan import Plan\n")
    (tmp_path / "dst201_sampler.py").write_text(
        "from distify.rules.base import Context\nfrom distify.edits import Put\n"
        "def apply(ctx):\n    ctx.plan.samplers[1] = 'x'\n"
    )
    assert coupling_problems(tmp_path) == []
    broken = {
        "from distify.rules.dst201_sampler import helper\n": "imports the rule module",
        "from . import dst201_sampler\n": "imports the rule module",
        "from .dst201_sampler import helper\n": "imports the rule module",
        "import distify.rules.dst201_sampler\n": "imports the rule module",
        "def f():\n    from distify.rules import selected\n": "imports the registry",
        "def apply(ctx):\n    return ctx.state.get('wrapped')\n": "`.state`",
        "def apply(ctx):\n    ctx.state['sharded'] = []\n": "`.state`",
    }
    for text, why in broken.items():
        (tmp_path / "dst301_save.py").write_text(text)
        found = coupling_problems(tmp_path)
        assert len(found) == 1 and why in found[0], (text, found)
