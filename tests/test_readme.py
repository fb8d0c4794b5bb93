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
    """The README's test command runs verbatim in the fresh venv (below); the main environment
    runs the same command with --full (the end-to-end matrix), narrowed by a marker selection."""
    test = readme_commands()[1]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert any(line == test or line.startswith(test + " --full ") for line in ci), (
        ".ci/run must run the README's test command"
    )


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


# --- the install brings what the tests need ----------------------------------------------------

# Imports that are not the tests' own requirements: the project's packages and test helpers, and
# Horovod (its tests carry @pytest.mark.horovod and skip without it, see conftest.py).
_NOT_REQUIRED = {"distify", "migrate", "runtime", "rules", "e2e_support", "conftest", "horovod"}
# Libraries that tests name only in scripts they hand to the analyser, never run: the library table's
# rows for them are what those tests check.
_ANALYSED_ONLY = {"transformers"}


def _written_beside(source: str) -> set:
    """Modules and packages a test writes itself as files of a project it builds
    (`"proj/models/net.py": ...`, `tmp / "helpers.py"`): its child scripts import them from beside
    them, not from an index."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"(?:[\w.-]+/)*\w+\.py", node.value):
                found.update(part.removesuffix(".py") for part in node.value.split("/"))
    return found


def _imports(source: str) -> set:
    """Top-level names imported anywhere in `source`, also in string constants that are code (the
    child scripts tests write and run)."""
    import ast

    names, todo = set(), [source]
    while todo:
        try:
            tree = ast.parse(todo.pop())
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
                todo.append(__import__("textwrap").dedent(node.value))
    return names


def _test_requirements() -> set:
    """Distribution names the README's install brings: the dependencies and the test extras, with
    everything they require in turn (read from the installed packages' metadata)."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    text = (ROOT / "pyproject.toml").read_text()
    declared = re.search(r"^dependencies = \[(.*?)\]", text, re.S | re.M).group(1)
    declared += re.search(r"^test = \[(.*?)\]", text, re.S | re.M).group(1)
    todo = [Requirement(r).name for r in re.findall(r'"([^"]+)"', declared)]
    found = set()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in found:
            continue
        found.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def test_the_test_extras_bring_every_package_the_tests_import():
    """pip install -e '.[test]' on a fresh machine must bring every third-party package the tests
    import, and the scripts they launch (runnable corpus scripts, the example): a missing one fails
    the second README command there (numpy did). .ci/fresh-venv proves it; this finds it sooner."""
    import importlib.metadata as md

    sources = list((ROOT / "tests").glob("*.py")) + list((ROOT / "examples").glob("*.py"))
    sources += [p for p in (ROOT / "fixtures" / "corpus").glob("*.in.py") if "distify-e2e: runnable" in p.read_text()[:300]]
    imported = set().union(*(_imports(p.read_text()) - _written_beside(p.read_text()) for p in sources))
    local = {p.stem for folder in ("tests", "tests/scripts", "bench", "examples") for p in (ROOT / folder).glob("*.py")}
    # the modules of the fixture projects tests copy and run (fixtures/projects/<name>/in/...)
    local |= {p.stem for p in (ROOT / "fixtures").glob("**/projects/**/*.py")}
    local |= {p.parent.name for p in (ROOT / "fixtures").glob("**/projects/**/__init__.py")}
    third_party = sorted(imported - set(sys.stdlib_module_names) - _NOT_REQUIRED - _ANALYSED_ONLY - local)
    required = _test_requirements()
    providers = md.packages_distributions()
    missing = [name for name in third_party
               if not {d.lower().replace("_", "-") for d in providers.get(name, [name])} & required]
    assert missing == [], f"imported by tests or the scripts they run, but not in the test extras: {missing}"


# --- the Python versions the package claims ----------------------------------------------------

def _python_floor() -> tuple:
    text = (ROOT / "pyproject.toml").read_text()
    spec = re.search(r'^requires-python = ">=(\d+)\.(\d+)"$', text, re.M)
    assert spec is not None, "requires-python must be a plain '>=X.Y' floor"
    return int(spec.group(1)), int(spec.group(2))


def test_requires_python_is_a_python_the_code_runs_on():
    """The floor of requires-python is a Python the package can run on: its source parses with that
    grammar, and [tool.distify] is read with the standard library's tomllib (3.11+), with no fallback
    that would ignore the user's configuration without a word on an older Python. CI (.ci/run) runs
    3.11, so the floor is exactly what is tested."""
    import ast

    floor = _python_floor()
    assert sys.version_info[:2] >= floor, "the tests run on a Python the package does not support"
    for folder in ("migrate", "rules", "runtime"):
        for path in (ROOT / folder).rglob("*.py"):
            ast.parse(path.read_text(), str(path), feature_version=floor)
    config = (ROOT / "migrate" / "config.py").read_text()
    assert "import tomllib" in config and "tomli " not in config and floor >= (3, 11), (
        "[tool.distify] is read with tomllib, new in Python 3.11: requires-python must not promise less")


# --- the README's command-line synopsis is the parser's ----------------------------------------

def _section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _parsers() -> dict:
    """Each command's click command, as `distify` builds it: '' is the migration (the default)."""
    import typer

    from distify import cli, lint, verify
    from distify.runner import SUBCOMMANDS

    apps = {"": cli.app, "lint": lint.lint_app, "verify": verify.app}
    assert set(apps) - {""} == set(SUBCOMMANDS), "a subcommand this test does not know"
    return {name: typer.main.get_command(app) for name, app in apps.items()}


def _long_options(command) -> set:
    return {o for p in command.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)
            if o.startswith("--") and o != "--help"}


