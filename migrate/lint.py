"""``distify lint PATH...``: the output audit on scripts that are already distributed.

Hand-written DDP, Horovod or FSDP scripts (or distify's own output, edited since) are analysed with the
same anatomy the migration uses and checked against the invariants of a correct data-parallel
script (the DST95x audit checks, plus the rules that also check distributed code, such as
DST911). Nothing is rewritten. Findings go to stdout as ``path:line:col: CODE message``; the exit
status is 0 when clean, 1 when something was found, 2 for an input error (no path, unreadable
file, syntax error), 123 for an internal failure – so it works in pre-commit and CI.
"""

from __future__ import annotations

import sys
from typing import List, Optional, Sequence, Tuple

import typer

from distify import flags
from distify.options import Options

EXIT_OK, EXIT_FOUND, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 123

lint_app = typer.Typer(add_completion=False, rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]})


def lint_source(source: bytes, select: Sequence[str] = (), ignore: Sequence[str] = (), backend: Optional[str] = None,
                path: Optional[str] = None) -> Tuple:
    """The warnings the audit finds in one script (raises engine.InputError for bad input). The checks
    read the backend from the script's own code; a ``backend`` the script is not written for (the
    project's, from ``--backend`` or ``[tool.distify]``) is reported as DST003, the conversion that
    ``distify --backend BACKEND`` makes. ``path``: the script's file, so that the checks follow its
    calls into the modules of its project as the migration does (a helper that saves or prints on
    every rank, a loader handed to a helper that trains on it)."""
    import libcst as cst

    from distify.anatomy import analyse
    from distify.engine import InputError, _check_syntax, _quick_skip, decode
    from distify.findings import Finding
    from distify.rules import selected
    from distify.rules.base import Context
    from distify.convert import CONVERT_CODE

    text, _ = decode(source)
    if _quick_skip(text):
        return ()
    _check_syntax(source)
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        raise InputError(f"syntax error at {e.raw_line}:{e.raw_column + 1}") from None
    anatomy = analyse(module)
    options = Options(backend=backend or anatomy.flavour or "ddp", select=tuple(select), ignore=tuple(ignore))
    ctx = Context(anatomy, options)
    ctx.plan.script_path = path
    rules = selected(options.backend, options.select, options.ignore)
    for rule in rules:
        if getattr(rule, "checks_distributed", False):
            rule.apply(ctx)
    found = [f for f in ctx.findings if f.kind == "warning"]
    if backend and anatomy.flavour not in (None, backend) and options.selects(CONVERT_CODE):
        found.append(Finding(CONVERT_CODE, 1, 1, f"the script is distributed with {anatomy.flavour}, but the backend is "
                                                 f"{backend} (--backend or [tool.distify]); converting it: distify --explain DST003",
                             "warning"))
    return tuple(sorted(found, key=lambda f: (f.line, f.col, f.code)))


@lint_app.command(help="Check distributed (DDP / Horovod / FSDP) training scripts for the mistakes that make them silently "
                       "wrong; rewrite nothing. PATH: files or directories (walked for *.py); '-' reads stdin.")
def lint(
    paths: Optional[List[str]] = typer.Argument(None, metavar="PATH", hidden=True),
    backend: Optional[str] = flags.backend("the backend each script's own code uses"),
    select: Optional[List[str]] = flags.select(),
    ignore: Optional[List[str]] = flags.ignore(),
    quiet: bool = flags.quiet(),
    verbose: bool = flags.verbose(),
    as_json: bool = flags.as_json(),
) -> None:
    from distify import config
    from distify.engine import InputError, iter_python_files
    from distify.runner import UsageError, as_list, codes, findings_json, resolve_backend, write_json

    def error(path: str, message: str, internal: bool = False) -> None:
        typer.echo(f"{path}: {'internal error' if internal else 'error'}: {message}", err=True)
        files.append({"path": path, "status": "failed" if internal else "error", "findings": [], "message": message})

    if not paths:
        typer.echo("distify lint: error: no path given", err=True)
        raise typer.Exit(EXIT_INPUT)
    try:
        cfg = config.load(paths)
        backend = resolve_backend(backend, cfg, default=None)
    except (config.ConfigError, UsageError) as e:
        typer.echo(f"distify lint: error: {e}", err=True)
        raise typer.Exit(EXIT_INPUT)
    sel, ign = codes(select, cfg, "select"), codes(ignore, cfg, "ignore")
    files: List[dict] = []
    found = errors = failed = 0
    walk = (("-", None),) if paths == ["-"] else iter_python_files(paths, as_list(cfg.get("exclude")))
    for path, problem in walk:
        if problem:
            error(path, problem)
            errors += 1
            continue
        try:
            if path == "-":
                source = sys.stdin.buffer.read()
                path = "<stdin>"
            else:
                with open(path, "rb") as f:
                    source = f.read()
            findings = lint_source(source, sel, ign, backend, path=None if path == "<stdin>" else path)
        except InputError as e:
            error(path, str(e))
            errors += 1
            continue
        except OSError as e:
            error(path, f"cannot read: {e.strerror or e}")
            errors += 1
            continue
        except Exception as e:  # noqa: BLE001 - reported, exit 123
            error(path, f"{type(e).__name__}: {e}", internal=True)
            failed += 1
            continue
        found += len(findings)
        files.append({"path": path, "status": "found" if findings else "clean", "findings": findings_json(findings)})
        if not quiet and not as_json:
            for f in findings:
                typer.echo(f.format(path))
        if verbose and not findings:
            typer.echo(f"clean {path}", err=True)
    code = EXIT_INTERNAL if failed else EXIT_INPUT if errors else EXIT_FOUND if found else EXIT_OK
    if as_json:
        write_json(files, code)
    raise typer.Exit(code)


def main(argv: Sequence[str]) -> int:
    """``distify lint ARGV...``; returns the exit status."""
    try:
        lint_app(args=list(argv), prog_name="distify lint")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_INPUT
    return EXIT_OK
