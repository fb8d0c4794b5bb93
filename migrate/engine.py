"""read → parse → analyse → rewrite → render → write.

The engine is the only place that applies edits and touches files. Per file it returns a small
frozen ``FileResult`` (unchanged / changed / refused / error / failed) that travels across processes.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import io
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, List, Optional, Sequence, Tuple

from distify.findings import Finding
from distify.options import DDP_BACKEND, FSDP_BACKEND, Options
from distify.values import Value

# libcst, the anatomy and the rules are imported where a file is parsed (``_migrate``): a run whose
# files all come from the cache (``distify.cache``) never loads them.
if TYPE_CHECKING:
    import libcst as cst

    from distify.rules.base import Context


class Mode(enum.Enum):
    WRITE = "write"  # rewrite in place
    DIFF = "diff"  # print a diff, write nothing
    CHECK = "check"  # write nothing, exit 1 if anything would change
    STDOUT = "stdout"  # stdin -> stdout


class Status(enum.Enum):
    UNCHANGED = "unchanged"
    CHANGED = "changed"
    REFUSED = "refused"  # a training script distify declined to rewrite (a rule blocked it): left as it was
    ERROR = "error"  # the input's fault: unreadable, undecodable, syntax error
    FAILED = "failed"  # distify's fault: internal error


class InputError(Exception):
    """A problem with the user's input; the message is one line, without the path."""


class MigrationResult(Value):
    """One script's migration: its bytes before and after, what was found, and why nothing changed."""

    __slots__ = ("source", "output", "findings", "note", "encoding", "refused", "others")
    source: bytes
    output: bytes
    findings: Tuple[Finding, ...]
    note: str  # why nothing changed, when nothing did
    encoding: str  # the source's encoding (BOM / coding cookie), for diffs
    refused: bool  # a rule refused the migration: the output is the source, the warnings say why
    # the other files of the project the migration rewrites (distify.project_view): (real path,
    # source, output, findings against that file's lines)
    others: Tuple[Tuple[str, bytes, bytes, Tuple[Finding, ...]], ...]

    def __init__(self, source: bytes, output: bytes, findings: Tuple[Finding, ...] = (), note: str = "",
                 encoding: str = "utf-8", refused: bool = False,
                 others: Tuple[Tuple[str, bytes, bytes, Tuple[Finding, ...]], ...] = ()) -> None:
        self._set(source, output, findings, note, encoding, refused, others)

    @property
    def changed(self) -> bool:
        return self.output != self.source


class FileResult(Value):
    """What became of one file of a run, small and picklable for the worker processes."""

    __slots__ = ("path", "status", "findings", "message", "source", "output", "encoding", "others", "pending")
    path: str
    status: Status
    findings: Tuple[Finding, ...]
    message: str
    source: bytes
    output: bytes
    encoding: str
    # the other files of the project this migration rewrites, or would (distify.project_view)
    others: Tuple["FileResult", ...]
    # changed, to be written once every file of the run is migrated (distify.project.write_all):
    # a migration that rewrites other files of the project writes none of them before
    pending: bool

    def __init__(self, path: str, status: Status, findings: Tuple[Finding, ...] = (), message: str = "",
                 source: bytes = b"", output: bytes = b"", encoding: str = "utf-8", others: Tuple["FileResult", ...] = (),
                 pending: bool = False) -> None:
        self._set(path, status, findings, message, source, output, encoding, others, pending)


