"""The ``distify`` command.

    distify train.py --backend ddp          rewrite in place, summary on stderr
    distify train.py --diff                 show the change, write nothing
    distify src/ --check                    exit 1 if any file would change, write nothing
    distify - < train.py                    stdin -> stdout
    distify --launch train.py --nproc 4 --nodes h1,h2   print torchrun/horovodrun/srun/Kubeflow commands

Exit codes (black/pyupgrade): 0 nothing to change, 1 changed or would change, 2 usage or input
error, 123 internal failure. Nothing here imports torch.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import typer

from distify import __version__
from distify.options import BACKENDS, Options

EXIT_OK, EXIT_CHANGED, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 123

app = typer.Typer(add_completion=False, rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]})


def _version(value: bool) -> None:
    if value:
        typer.echo(f"distify {__version__}")
        raise typer.Exit(EXIT_OK)


def _split(values: Optional[List[str]]) -> List[str]:
    out: List[str] = []
    for v in values or []:
        out += [p.strip() for p in v.split(",") if p.strip()]
    return out


@app.command(help="Rewrite single-GPU PyTorch training scripts for DDP or Horovod.")
def run(
    paths: Optional[List[str]] = typer.Argument(None, help="Files or directories to migrate; '-' reads stdin."),
    backend: Optional[str] = typer.Option(None, "--backend", "-b", help="ddp (default) or horovod."),
    diff: bool = typer.Option(False, "--diff", help="Show a unified diff; write nothing."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if any file would change."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Only rules whose code starts with these prefixes (comma-separated)."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Skip rules whose code starts with these prefixes (comma-separated)."),
    strict: bool = typer.Option(False, "--strict", help="Exit 2 when any warning is reported."),
    scale_lr: Optional[bool] = typer.Option(None, "--scale-lr", help="Scale the learning rate by the number of processes."),
    fp16_allreduce: Optional[bool] = typer.Option(None, "--fp16-allreduce", help="All-reduce gradients in float16."),
    adasum: Optional[bool] = typer.Option(None, "--adasum", help="Horovod: combine gradients with Adasum."),
    seed_per_rank: Optional[bool] = typer.Option(None, "--seed-per-rank", help="Re-seed each rank (seed + rank) once the models are built."),
    standalone: Optional[bool] = typer.Option(None, "--standalone", help="Write the few runtime helpers into the script (plain PyTorch) instead of importing distify."),
    max_size: float = typer.Option(2.0, "--max-size", help="Skip files larger than this many MiB (exit 2).", min=0.001),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Report errors only."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also report unchanged files and why."),
    list_rules: bool = typer.Option(False, "--list-rules", help="List the rules and exit."),
    explain: Optional[str] = typer.Option(None, "--explain", help="Explain a rule code (e.g. DST201) and exit."),
    launch: bool = typer.Option(False, "--launch", help="Print the commands that run the script (torchrun, horovodrun, srun, Kubeflow) and exit; rewrites nothing. Arguments after '--' are passed to the script."),
    nproc: Optional[int] = typer.Option(None, "--nproc", min=1, help="Processes (GPUs) per node for the launch commands (default: the GPUs visible here, else 1)."),
    nodes: Optional[List[str]] = typer.Option(None, "--nodes", help="Hosts for the launch commands, comma-separated; the first one hosts the rendezvous."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="Rendezvous port for the launch commands (default 29500)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    from distify import config
    from distify.report import Reporter

    reporter = Reporter(quiet=quiet, verbose=verbose)

    if list_rules or explain:
        raise typer.Exit(_rules_info(explain))

    if not paths:
        reporter.error("distify", "no path given (try 'distify --help')")
        raise typer.Exit(EXIT_INPUT)

    try:
        cfg = config.load(paths)
    except config.ConfigError as e:
        reporter.error("distify", str(e))
        raise typer.Exit(EXIT_INPUT)
    backend = (backend or cfg.get("backend") or "ddp").lower()
    if backend not in BACKENDS:
        reporter.error("distify", f"unknown backend {backend!r}: choose ddp or horovod")
        raise typer.Exit(EXIT_INPUT)
    launch_defaults = (nproc if nproc is not None else cfg.get("nproc"), _split(nodes) or _as_list(cfg.get("nodes")),
                       port if port is not None else cfg.get("port"))
    if launch:
        raise typer.Exit(_launch(paths, backend, *launch_defaults, reporter))
    options = Options(
        backend=backend,
        select=tuple(_split(select) or _as_list(cfg.get("select"))),
        ignore=tuple(_split(ignore) or _as_list(cfg.get("ignore"))),
        scale_lr=bool(scale_lr if scale_lr is not None else cfg.get("scale_lr", False)),
        fp16_allreduce=bool(fp16_allreduce if fp16_allreduce is not None else cfg.get("fp16_allreduce", False)),
        adasum=bool(adasum if adasum is not None else cfg.get("adasum", False)),
        seed_per_rank=bool(seed_per_rank if seed_per_rank is not None else cfg.get("seed_per_rank", False)),
        standalone=bool(standalone if standalone is not None else cfg.get("standalone", False)),
        max_bytes=int(max_size * 2**20),
        positions=not quiet or strict,
    )
    if options.adasum and backend != "horovod":
        reporter.error("distify", "--adasum is a Horovod feature: use it with --backend horovod")
        raise typer.Exit(EXIT_INPUT)
    from distify.engine import Mode

    mode = Mode.CHECK if check and not diff else Mode.DIFF if diff else Mode.WRITE
    if "-" in paths:
        if len(paths) != 1:
            reporter.error("distify", "'-' (stdin) cannot be combined with other paths")
            raise typer.Exit(EXIT_INPUT)
        raise typer.Exit(_run_stdin(options, mode, check, reporter, strict))
    raise typer.Exit(_run_paths(paths, options, mode, check, reporter, strict, _as_list(cfg.get("exclude")), hint=launch_defaults))


def _as_list(value) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return _split([value])
    return [str(v) for v in value]


def _run_stdin(options: Options, mode, check: bool, reporter, strict: bool) -> int:
    from distify.engine import FileResult, InputError, Status, migrate_source

    source = sys.stdin.buffer.read()
    if len(source) > options.max_bytes:
        reporter.error("<stdin>", f"input is over the {options.max_bytes / 2**20:g} MiB limit (raise it with --max-size)")
        return EXIT_INPUT
    try:
        result = migrate_source(source, options)
    except InputError as e:
        reporter.error("<stdin>", str(e))
        return EXIT_INPUT
    except Exception as e:  # noqa: BLE001
        reporter.error("<stdin>", f"internal error: {type(e).__name__}: {e}")
        return EXIT_INTERNAL
    status = Status.CHANGED if result.changed else Status.UNCHANGED
    fr = FileResult("<stdin>", status, result.findings, result.note, source, result.output, result.encoding)
    if mode.name == "DIFF":
        reporter.diff(fr)
    elif not check:
        sys.stdout.buffer.write(result.output)
        sys.stdout.buffer.flush()
    reporter.file(fr, "would rewrite" if check or mode.name == "DIFF" else "rewrote")
    if strict and any(f.kind == "warning" for f in result.findings):
        return EXIT_INPUT
    return EXIT_CHANGED if result.changed else EXIT_OK


def _run_paths(paths, options: Options, mode, check: bool, reporter, strict: bool, exclude, hint=None) -> int:
    from distify.engine import FileResult, Status, iter_python_files, process_file

    results: List[FileResult] = []
    todo: List[str] = []
    for path, problem in iter_python_files(paths, exclude):
        if problem:
            results.append(FileResult(path, Status.ERROR, message=problem))
        else:
            todo.append(path)
    with reporter.progress(len(todo)) as progress:
        results += _process_all(todo, mode, options, progress.advance)

    word = "would rewrite" if mode.name in ("CHECK", "DIFF") else "rewrote"
    changed = unchanged = errors = 0
    for r in results:
        if r.status is Status.CHANGED and mode.name == "DIFF":
            reporter.diff(r)
        reporter.file(r, word)
        if r.status is Status.CHANGED:
            changed += 1
        elif r.status in (Status.ERROR, Status.FAILED):
            errors += 1
        else:
            unchanged += 1
    if len(results) > 1:
        reporter.table(results, word)
        reporter.summary(changed, unchanged, errors, word)
    if hint is not None and mode.name == "WRITE" and not reporter.quiet and len(results) == 1 and changed == 1:
        _run_hint(results[0].path, options.backend, *hint, reporter)

    if any(r.status is Status.FAILED for r in results):
        return EXIT_INTERNAL
    if errors:
        return EXIT_INPUT
    if strict and any(f.kind == "warning" for r in results for f in r.findings):
        return EXIT_INPUT
    return EXIT_CHANGED if changed else EXIT_OK


def _process_all(files: List[str], mode, options: Options, advance=lambda: None):
    """Results in input order; ``advance`` is called once per finished file (for the progress bar)."""
    from distify.engine import process_file

    results = []
    workers = min(len(files), os.cpu_count() or 1)
    if workers <= 1 or len(files) < 8:
        for f in files:
            results.append(process_file(f, mode, options))
            advance()
        return results
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        for result in pool.map(process_file, files, [mode] * len(files), [options] * len(files), chunksize=4):
            results.append(result)
            advance()
    return results


def _launch_plan(script: str, script_args, backend: str, nproc, nodes, port):
    """A LaunchPlan from flags/config; raises distify.launch.LaunchError on bad values."""
    from distify.launch import LaunchError, LaunchPlan, detect_gpus, parse_nodes

    if nproc is None:
        nproc = detect_gpus() or 1
    for name, value in (("nproc", nproc), ("port", port)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise LaunchError(f"{name} must be an integer, not {value!r}")
    return LaunchPlan(script, backend, nproc, parse_nodes(nodes), port, tuple(script_args))


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


def _run_hint(path: str, backend: str, nproc, nodes, port, reporter) -> None:
    """After rewriting exactly one script: the command that runs it on this machine."""
    import shlex

    from distify.launch import LaunchError, run_hint

    try:
        plan = _launch_plan(path, (), backend, nproc, (), port)
    except LaunchError:
        return  # bad launch settings: --launch reports them; a rewrite does not fail over a hint
    more = f"distify --launch {shlex.quote(path)} --nproc {plan.nproc} --nodes HOST1,HOST2"
    reporter.err.write(f"Run it with: {run_hint(plan)}\n  (several nodes, horovodrun, SLURM, Kubeflow: {more})\n")


def _rules_info(code: Optional[str]) -> int:
    import inspect

    from distify.rules import ALL_RULES, BY_CODE

    if code:
        rule = BY_CODE.get(code.upper())
        if rule is None:
            typer.echo(f"distify: error: unknown rule {code!r} (see distify --list-rules)", err=True)
            return EXIT_INPUT
        typer.echo(f"{rule.code} {rule.name} ({', '.join(sorted(rule.backends))})\n")
        typer.echo(inspect.cleandoc(type(rule).__doc__ or ""))
        return EXIT_OK
    for rule in sorted(ALL_RULES, key=lambda r: r.code):
        typer.echo(f"{rule.code}  {rule.name:<22} {', '.join(sorted(rule.backends)):<12} {rule.summary}")
    return EXIT_OK


def main() -> None:
    try:
        app(prog_name="distify")
    except SystemExit as e:
        _fast_exit(e.code)
    except KeyboardInterrupt:
        sys.stderr.write("distify: interrupted\n")
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - last resort: never a bare traceback
        sys.stderr.write(f"distify: internal error: {type(e).__name__}: {e}\n")
        sys.exit(EXIT_INTERNAL)


def _fast_exit(code) -> None:
    """End the process without tearing the interpreter down.

    Freeing libcst's trees and then every imported module (libcst, typer, pydantic) one object at a
    time takes 60-100 ms, as long as migrating a 300-line script. Nothing needs that teardown here:
    files are written and closed, the worker pool is shut down, and the output is flushed below.
    The exit status follows ``SystemExit``'s rules. Used by the console entry point only (tests
    call ``app`` in-process and are not affected)."""
    if code is None:
        status = EXIT_OK
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed, status 1
        sys.stderr.write(f"{code}\n")
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (distify --diff | head): nothing left to say
            pass
    os._exit(status)


if __name__ == "__main__":
    main()