def _synopsis() -> dict:
    """The "Command line" block: command ('' for a migration) -> its lines, continuations joined."""
    block = re.search(r"```\n(distify .*?)```", _section("Command line"), re.S).group(1)
    commands: dict = {}
    for line in block.splitlines():
        if line.startswith("distify "):
            word = line.split()[1]
            current = word if not word.startswith(("-", "PATH")) else ""
            commands.setdefault(current, []).append(line)
        else:
            assert line.startswith(" "), line
            commands[current][-1] += line
    return {name: " ".join(lines) for name, lines in commands.items()}


def test_readme_synopsis_matches_the_parser():
    """Every command in the README's synopsis, every option it shows and every choice of --backend
    are the parser's, and the parser has no option the synopsis leaves out."""
    from distify.options import BACKENDS

    parsers, synopsis = _parsers(), _synopsis()
    assert set(synopsis) == set(parsers)
    for name, text in synopsis.items():
        shown = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", text))
        assert shown == _long_options(parsers[name]), (name or "distify", shown ^ _long_options(parsers[name]))
        for choices in re.findall(r"--backend (\S+?)\]", text):
            assert tuple(choices.split("|")) == BACKENDS, (name, choices)


def test_readme_examples_parse_with_the_real_parser():
    """The first examples a reader meets ("What it does") and the synopsis's own example values are
    command lines the parser accepts, and they show every backend."""
    from distify.options import BACKENDS
    from distify.runner import parse_fast

    block = re.search(r"```bash\n(distify .*?)```", _section("What it does"), re.S).group(1)
    command = _parsers()[""]
    backends = set()
    for line in block.splitlines():
        words = shlex.split(line.split("#", 1)[0])
        words = [w for i, w in enumerate(words) if w not in "<>" and (i == 0 or words[i - 1] not in "<>")]
        assert words[0] == "distify", line
        args = parse_fast(words[1:])
        assert args is not None, f"not a plain run: {line}"
        command.make_context("distify", words[1:])  # raises on an option the parser does not know
        backends.add(args.get("backend", "ddp"))
    assert backends == set(BACKENDS), backends


# --- the repository stands alone ----------------------------------------------------------------

def _tracked_text_files():
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        path = ROOT / name
        if path.is_file() and path.suffix in (".py", ".md", ".sh", ".toml", ".yaml", ".txt", ""):
            try:
                yield path, path.read_text()
            except UnicodeDecodeError:
                continue


def test_nothing_refers_to_documents_outside_the_repository():
    """Code, scripts, tests and documents name no file outside the repository (the design notes it
    was started from included): what a reader needs is in ARCHITECTURE.md."""
    outside = re.compile("DESIGN" + r"\.md|\.\./shared/|(?<![\w.-])shared/" + "DESIGN")
    found = [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}"
             for path, text in _tracked_text_files() for m in outside.finditer(text)]
    assert found == []


def test_the_architecture_page_names_files_that_exist():
    """Every path ARCHITECTURE.md names (placeholders like <case>, NNN and * as wildcards) matches a
    file or folder of the repository, and every relative link of the Markdown pages resolves."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    paths = set(re.findall(r"(?<![\w/])((?:migrate|rules|runtime|tests|fixtures|bench|examples|\.ci)/[\w./*<>-]*[\w*>/])", text))
    assert len(paths) > 20, "the page no longer names the modules it describes"
    missing = [p for p in sorted(paths) if not list(ROOT.glob(re.sub(r"<[^>]*>|NNN", "*", p).rstrip("/")))]
    assert missing == []
    for page in (ROOT / "README.md", ROOT / "ARCHITECTURE.md", *ROOT.glob("*/README.md")):
        for link in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if "://" not in link:
                assert (page.parent / link).exists(), f"{page.name}: broken link {link}"
