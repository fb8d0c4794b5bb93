"""The ``distify`` command as a user meets it: modes, exit codes, streams, config, import weight.

Every test works on copies in ``tmp_path``. Most run the CLI in-process (the ``cli`` fixture);
the ones about the process itself (stdin/stdout bytes, colours, ``-m``, import time) start
``python -m distify``.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from distify import __version__

EXIT_OK, EXIT_CHANGED, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 123
FINDING = re.compile(r"^(?P<path>.+):(?P<line>\d+):(?P<col>\d+): (?P<code>DST\d{3}) \S")
ANSI = "\x1b["


def run_distify(*args, input: bytes = b"", cwd=None, env=None, timeout: float = 120):
    """``python -m distify ARGS`` with stdin/stdout/stderr as pipes (bytes)."""
    return subprocess.run(
        [sys.executable, "-m", "distify", *map(str, args)],
        input=input, capture_output=True, cwd=cwd, env=env, timeout=timeout,
    )


def _lines(text: str) -> list:
    """Split on \\n, \\r\\n, \\r only (str.splitlines also splits on \\f and friends)."""
    return io.StringIO(text, newline="").readlines()


def apply_unified_diff(old: str, diff: str) -> str:
    """Apply a one-file unified diff to `old`, checking every hunk's counts and context."""
    src, lines = _lines(old), _lines(diff)
    assert lines[0].startswith("--- ") and lines[1].startswith("+++ "), lines[:2]
    out, pos, i = [], 0, 2
    while i < len(lines):
        m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", lines[i])
        assert m, f"not a hunk header: {lines[i]!r}"
        start, n_old = int(m[1]), int(m[2] if m[2] is not None else 1)
        n_new = int(m[4] if m[4] is not None else 1)
        start = start - 1 if n_old else start
        out += src[pos:start]
        pos = start
        i += 1
        seen_old = seen_new = 0
        while i < len(lines) and not lines[i].startswith("@@"):
            tag, text = lines[i][0], lines[i][1:]
            assert tag in " -+\\", f"bad diff line {lines[i]!r}"
            if tag in " -":
                assert src[pos] == text, f"context mismatch at line {pos + 1}: {src[pos]!r} != {text!r}"
                pos += 1
                seen_old += 1
            if tag in " +":
                out.append(text)
                seen_new += 1
            i += 1
        assert (seen_old, seen_new) == (n_old, n_new), "hunk line counts do not match its header"
    return "".join(out + src[pos:])


def error_lines(stderr: str, path) -> list:
    return [ln for ln in stderr.splitlines() if ln.startswith(f"{path}: error: ")]


# --- exit codes, write mode ----------------------------------------------------------------

def test_rewrite_in_place_then_idempotent(cli, train_py):
    before = train_py.read_bytes()
    first = cli(train_py)
    assert first.exit_code == EXIT_CHANGED, first.stderr
    after = train_py.read_bytes()
    assert after != before
    text = after.decode()
    for needle in ("dist.init_process_group(", "DistributedSampler(", "DDP(", "set_epoch(epoch)", "is_main_process()"):
        assert needle in text
    compile(after, str(train_py), "exec")
    assert first.stdout_bytes == b"", "write mode prints nothing on stdout"
    assert f"rewrote {train_py}" in first.stderr
    assert any(FINDING.match(ln) and "DST201" in ln for ln in first.stderr.splitlines()), first.stderr

    second = cli(train_py)
    assert second.exit_code == EXIT_OK, second.stderr
    assert train_py.read_bytes() == after


def test_unchanged_file_exits_0(cli, infer_py):
    before = infer_py.read_bytes()
    result = cli(infer_py)
    assert result.exit_code == EXIT_OK, result.stderr
    assert infer_py.read_bytes() == before
    assert result.stdout_bytes == b""


def test_verbose_says_why_unchanged(cli, infer_py):
    result = cli("-v", infer_py)
    assert result.exit_code == EXIT_OK
    assert f"unchanged {infer_py}" in result.stderr


def test_quiet_prints_nothing_for_a_successful_rewrite(train_py):
    proc = run_distify("--quiet", train_py)
    assert proc.returncode == EXIT_CHANGED, proc.stderr
    assert proc.stderr == b"" and proc.stdout == b""
    assert b"DistributedSampler" in train_py.read_bytes()


