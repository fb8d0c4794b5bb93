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

from distify.options import Options

EXIT_OK, EXIT_FOUND, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 123

lint_app = typer.Typer(add_completion=False, rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]})


def lint_source(source: bytes, select: Sequence[str] = (), ignore: Sequence[str] = ()) -> Tuple:
    """The warnings the audit finds in one script (raises engine.InputError for bad input)."""
    import libcst as cst

    from distify.anatomy import analyse
    from distify.engine import InputError, _check_syntax, _quick_skip, decode
    from distify.rules import selected
    from distify.rules.base import Context

    text, _ = decode(source)
    if _quick_skip(text):
        return ()
    _check_syntax(source)
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        raise InputError(f"syntax error at {e.raw_line}:{e.raw_column + 1}") from None
    anatomy = analyse(module)
    options = Options(backend=anatomy.flavour or "ddp", select=tuple(select), ignore=tuple(ignore))
    ctx = Context(anatomy, options)
    for rule in selected(options.backend, options.select, options.ignore):
        if getattr(rule, "checks_distributed", False):
            rule.apply(ctx)
    return tuple(sorted((f for f in ctx.findings if f.kind == "warning"), key=lambda f: (f.line, f.col, f.code)))


@lint_app.command(help="Check distributed (DDP / Horovod / FSDP) training scripts for the mistakes that make them silently wrong; rewrites nothing.")
def lint(
    paths: Optional[List[str]] = typer.Argument(None, help="Files or directories; '-' reads stdin."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Only checks whose code starts with these prefixes."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Skip checks whose code starts with these prefixes."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; only the exit status tells."),
) -> None:
    from distify.cli import _split
    from distify.engine import InputError, iter_python_files

    if not paths:
        typer.echo("distify lint: error: no path given", err=True)
        raise typer.Exit(EXIT_INPUT)
    found = errors = failed = 0
    sel, ign = _split(select), _split(ignore)
    for path, problem in (("-", None),) if paths == ["-"] else iter_python_files(paths):
        if problem:
            typer.echo(f"{path}: error: {problem}", err=True)
            errors += 1
            continue
        try:
            if path == "-":
                source = sys.stdin.buffer.read()
                path = "<stdin>"
            else:
                with open(path, "rb") as f:
                    source = f.read()
            findings = lint_source(source, sel, ign)
        except InputError as e:
            typer.echo(f"{path}: error: {e}", err=True)
            errors += 1
            continue
        except OSError as e:
            typer.echo(f"{path}: error: cannot read: {e.strerror or e}", err=True)
            errors += 1
            continue
        except Exception as e:  # noqa: BLE001 - reported, exit 123
            typer.echo(f"{path}: internal error: {type(e).__name__}: {e}", err=True)
            failed += 1
            continue
        found += len(findings)
        if not quiet:
            for f in findings:
                typer.echo(f.format(path))
    if failed:
        raise typer.Exit(EXIT_INTERNAL)
    if errors:
        raise typer.Exit(EXIT_INPUT)
    raise typer.Exit(EXIT_FOUND if found else EXIT_OK)
