"""The ``distify`` command.

    distify train.py --backend ddp          rewrite in place, summary on stderr
    distify train.py --diff                 show the change, write nothing (exit 0: a preview)
    distify src/ --check                    exit 1 if any file would change, write nothing
    distify - < train.py                    stdin -> stdout
    distify --launch train.py --nproc 4 --nodes h1,h2   print torchrun/horovodrun/srun/Kubeflow commands
    distify lint train.py                   audit a distributed script, rewrite nothing (exit 1 on findings)
    distify verify train.py -- ARGS         migrate a copy, run it on CPU, check what each rank did

The subcommands are listed once, in ``distify.runner.SUBCOMMANDS``; the options they share are
defined once, in ``distify.flags``.

Exit codes (black/pyupgrade): 0 nothing to change, 1 changed (or would change, with --check), 2
usage or input error, 3 a script refused (not migrated: a partial migration would train wrong), 123
internal failure. Like black's, a --diff preview without --check exits 0
when it shows changes: it only answers "what would change?", and the README's first command is one.
Nothing here imports torch.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import typer

from distify import __version__, flags
from distify.runner import (  # noqa: F401 - the run itself lives in distify.runner (no typer on a plain run)
    EXIT_CHANGED, EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, SUBCOMMANDS, _launch_plan, _process_all, _run_paths, _run_stdin, _split,
    execute, guarded,
)

app = typer.Typer(add_completion=False, rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]})


def _version(value: bool) -> None:
    if value:
        typer.echo(f"distify {__version__}")
        raise typer.Exit(EXIT_OK)


def _help() -> str:
    """The migration's help, with one line per command (from ``distify.runner.SUBCOMMANDS``)."""
    usages = [("distify PATH...", "rewrite the scripts in place (the default)")]
    usages += [(f"distify {name} {args}", line) for name, (_, args, line) in SUBCOMMANDS.items()]
    width = max(len(u) for u, _ in usages)
    lines = "\n".join(f"  {u:<{width}}  {line}" for u, line in usages)
    return ("Rewrite single-GPU PyTorch training scripts for DDP, FSDP2 or Horovod. PATH: files or directories "
            "(walked for *.py); '-' reads stdin and writes stdout.\n\n"
            f"Commands (each has its own --help):\n\n\b\n{lines}")


@app.command(help=_help())
def run(
    paths: Optional[List[str]] = typer.Argument(None, metavar="PATH", hidden=True),
    backend: Optional[str] = flags.backend("ddp"),
    diff: bool = typer.Option(False, "--diff", help="Show a unified diff; write nothing."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if any file would change."),
    select: Optional[List[str]] = flags.select(),
    ignore: Optional[List[str]] = flags.ignore(),
    strict: bool = typer.Option(False, "--strict", help="Exit 2 when any warning is reported."),
    scale_lr: Optional[bool] = typer.Option(None, "--scale-lr", help="Scale the learning rate by the number of processes."),
    fp16_allreduce: Optional[bool] = typer.Option(None, "--fp16-allreduce", help="All-reduce gradients in float16."),
    adasum: Optional[bool] = typer.Option(None, "--adasum", help="Horovod: combine gradients with Adasum."),
    seed_per_rank: Optional[bool] = typer.Option(None, "--seed-per-rank", help="Re-seed each rank (seed + rank) once the models are built."),
    bf16: Optional[bool] = typer.Option(None, "--bf16", help="FSDP: bfloat16 parameters, float32 gradient reduction (MixedPrecisionPolicy)."),
    standalone: Optional[bool] = typer.Option(None, "--standalone", help="Write the few runtime helpers into the script (plain PyTorch) instead of importing distify."),
    max_size: float = typer.Option(2.0, "--max-size", metavar="MIB", help="Skip files larger than this many MiB (exit 2).", min=0.001),
    quiet: bool = flags.quiet(),
    verbose: bool = flags.verbose(),
    as_json: bool = flags.as_json(),
    list_rules: bool = typer.Option(False, "--list-rules", help="List the rules and exit."),
    explain: Optional[str] = typer.Option(None, "--explain", metavar="CODE", help="Explain a rule code (e.g. DST201) and exit."),
    launch: bool = typer.Option(False, "--launch", help="Print the commands that run the script (torchrun, horovodrun, srun, Kubeflow) and exit; rewrites nothing. Arguments after '--' are passed to the script."),
    nproc: Optional[int] = typer.Option(None, "--nproc", metavar="N", min=1, help="Processes (GPUs) per node for the launch commands (default: the GPUs visible here, else 1)."),
    nodes: Optional[List[str]] = typer.Option(None, "--nodes", metavar="HOSTS", help="Hosts for the launch commands, comma-separated; the first one hosts the rendezvous."),
    port: Optional[int] = typer.Option(None, "--port", metavar="PORT", min=1, max=65535, help="Rendezvous port for the launch commands (default 29500)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Parse every file, even one an earlier run found clean (see README: cache)."),
) -> None:
    raise typer.Exit(execute(**locals()))


def _launch(paths: List[str], backend: str, nproc, nodes, port, reporter) -> int:
    """``--launch SCRIPT [-- ARGS]``: print how to start SCRIPT with every launcher; write nothing."""
    from distify.launch import LaunchError, render

    script, script_args = paths[0], paths[1:]
    if script == "-" or not os.path.isfile(script):
        reporter.error(script, "--launch needs the path of a script (arguments for it go after '--')")
        return EXIT_INPUT
    try:
        plan = _launch_plan(script, script_args, backend, nproc, nodes, port)
    except LaunchError as e:
        reporter.error("distify", str(e))
        return EXIT_INPUT
    typer.echo(render(plan), nl=False)
    return EXIT_OK


def _rules_info(code: Optional[str]) -> int:
    import inspect

    from distify.rules import BY_CODE

    if code:
        rule = BY_CODE.get(code.upper())
        if rule is None:
            typer.echo(f"distify: error: unknown rule {code!r} (see distify --list-rules)", err=True)
            return EXIT_INPUT
        typer.echo(f"{rule.code} {rule.name} ({', '.join(sorted(rule.backends))})\n")
        typer.echo(inspect.cleandoc(type(rule).__doc__ or ""))
        return EXIT_OK
    for rule in sorted(BY_CODE.values(), key=lambda r: r.code):
        typer.echo(f"{rule.code}  {rule.name:<22} {', '.join(sorted(rule.backends)):<12} {rule.summary}")
    return EXIT_OK


def main() -> None:
    """typer's entry point (``distify.runner.main`` hands it every run that is not a plain one)."""
    if sys.argv[1:2] and sys.argv[1] in SUBCOMMANDS:
        import importlib

        command = importlib.import_module(SUBCOMMANDS[sys.argv[1]][0])
        guarded(lambda: command.main(sys.argv[2:]))
    guarded(lambda: app(prog_name="distify"))


if __name__ == "__main__":
    main()