def decode(source: bytes) -> Tuple[str, str]:
    """Text and encoding of Python source, honouring a BOM and a PEP 263 coding cookie."""
    import tokenize  # here, not at the top: a run answered by the cache decodes nothing

    if b"\x00" in source:
        raise InputError("binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    except SyntaxError as e:
        raise InputError(f"cannot decode: {e}") from None
    try:
        text = source.decode(encoding)
    except (UnicodeDecodeError, LookupError) as e:
        raise InputError(f"cannot decode as {encoding}: {e.reason if hasattr(e, 'reason') else e}") from None
    return text, encoding


def _quick_skip(text: str) -> bool:
    """Files that cannot hold a torch training script are not parsed at all."""
    return "torch" not in text


def migrate_source(source: bytes, options: Options, path: Optional[str] = None) -> MigrationResult:
    """Rewrite one script's bytes. Raises InputError for bad input. `path`, where the script is
    a file, lets rules read the project's modules next to it (see distify.siblings)."""
    with _collector_paused():
        try:
            return _migrate(source, options, path)
        except RecursionError:
            # libcst's visitors recurse per nesting level: code Python accepts can still be too deep
            raise InputError("cannot process: nested too deeply for distify (RecursionError)") from None


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while one script is migrated. A migration allocates a
    libcst tree and its facts, nearly all of which live until it returns, so every collection the
    allocations trigger scans tens of thousands of live objects and frees almost nothing (a tenth
    of the engine's time, full collections of the whole heap included). What little the migration
    leaves in cycles is collected at its end, young objects only: memory stays bounded per file."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)


def _migrate(source: bytes, options: Options, path: Optional[str] = None) -> MigrationResult:
    text, encoding = decode(source)
    if _quick_skip(text):
        return MigrationResult(source, source, note="no torch code", encoding=encoding)
    _check_syntax(source)
    import libcst as cst

    from distify.anatomy import analyse
    from distify.audit import is_audit
    from distify.helper_effects import builds_elsewhere
    from distify.names import frameworks
    from distify.edits import ApplyEdits
    from distify.rules import selected
    from distify.rules.base import Context

    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        raise InputError(f"syntax error at {e.raw_line}:{e.raw_column + 1}: {_first_line(e.message)}") from None
    except (RecursionError, MemoryError) as e:  # pathological nesting
        raise InputError(f"cannot parse: {type(e).__name__}") from None

    reach = joined = None
    if path is not None:
        from distify.project_reach import ProjectReach

        reach = ProjectReach(path, options)
        joined = reach.joined(source)
    anatomy = analyse(module, reach, joined, text)
    project_view = None
    if path is not None and not options.standalone and (anatomy.optimizers or anatomy.loaders) and (
            not anatomy.has_training or builds_elsewhere(anatomy)):
        # the training loop may run in a function of another module of the project: the rules
        # then see the script and that module as one (distify.project_view)
        from distify.project_view import view

        project_view = view(module, anatomy, path, options)
        if project_view is not None and project_view.half is not None:
            call, where = project_view.half
            line, col = anatomy.position(call)
            said = Finding("DST961", line, col, f"not migrated: training runs in {where}, a module distify already migrated "
                           "(for another entry script) while this script is not: migrating it now would add to that "
                           "module again; run distify on the original files of every script that uses it together "
                           "(distify a.py b.py)", kind="warning")
            return MigrationResult(source, source, (said,), note="not migrated: see warnings", encoding=encoding, refused=True)
        seen = analyse(project_view.module, reach, project_view.joined) if project_view is not None else None
        if seen is not None and seen.has_training and (seen.flavour is None or seen.migrated_by_distify):
            from distify.project_view import seen_as_script

            seen_as_script(project_view, seen, anatomy)
            anatomy = seen
        else:
            project_view = None
    anatomy.want_positions = options.positions
    standalone_name = anatomy.standalone_runtime
    if standalone_name is not None and not options.standalone:
        options = options.replace(standalone=True)  # an earlier --standalone output stays standalone
    incremental = False
    if frameworks(anatomy.calls) and not anatomy.migrated_by_distify:
        # Accelerate, Lightning, the HF Trainer, DeepSpeed...: the framework distributes the script
        return MigrationResult(source, source, _notes(anatomy, options, path, "DST960"), note="distributed by a framework", encoding=encoding)
    if anatomy.flavour == options.backend or _unsharded_fsdp_output(anatomy, options):
        if not anatomy.migrated_by_distify:
            return MigrationResult(
                source, source, _advice(anatomy, options),
                note="already distributed (" + ", ".join(anatomy.distributed) + ")", encoding=encoding,
            )
        # distify's own output: add only what is missing (a new loader, model, save...)
        incremental = True
    if not anatomy.has_training:
        # nothing distify knows how to migrate; the audit still says when it trains all the same
        said = tuple(_audit(anatomy, options, [], path=path)) + _notes(anatomy, options, path, "DST961")
        if any(f.code == "DST961" and f.kind == "warning" for f in said):
            # the training runs in another module of the project that distify cannot migrate yet
            return MigrationResult(source, source, said, note="not migrated: see warnings", encoding=encoding, refused=True)
        return MigrationResult(source, source, said, note="no training loop", encoding=encoding)

    findings: List[Finding] = []
    line_map = None
    original = module
    rules = tuple(r for r in selected(options.backend, options.select, options.ignore) if not is_audit(r))
    if anatomy.flavour is not None and not incremental:
        # written for the other backend: strip its constructs, then migrate what is left
        from distify.convert import STAGE as convert

        if not options.selects(convert.code):
            return MigrationResult(
                source, source, note=f"written for {anatomy.flavour} (conversion not selected)", encoding=encoding
            )
        module, converted = convert.run(anatomy, options)
        findings += converted
        if module is None:
            return MigrationResult(
                source, source, tuple(findings), note="not converted: see warnings", encoding=encoding, refused=True
            )
        anatomy = analyse(module, reach, joined)
        anatomy.want_positions = options.positions
        line_map = _line_map(source, module.bytes)

    if not incremental and project_view is None:
        # a training loop's DataLoader built in its header gets a name first (distify.loop_loaders)
        from distify.loop_loaders import name_in_place_loaders

        named = name_in_place_loaders(anatomy)
        if named is not None:
            module = named
            anatomy = analyse(module, reach, joined)
            anatomy.want_positions = options.positions
            line_map = _line_map(source, module.bytes)

    ctx = Context(anatomy, options)
    ctx.plan.incremental = incremental
    ctx.plan.script_path = path
    if standalone_name is not None:
        ctx.plan.standalone_runtime = standalone_name  # the class may have gone with a conversion
    for rule in rules:
        rule.apply(ctx)
    ctx.finish()
    if anatomy.flavour is None and line_map is not None:
        # positions found in the stripped intermediate code, reported against the user's file
        ctx.findings = [f.replace(line=line_map(f.line)) for f in ctx.findings]
    findings += ctx.findings
    findings.sort(key=lambda f: (f.line, f.col, f.code))
    if ctx.blocked:
        warnings = [f for f in findings if f.kind == "warning"]
        others = ()
        if project_view is not None:  # each warning against the file and line where it was found
            from distify.project_view import split_findings

            warnings, theirs = split_findings(project_view, anatomy, warnings)
            others = tuple((p.module.path, p.source, p.source, tuple(theirs[p.module.path])) for p in project_view.parts)
        return MigrationResult(
            source, source, tuple(warnings), note="not migrated: see warnings", encoding=encoding, refused=True, others=others,
        )
    if project_view is not None:
        from distify.project_view import finish, render_script

        output = render_script(project_view, module, source, ctx.edits)
        return finish(project_view, anatomy, ctx, rules, source, output, findings, encoding, options)
    new_module = module.visit(ApplyEdits(ctx.edits)) if ctx.edits else module
    if options.standalone:
        new_module = _standalone(new_module, ctx, findings)
    # no edit (and no runtime class): the tree is the one parsed from `source`, whose rendering
    # libcst guarantees byte for byte; a render would only cost a code generation of the module
    if new_module is original:
        output = source
    elif module is original and anatomy.module is original and text.encode(original.encoding) == source:
        # the statements of the body no edit touched: their text is the source's (distify.render)
        from distify.render import render

        output = render(new_module, original, text, anatomy.top_spans())
    else:
        output = new_module.bytes
    if output == source:
        findings += _audit(anatomy, options, findings, path=path)
        return MigrationResult(source, source, tuple(findings), encoding=encoding)
    # the output must be valid Python before anything is written (CPython's compiler is the judge,
    # and ~10x faster than a second libcst parse)
    try:
        compile(output, "<distify output>", "exec", dont_inherit=True)
    except SyntaxError as e:  # pragma: no cover - would be a distify bug
        raise RuntimeError(f"distify produced invalid code: {e}") from e
    # every name the output reads must be bound where it reads it (DST962): an edit written in the
    # wrong scope is refused here, before anything is written, with the user's line
    # both texts without rendering either whole tree once more: libcst gives
    # back the bytes it parsed, and `output` is the new tree's bytes
    before, after = source.decode(original.encoding), output.decode(new_module.encoding)
    unbound = [f for r in rules if hasattr(r, "check_output") for f in r.check_output(before, after)]
    if unbound:
        to_source = _line_map(source, output)
        return _refusal(source, findings, [f.replace(line=to_source(f.line)) for f in unbound], encoding)
    # the audit: the rewritten module, analysed afresh, must hold the invariants of a correct
    # data-parallel script; its findings are reported against the user's lines
    audited = _audit(analyse(new_module, joined=joined, text=after), options, findings, migrated=True, path=path)
    # a partial migration the user asked for (--select / --ignore) is written with its warnings
    drift = _drift(audited) if not (options.select or options.ignore) else []
    if drift:
        to_source = _line_map(source, output)
        return _refusal(source, findings, [f.replace(line=to_source(f.line), message=f"{f.message}: file not migrated")
                                           for f in drift], encoding)
    if audited:
        to_source = _line_map(source, output)
        findings += [f.replace(line=to_source(f.line)) for f in audited]
        findings.sort(key=lambda f: (f.line, f.col, f.code))
    return MigrationResult(source, output, tuple(findings), encoding=encoding)


def _standalone(module: cst.Module, ctx: Context, findings: List[Finding]) -> cst.Module:
    """--standalone: the runtime helpers the script now uses, written into it as a class."""
    from distify import standalone

    name = ctx.plan.standalone_runtime or ctx.anatomy.local_name_for("distify.runtime")
    outcome = standalone.finish(module, ctx.backend, name, ctx.fresh)
    if outcome.warning:
        findings.append(Finding("DST001", 1, 1, f"--standalone: {outcome.warning}", kind="warning"))
    return outcome.module


def _advice(anatomy, options: Options) -> Tuple[Finding, ...]:
    """Warnings of the rules that also check a script already distributed (``checks_distributed``,
    e.g. DST911: a collective only some ranks reach); nothing is edited."""
    from distify.rules import selected
    from distify.rules.base import Context

    rules = [r for r in selected(options.backend, options.select, options.ignore) if getattr(r, "checks_distributed", False)]
    if not rules:
        return ()
    ctx = Context(anatomy, options)
    for rule in rules:
        rule.apply(ctx)
    return tuple(sorted((f for f in ctx.findings if f.kind == "warning"), key=lambda f: (f.line, f.col, f.code)))


def _notes(anatomy, options: Options, path: Optional[str], code: str) -> Tuple[Finding, ...]:
    """What rule `code` says about why a file is left as it is (when selected): info lines the
    report prints without -v."""
    from distify.rules import selected
    from distify.rules.base import Context

    ctx = Context(anatomy, options)
    ctx.plan.script_path = path
    for rule in selected(options.backend, options.select, options.ignore, codes=(code,)):
        rule.apply(ctx)
    return tuple(ctx.findings)


def _audit(anatomy, options: Options, prior: Sequence[Finding], migrated: bool = False, path: Optional[str] = None) -> List[Finding]:
    """Warnings of the audit checks (DST95x) on an analysed module: the output of a migration
    (``migrated``: checks may hold it to what distify itself writes, whichever backend), or a
    script left as it was. ``prior``: what the rules reported (DST950 speaks only when nothing else
    explains why a training script was left undistributed). ``path``: the script's file, for the
    checks that follow its calls into the project's other modules."""
    from distify.audit import is_audit
    from distify.rules import selected
    from distify.rules.base import Context

    checks = [r for r in selected(options.backend, options.select, options.ignore) if is_audit(r)]
    if not checks:
        return []
    anatomy.want_positions = options.positions
    ctx = Context(anatomy, options)
    ctx.plan.prior_warnings = [f for f in prior if f.kind == "warning"]
    ctx.plan.distify_output = migrated
    ctx.plan.script_path = path
    for check in checks:
        check.apply(ctx)
    return [f for f in ctx.findings if f.kind == "warning"]


def _refusal(source: bytes, findings: Sequence[Finding], why: Sequence[Finding], encoding: str) -> MigrationResult:
    """The script left as it was: the rules' warnings and `why` (found on the output that was not
    written, already against the user's lines), in line order."""
    kept = [f for f in findings if f.kind == "warning"] + list(why)
    return MigrationResult(source, source, tuple(sorted(kept, key=lambda f: (f.line, f.col, f.code))),
                           note="not migrated: see warnings", encoding=encoding, refused=True)


def _drift(audited: Sequence[Finding]) -> List[Finding]:
    """The audit's findings on distify's own output that mean the written script would train wrong
    in silence (``AuditCheck.refuses_own_output``): such an output is refused, not written."""
    from distify.rules import by_code

    return [f for f in audited if getattr(by_code(f.code), "refuses_own_output", False)]


def _line_map(old: bytes, new: bytes):
    """Map line numbers of `new` back to `old`: equal lines exactly; a changed line to the most
    similar line of the block it replaces (in order), else to the block's first line."""
    import difflib

    a, b = old.splitlines(), new.splitlines()
    mapping = {}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            for k, j in enumerate(range(j1, j2)):
                mapping[j + 1] = i1 + k + 1
        elif tag == "replace" and (i2 - i1) * (j2 - j1) <= 400:
            lo = i1
            for j in range(j1, j2):
                ratios = [(difflib.SequenceMatcher(None, a[i], b[j]).ratio(), -i) for i in range(lo, i2)]
                best = max(ratios)[1] * -1 if ratios else i1
                mapping[j + 1] = best + 1
                lo = best
        else:
            for j in range(j1, j2):
                mapping[j + 1] = i1 + 1
    return lambda line: mapping.get(line, line)


def _check_syntax(source: bytes) -> None:
    """Let CPython's compiler judge the input first (it does not run it). libcst accepts code that
    cannot compile ('return' outside a function, duplicate arguments...), which would otherwise fail
    only when the output is re-compiled and be reported as a distify bug (exit 123), and its native
    parser overflows the C stack (SIGSEGV) on deep nesting that CPython rejects cleanly."""
    try:
        compile(source, "<input>", "exec", dont_inherit=True)
    except SyntaxError as e:
        where = f"{e.lineno}:{e.offset}" if e.lineno and e.offset else f"{e.lineno or 1}"
        raise InputError(f"syntax error at {where}: {_first_line(e.msg or '')}") from None
    except (RecursionError, MemoryError) as e:
        raise InputError(f"cannot parse: too deeply nested ({type(e).__name__})") from None
    except ValueError as e:  # e.g. NUL bytes
        raise InputError(f"cannot parse: {e}") from None


def _unsharded_fsdp_output(anatomy, options: Options) -> bool:
    """distify's own --backend fsdp output in which no model could be sharded (DST905 said why): it
    has a process group and samplers but no wrapper, which reads as "ddp"; it is not converted."""
    from distify.records import DDP

    return (
        options.backend == FSDP_BACKEND
        and anatomy.flavour == DDP_BACKEND
        and anatomy.migrated_by_distify
        and not anatomy.calls_to(DDP)
    )


def _first_line(msg: str) -> str:
    return msg.strip().splitlines()[0] if msg.strip() else "invalid syntax"


# files -------------------------------------------------------------------------------------

def iter_python_files(paths: Sequence[str], exclude: Sequence[str] = ()) -> Iterator[Tuple[str, Optional[str]]]:
    """(path, error) for each input: files as given, directories walked for *.py."""
    import fnmatch

    for p in paths:
        if p == "-":
            yield p, None
            continue
        path = Path(p)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules"))
                for f in sorted(files):
                    if f.endswith(".py"):
                        full = os.path.join(root, f)
                        if not any(fnmatch.fnmatch(full, pat) or fnmatch.fnmatch(f, pat) for pat in exclude):
                            yield full, None
        elif path.exists() or path.is_symlink():
            if not path.exists():
                yield p, "broken symlink"
            else:
                yield p, None
        else:
            yield p, "no such file or directory"


def process_file(path: str, mode: Mode, options: Options, cache=None, parse: bool = True,
                 defer: bool = False) -> Optional[FileResult]:
    """Migrate one file. With a ``distify.cache.Cache``, a file already found clean is not parsed,
    and one found clean now is stored; with ``parse=False`` a cache miss returns None. With `defer`
    (a module another file of the run imports: ``distify.project.reaching``) a rewrite is not
    written here but left pending for ``distify.project.write_all``."""
    try:
        real = os.path.realpath(path)  # rewrite a symlink's target, keep the link
        st = os.stat(real)
        if not stat.S_ISREG(st.st_mode):
            return FileResult(path, Status.ERROR, message="not a regular file")
        if st.st_size > options.max_bytes:
            return FileResult(
                path,
                Status.ERROR,
                message=f"file is {st.st_size / 2**20:.1f} MiB, over the {options.max_bytes / 2**20:g} MiB limit "
                "for a training script (raise it with --max-size)",
            )
        with open(real, "rb") as f:
            source = f.read()
    except OSError as e:
        return FileResult(path, Status.ERROR, message=f"cannot read: {e.strerror or e}")
    hit = cache.get(source) if cache is not None else None
    if hit is not None:
        status = Status.REFUSED if hit.refused else Status.UNCHANGED
        return FileResult(path, status, hit.findings, hit.note, source, source, hit.encoding)
    if not parse:
        return None
    try:
        result = migrate_source(source, options, real)
    except InputError as e:
        return FileResult(path, Status.ERROR, message=str(e), source=source)
    except Exception as e:  # noqa: BLE001 - reported as an internal failure, exit 123
        return FileResult(path, Status.FAILED, message=f"internal error: {type(e).__name__}: {e}", source=source)
    others = tuple(_other_file(o, result.encoding, mode is Mode.WRITE) for o in result.others)
    if others and any(o.status is Status.ERROR for o in others):
        return FileResult(path, Status.REFUSED, result.findings, "not migrated: another file of the project cannot be written",
                          source, source, result.encoding, others)
    if not result.changed:
        if cache is not None and not any(f.code == "DST961" for f in result.findings) and not others:
            # (DST961 is said of modules distify could not follow: asked again on every run)
            from distify.project import project_files

            cache.put(source, result.findings, result.note, result.encoding, result.refused, project_files(real, options))
        return FileResult(
            path, Status.REFUSED if result.refused else Status.UNCHANGED, result.findings, message=result.note, source=source, output=source,
            encoding=result.encoding, others=others,
        )
    if mode is Mode.WRITE and not others and not defer:
        try:
            write_atomic(real, result.output, expect=st)
        except InputError as e:
            return FileResult(path, Status.ERROR, result.findings, message=str(e), source=source)
        except OSError as e:
            return FileResult(path, Status.ERROR, result.findings, message=f"cannot write: {e.strerror or e}", source=source)
    return FileResult(path, Status.CHANGED, result.findings, source=source, output=result.output, encoding=result.encoding,
                      others=others, pending=mode is Mode.WRITE and (bool(others) or defer))


def _other_file(other, encoding: str, pending: bool = False) -> FileResult:
    """The FileResult of another file of the project a migration rewrites: an error when it changed
    on disk since it was read or cannot be written; with `pending`, to be written by
    ``distify.project.write_all`` once every file of the run is migrated."""
    real, before, after, findings = other
    shown = os.path.relpath(real) if not os.path.relpath(real).startswith("..") else real
    if after == before:
        return FileResult(shown, Status.UNCHANGED, findings, source=before, output=before, encoding=encoding)
    try:
        with open(real, "rb") as f:
            if f.read() != before:
                raise InputError("file changed on disk while distify was processing it; not written")
        if not os.access(real, os.W_OK) or not os.stat(real).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
            raise InputError("file is read-only; not written")
    except InputError as e:
        return FileResult(shown, Status.ERROR, findings, message=str(e), source=before)
    except OSError as e:
        return FileResult(shown, Status.ERROR, findings, message=f"cannot write: {e.strerror or e}", source=before)
    return FileResult(shown, Status.CHANGED, findings, source=before, output=after, encoding=encoding, pending=pending)


def write_atomic(path: str, data: bytes, expect: Optional[os.stat_result] = None) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file.

    The new content goes to a temporary file in the same directory, is flushed to disk and then
    renamed over the original (``os.replace`` is atomic on POSIX and Windows). The original's
    permission bits are kept; the file's owner is kept where the process may set it. If the file
    changed on disk since it was read (size or mtime), nothing is written.
    """
    if expect is not None:
        now = os.stat(path)
        if (now.st_mtime_ns, now.st_size) != (expect.st_mtime_ns, expect.st_size):
            raise InputError("file changed on disk while distify was processing it; not written")
    st = os.stat(path)
    # os.access alone says "writable" to root; a file without any write bit is read-only to us too
    if not os.access(path, os.W_OK) or not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise InputError("file is read-only; not written")
    import tempfile

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".distify-tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except (PermissionError, AttributeError):
            pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