def test_quiet_still_reports_errors(cli, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\ndef f(:\n")
    result = cli("-q", bad)
    assert result.exit_code == EXIT_INPUT
    assert len(error_lines(result.stderr, bad)) == 1


def test_internal_failure_exits_123(cli, train_py, monkeypatch):
    import distify.anatomy

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(distify.anatomy, "analyse", boom)  # the engine imports it when it parses
    before = train_py.read_bytes()
    result = cli(train_py)
    assert result.exit_code == EXIT_INTERNAL
    assert error_lines(result.stderr, train_py) == [f"{train_py}: error: internal error: RuntimeError: boom"]
    assert train_py.read_bytes() == before
    stdin = cli("-", input=before)
    assert stdin.exit_code == EXIT_INTERNAL
    assert stdin.stdout_bytes == b""
    assert "<stdin>: error: internal error" in stdin.stderr


# --- --diff / --check ---------------------------------------------------------------------

def test_diff_prints_unified_diff_and_writes_nothing(cli, train_py):
    before = train_py.read_bytes()
    result = cli(train_py, "--diff")
    assert result.exit_code == EXIT_OK, result.stderr  # a preview, like black's --diff; 1 is --check's
    assert train_py.read_bytes() == before
    diff = result.stdout_bytes.decode()
    assert diff.startswith(f"--- {train_py}\n+++ {train_py}\n")  # absolute paths as they are
    plus = [ln for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert any("DistributedSampler" in ln for ln in plus)
    # the diff is exactly the rewrite
    cli(train_py)
    assert apply_unified_diff(before.decode(), diff) == train_py.read_text()


def test_diff_with_form_feeds_stays_a_valid_patch(cli, tmp_path, train_py):
    # str.splitlines() splits on \f too; a diff must split on line endings only
    src = train_py.read_text().replace("criterion = nn.MSELoss()\n", "criterion = nn.MSELoss()\n\f\n", 1)
    src = src.replace("dataset = TensorDataset", "\f\ndataset = TensorDataset", 1)
    train_py.write_text(src)
    result = cli(train_py, "--diff")
    assert result.exit_code == EXIT_OK
    diff = result.stdout_bytes.decode()
    assert "No newline at end of file" not in diff
    cli(train_py)
    assert apply_unified_diff(src, diff) == train_py.read_text()


def test_diff_of_unchanged_file_is_empty(cli, infer_py):
    result = cli(infer_py, "--diff")
    assert result.exit_code == EXIT_OK
    assert result.stdout_bytes == b""


def test_check(cli, train_py, infer_py):
    before_t, before_i = train_py.read_bytes(), infer_py.read_bytes()
    changed = cli("--check", train_py)
    assert changed.exit_code == EXIT_CHANGED
    assert changed.stdout_bytes == b""
    assert f"would rewrite {train_py}" in changed.stderr
    unchanged = cli("--check", infer_py)
    assert unchanged.exit_code == EXIT_OK
    both = cli("--check", train_py, infer_py)
    assert both.exit_code == EXIT_CHANGED
    assert (train_py.read_bytes(), infer_py.read_bytes()) == (before_t, before_i)
    assert sorted(p.name for p in train_py.parent.iterdir()) == ["infer.py", "train.py"]


def test_check_and_diff_together(cli, train_py, infer_py):
    before = train_py.read_bytes()
    result = cli("--check", "--diff", train_py, infer_py)
    assert result.exit_code == EXIT_CHANGED
    assert result.stdout_bytes.startswith(f"--- {train_py}".encode())
    assert b"infer.py" not in result.stdout_bytes
    assert train_py.read_bytes() == before
    assert cli("--check", "--diff", infer_py).exit_code == EXIT_OK


# --- directories --------------------------------------------------------------------------

def test_directory_is_walked_for_py_files(cli, tmp_path, train_py, infer_py):
    src = train_py.read_bytes()
    nested = tmp_path / "pkg" / "sub"
    nested.mkdir(parents=True)
    (nested / "deep.py").write_bytes(src)
    (tmp_path / "notes.txt").write_bytes(src)  # a training script, but not *.py
    (tmp_path / "script").write_bytes(src)
    check = cli("--check", tmp_path)
    assert check.exit_code == EXIT_CHANGED
    assert str(nested / "deep.py") in check.stderr and str(train_py) in check.stderr
    assert "notes.txt" not in check.stderr and f"{tmp_path / 'script'} " not in check.stderr
    assert (nested / "deep.py").read_bytes() == src

    write = cli(tmp_path)
    assert write.exit_code == EXIT_CHANGED, write.stderr
    assert b"DistributedSampler" in (nested / "deep.py").read_bytes()
    assert b"DistributedSampler" in train_py.read_bytes()
    assert (tmp_path / "notes.txt").read_bytes() == src
    assert (tmp_path / "script").read_bytes() == src
    assert b"DistributedSampler" not in infer_py.read_bytes()
    assert "2 files rewritten, 1 file unchanged." in write.stderr
    assert cli(tmp_path).exit_code == EXIT_OK


def test_directory_with_many_files_in_parallel(tmp_path, train_py, infer_py):
    # 8+ files go through the process pool
    src = train_py.read_bytes()
    for i in range(9):
        (tmp_path / f"t{i}.py").write_bytes(src)
    (tmp_path / "bad.py").write_text("import torch\nprint 'x'\n")
    infer_before = infer_py.read_bytes()
    proc = run_distify(tmp_path)
    assert proc.returncode == EXIT_INPUT, proc.stderr  # one bad file: input error wins over "changed"
    err = proc.stderr.decode()
    assert len(error_lines(err, tmp_path / "bad.py")) == 1
    for i in range(9):
        assert b"DistributedSampler" in (tmp_path / f"t{i}.py").read_bytes()
    assert infer_py.read_bytes() == infer_before
    assert "10 files rewritten" in err and "1 file failed" in err
    assert not [p for p in tmp_path.iterdir() if "distify-tmp" in p.name]


# --- stdin --------------------------------------------------------------------------------

def test_stdin_to_stdout(tmp_path, train_py):
    src = train_py.read_bytes()
    proc = run_distify("-", input=src, cwd=tmp_path)
    assert proc.returncode == EXIT_CHANGED, proc.stderr
    out = proc.stdout
    assert b"DistributedSampler(" in out and b"init_process_group" in out
    compile(out, "<stdout>", "exec")  # nothing but the script on stdout
    assert out.startswith(src.split(b"\n", 1)[0])
    assert train_py.read_bytes() == src
    # the same bytes as a rewrite in place
    run_distify(train_py)
    assert train_py.read_bytes() == out


def test_stdin_unchanged_is_echoed(tmp_path, infer_py):
    src = infer_py.read_bytes()
    proc = run_distify("-", input=src, cwd=tmp_path)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert proc.stdout == src


def test_stdin_modes_in_process(cli, train_py, infer_py):
    src = train_py.read_bytes()
    check = cli("-", "--check", input=src)
    assert (check.exit_code, check.stdout_bytes) == (EXIT_CHANGED, b"")
    diff = cli("-", "--diff", input=src)
    assert diff.exit_code == EXIT_OK
    assert cli("-", "--diff", "--check", input=src).exit_code == EXIT_CHANGED
    assert diff.stdout_bytes.startswith(b"--- a/<stdin>\n+++ b/<stdin>\n")
    bad = cli("-", input=b"import torch\ndef f(:\n")
    assert bad.exit_code == EXIT_INPUT
    assert bad.stdout_bytes == b""
    assert len(error_lines(bad.stderr, "<stdin>")) == 1
    mixed = cli("-", train_py)
    assert mixed.exit_code == EXIT_INPUT
    assert train_py.read_bytes() == src


# --- usage --------------------------------------------------------------------------------

def test_version(cli):
    result = cli("--version")
    assert result.exit_code == EXIT_OK
    assert result.stdout.strip() == f"distify {__version__}"


def test_help_via_python_m():
    proc = run_distify("--help")
    assert proc.returncode == EXIT_OK
    out = proc.stdout.decode()
    for flag in ("--backend", "--diff", "--check", "--select", "--ignore", "--strict", "--quiet", "--version"):
        assert flag in out
    assert proc.stderr == b""


# --- one grammar for every command -------------------------------------------------------------

RAW_TYPE = re.compile(r"<(?:list|int|float|str|bool|path|choice)\b[^>]*>|\b(?:int|float) range\b")


def _help(*command) -> str:
    proc = run_distify(*command, "--help")
    assert proc.returncode == EXIT_OK and proc.stderr == b"", proc.stderr
    return proc.stdout.decode()


def _option_help(text: str) -> dict:
    """``--flag`` -> its help text (wrapped lines joined), from a help page's Options section."""
    options, current = {}, None
    for line in text.split("\nOptions:\n", 1)[1].splitlines():
        m = re.match(r"  ((?:-\w, )?--[\w-]+)(?: (\S+))?(?:\s{2,}(.*))?$", line)
        if m:
            current = m.group(1).split(", ")[-1]
            options[current] = {"names": m.group(1), "value": m.group(2), "help": m.group(3) or ""}
        elif current and line.startswith("   "):
            options[current]["help"] = (options[current]["help"] + " " + line.strip()).strip()
    return options


def test_help_names_every_subcommand_and_each_answers_its_own_help():
    from distify.runner import SUBCOMMANDS

    top = _help()
    commands = top.split("Commands", 1)[1].split("\nOptions:", 1)[0]
    for name, (_, args, line) in SUBCOMMANDS.items():
        assert re.search(rf"^  +distify {name} {re.escape(args)} +{re.escape(line)}$", commands, re.M), name
        assert _help(name).startswith(f"Usage: distify {name} ")
    assert re.search(r"^  +distify PATH\.\.\. +\S", commands, re.M), "the default command (a migration) is listed too"


def test_help_shows_choices_and_value_names_not_type_names():
    from distify.options import BACKENDS
    from distify.runner import SUBCOMMANDS

    for command in [(), *((name,) for name in SUBCOMMANDS)]:
        text = _help(*command)
        assert not RAW_TYPE.search(text), (command, RAW_TYPE.search(text).group(0))
        assert _option_help(text)["--backend"]["value"] == "[" + "|".join(BACKENDS) + "]", command


def test_shared_options_read_alike_in_every_command():
    """--backend, --select, --ignore and --json are one definition (distify.flags) in every command;
    -q and -v in each command that reports per file (the migration and lint)."""
    pages = {name: _option_help(_help(*([name] if name else []))) for name in ("", "lint", "verify")}
    for flag in ("--select", "--ignore", "--json"):
        assert len({repr(page[flag]) for page in pages.values()}) == 1, flag
    backends = {(page["--backend"]["names"], page["--backend"]["value"], page["--backend"]["help"].split(" else ")[0])
                for page in pages.values()}
    assert len(backends) == 1, backends
    for flag in ("--quiet", "--verbose"):
        assert pages[""][flag] == pages["lint"][flag], flag


def test_words_that_are_no_subcommand_are_paths(cli, tmp_path, monkeypatch):
    """Only the registered subcommands are words of the grammar: `distify check` migrates a file
    named check (here: none, an input error), as it would any other path."""
    from distify.runner import SUBCOMMANDS, parse_fast

    monkeypatch.chdir(tmp_path)
    for word in ("run", "check", "help", "migrate"):
        assert word not in SUBCOMMANDS
        assert parse_fast([word]) == {"paths": [word]}
        result = cli(word)
        assert result.exit_code == EXIT_INPUT and error_lines(result.stderr, word), result.stderr
    for word in SUBCOMMANDS:
        assert parse_fast([word, "x.py"]) is None


def _lint(capsys, *args):
    from distify.lint import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _lint_case(tmp_path):
    """A hand-written Horovod script that forgets set_epoch (DST952), and one that does not parse."""
    source = (Path(__file__).parent / "lint_scripts" / "horovod_mnist.py").read_text()
    broken = source.replace("    train_sampler.set_epoch(epoch)\n", "")
    assert broken != source
    (tmp_path / "found.py").write_text(broken)
    (tmp_path / "bad.py").write_text("import torch\ndef f(:\n")
    return tmp_path / "found.py", tmp_path / "bad.py"


def test_lint_quiet_and_verbose_mean_what_they_mean_for_a_migration(capsys, tmp_path):
    found, bad = _lint_case(tmp_path)
    code, out, err = _lint(capsys, "-q", found, bad)
    assert code == EXIT_INPUT
    assert out == "" and error_lines(err, bad) and "DST952" not in err  # errors only
    clean = tmp_path / "clean.py"
    clean.write_text((Path(__file__).parent / "lint_scripts" / "horovod_mnist.py").read_text())
    code, out, err = _lint(capsys, "-v", clean, found)
    assert code == 1 and "DST952" in out
    assert f"clean {clean}" in err and f"clean {found}" not in err
    assert f"clean {clean}" not in _lint(capsys, clean)[2]


def test_lint_honours_tool_distify_and_the_command_line_wins(capsys, tmp_path):
    found, bad = _lint_case(tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    assert _lint(capsys, found)[0] == 1
    pyproject.write_text('[tool.distify]\nignore = ["DST952"]\nexclude = ["bad.py"]\n')
    code, out, err = _lint(capsys, tmp_path)
    assert (code, out, err) == (EXIT_OK, "", ""), err  # DST952 ignored, bad.py excluded from the walk
    code, out, _ = _lint(capsys, "--ignore", "DST0", found)
    assert code == 1 and "DST952" in out  # the flag replaces the config's list
    pyproject.write_text('[tool.distify]\nselect = ["DST95"]\nbackend = "ddp"\n')
    code, out, _ = _lint(capsys, found)
    assert code == 1 and "DST952" in out and "DST003" not in out  # DST003 is not selected
    code, out, _ = _lint(capsys, "--select", "DST003", found)
    assert code == 1 and re.fullmatch(rf"{re.escape(str(found))}:1:1: DST003 the script is distributed with horovod, "
                                      r"but the backend is ddp .*\n", out), out
    assert _lint(capsys, "--select", "DST003", "-b", "horovod", found)[0] == EXIT_OK
    pyproject.write_text('[tool.distify]\nbackend = "tpu"\n')
    code, _, err = _lint(capsys, found)
    assert code == EXIT_INPUT and "unknown backend 'tpu'" in err
    pyproject.write_text('[tool.distify]\nbakend = "ddp"\n')
    assert _lint(capsys, found)[0] == EXIT_INPUT


def test_json_report_of_a_migration_and_of_lint(cli, capsys, tmp_path, train_py, infer_py):
    import json

    (tmp_path / "bad.py").write_text("import torch\ndef f(:\n")
    result = cli("--check", "--json", tmp_path)
    assert result.exit_code == EXIT_INPUT
    report = json.loads(result.stdout)
    assert report["exit_code"] == EXIT_INPUT
    files = {Path(f["path"]).name: f for f in report["files"]}
    assert {name: f["status"] for name, f in files.items()} == {"bad.py": "error", "infer.py": "unchanged", "train.py": "changed"}
    assert "syntax error" in files["bad.py"]["message"]
    assert any(f["code"] == "DST201" and f["kind"] == "fix" and f["line"] > 0 for f in files["train.py"]["findings"])
    for other in (["--diff"], ["-"]):
        refused = cli("--json", *other, *([] if other == ["-"] else [train_py]), input=b"")
        assert refused.exit_code == EXIT_INPUT and "--json" in refused.stderr and refused.stdout == ""

    found, bad = _lint_case(tmp_path)
    code, out, err = _lint(capsys, "--json", found, bad)
    report = json.loads(out)
    assert code == report["exit_code"] == EXIT_INPUT
    files = {Path(f["path"]).name: f for f in report["files"]}
    assert files["bad.py"]["status"] == "error"
    assert [(f["code"], f["kind"]) for f in files["found.py"]["findings"]] == [("DST952", "warning")]


def test_verify_migrates_its_copy_as_distify_would(tmp_path, monkeypatch):
    """verify's copy is migrated with the options `distify` would use: the same flags, the same
    [tool.distify] (here: the backend and --scale-lr), the same errors for a bad backend."""
    from distify import verify

    plans = []
    monkeypatch.setattr(verify, "verify", lambda plan: plans.append(plan) or {"verdict": verify.OK, "checks": [], "runs": []})
    monkeypatch.setattr(verify, "render_text", lambda report: "")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch\n")
    (tmp_path / "pyproject.toml").write_text('[tool.distify]\nbackend = "horovod"\nscale-lr = true\nselect = ["DST2"]\n')
    assert verify.main(["train.py", "--", "--epochs", "1"]) == EXIT_OK
    options = plans[-1].options
    assert (plans[-1].backend, options.backend, options.scale_lr, options.select) == ("horovod", "horovod", True, ("DST2",))
    assert plans[-1].script_args == ["--epochs", "1"]
    assert verify.main(["-b", "ddp", "--ignore", "DST3", "train.py"]) == EXIT_OK
    assert (plans[-1].options.backend, plans[-1].options.ignore) == ("ddp", ("DST3",))
    assert verify.main(["--backend", "tpu", "train.py"]) == EXIT_INPUT
    assert len(plans) == 2


def test_unknown_backend_exits_2(cli, train_py):
    before = train_py.read_bytes()
    result = cli("--backend", "tpu", train_py)
    assert result.exit_code == EXIT_INPUT
    assert "unknown backend 'tpu'" in result.stderr
    assert train_py.read_bytes() == before


def test_no_path_exits_2(cli):
    result = cli()
    assert result.exit_code == EXIT_INPUT
    assert result.stderr.startswith("distify: error: no path given")


def test_unknown_option_exits_2(cli, train_py):
    before = train_py.read_bytes()
    assert cli("--frobnicate", train_py).exit_code == EXIT_INPUT
    assert train_py.read_bytes() == before


def test_list_rules_and_explain(cli):
    rules = cli("--list-rules")
    assert rules.exit_code == EXIT_OK
    assert "DST201" in rules.stdout
    explain = cli("--explain", "dst201")
    assert explain.exit_code == EXIT_OK and "DistributedSampler" in explain.stdout
    assert cli("--explain", "DST999").exit_code == EXIT_INPUT


# --- rules: --strict, --select, --ignore, [tool.distify] ----------------------------------

def _with_custom_sampler(path: Path) -> Path:
    """A sampler chosen by an expression: DST901 cannot tell which it is and warns (a plain one it shares out)."""
    text = path.read_text()
    new = text.replace("shuffle=False)", "sampler=torch.utils.data.RandomSampler(dataset) if len(dataset) else None)", 1)
    assert new != text
    path.write_text(new)
    return path


def test_strict_exits_2_on_a_warning(cli, train_py):
    _with_custom_sampler(train_py)
    lenient = cli("--check", train_py)
    assert lenient.exit_code == EXIT_CHANGED
    strict = cli("--check", "--strict", train_py)
    assert strict.exit_code == EXIT_INPUT
    warnings = [m for m in map(FINDING.match, strict.stderr.splitlines()) if m and m["code"] == "DST901"]
    assert len(warnings) == 1 and warnings[0]["path"] == str(train_py)
    assert cli("--check", "--strict", "--ignore", "DST901", train_py).exit_code == EXIT_CHANGED


def test_strict_without_warnings_keeps_exit_codes(cli, train_py, infer_py):
    assert cli("--strict", "--check", train_py).exit_code == EXIT_CHANGED
    assert cli("--strict", infer_py).exit_code == EXIT_OK


def test_select_prefix(cli, train_py):
    result = cli("--select", "DST2", train_py)
    assert result.exit_code == EXIT_CHANGED, result.stderr
    text = train_py.read_text()
    assert "DistributedSampler(" in text and "set_epoch(" in text
    assert "init_process_group" not in text
    assert "DDP(" not in text and "is_main_process" not in text
    codes = {m["code"] for m in map(FINDING.match, result.stderr.splitlines()) if m}
    assert codes and all(c.startswith("DST2") for c in codes), codes


def test_ignore_prefix_comma_separated(cli, train_py):
    result = cli("--ignore", "DST30,DST201", train_py)
    assert result.exit_code == EXIT_CHANGED
    text = train_py.read_text()
    assert "is_main_process" not in text and "DistributedSampler" not in text
    assert "init_process_group" in text


def test_pyproject_config_is_honoured_and_cli_overrides(cli, tmp_path, train_py):
    (tmp_path / "pyproject.toml").write_text('[tool.distify]\nbackend = "ddp"\nignore = ["DST30"]\n')
    src = train_py.read_bytes()
    result = cli(train_py)
    assert result.exit_code == EXIT_CHANGED, result.stderr
    text = train_py.read_text()
    assert "DistributedSampler(" in text and "init_process_group" in text
    assert "is_main_process" not in text  # print and save stay unguarded: DST30x ignored

    train_py.write_bytes(src)
    override = cli("--ignore", "DST201", train_py)
    assert override.exit_code == EXIT_CHANGED
    text = train_py.read_text()
    assert "is_main_process()" in text  # the command line replaces the config's ignore list
    assert "DistributedSampler" not in text


def test_pyproject_backend(cli, tmp_path, train_py):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.distify]\nbackend = "horovod"\n')
    assert cli("--diff", train_py).stdout_bytes.count(b"+import horovod.torch as hvd") == 1
    assert b"hvd." not in cli("--diff", "--backend", "ddp", train_py).stdout_bytes
    pyproject.write_text('[tool.distify]\nbackend = "tpu"\n')
    assert cli(train_py).exit_code == EXIT_INPUT
    pyproject.write_text('[tool.distify]\nbakend = "ddp"\n')
    bad_key = cli(train_py)
    assert bad_key.exit_code == EXIT_INPUT and "bakend" in bad_key.stderr


# --- colours, import weight -----------------------------------------------------------------

def test_no_ansi_codes_when_piped(tmp_path, train_py):
    _with_custom_sampler(train_py)  # a warning line too
    (tmp_path / "bad.py").write_text("import torch\ndef f(:\n")
    env = dict(os.environ, FORCE_COLOR="1", TERM="xterm-256color", CLICOLOR_FORCE="1")
    env.pop("NO_COLOR", None)
    proc = run_distify("--diff", tmp_path, env=env)
    assert proc.returncode == EXIT_INPUT
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert out.startswith("--- ") and "DST901" in err and "bad.py: error: " in err
    assert ANSI not in out and ANSI not in err


def _imported_modules(stderr: bytes) -> set:
    mods = set()
    for line in stderr.decode(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                mods.add(name)
    return mods


def _from(mods: set, package: str) -> set:
    return {m for m in mods if m == package or m.startswith(package + ".")}


def test_cli_does_not_import_torch():
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "distify", "--help"], capture_output=True, timeout=120
    )
    assert proc.returncode == EXIT_OK
    mods = _imported_modules(proc.stderr)
    assert "distify.cli" in mods, "importtime output not understood"
    assert not _from(mods, "torch")


def test_runtime_does_not_import_the_migration_tool():
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import distify.runtime"], capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    mods = _imported_modules(proc.stderr)
    assert "distify.runtime" in mods
    for heavy in ("libcst", "typer", "rich", "click"):
        assert not _from(mods, heavy), heavy


def test_one_file_check_imports_only_what_it_uses(tmp_path):
    """A cold ``--check`` of one migrated script (the pre-commit case, empty cache) parses and
    audits it, and imports nothing it does not use: no writer of the --standalone class, no
    backend conversion, no program model, project view nor reader of the modules next to it (the
    script calls into no other module), no rule of another backend, no hashlib (OpenSSL: the cache's digests
    use CPython's own sha256), no typer, rich or torch. Nor does any module it loads define a
    dataclass: ``@dataclass`` compiles each generated method with ``exec`` (1.5-4 M instructions a
    class, a tenth of the run for the 36 such classes this path had); ``distify.values`` says how
    the run's classes are written instead."""
    script = tmp_path / "train.py"
    script.write_bytes((Path(__file__).resolve().parent.parent / "fixtures" / "DST101" / "dropped_label.ddp.py").read_bytes())
    code = ("import sys; from distify.runner import execute; code = execute([sys.argv[1]], check=True); "
            "built = [f'{m}.{n}' for m, mod in list(sys.modules.items()) if m.startswith('distify') "
            "for n, c in vars(mod).items() if isinstance(c, type) and c.__module__ == m "
            "and '__dataclass_fields__' in vars(c)]; "
            "print(code, ' '.join(sorted(sys.modules))); print(' '.join(built))")
    env = {**os.environ, "DISTIFY_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", code, str(script)], capture_output=True, text=True, env=env, timeout=120)
    loaded, built = (proc.stdout.splitlines() + ["", ""])[:2]
    status, *mods = loaded.split()
    assert status == "0", proc.stdout + proc.stderr
    assert not built.split(), f"dataclasses on the cold path: {built}"
    mods = set(mods)
    assert {"libcst", "distify.anatomy", "distify.rules.dst951_unsharded_loader"} <= mods  # parsed and audited
    unused = {"distify.standalone", "distify.inline_helpers", "distify.convert", "distify.project_view",
              "distify.siblings", "distify.program", "distify.cli", "distify.lint", "distify.verify", "hashlib",
              "distify.rules.dst121_fully_shard", "distify.rules.dst111_distributed_optimizer"}
    assert not unused & mods, sorted(unused & mods)
    assert not {m for m in mods if m.split(".")[0] in ("typer", "rich", "click", "pydantic", "torch")}
