"""What the user sees: diffs on stdout, summary and warnings on stderr.

Colour only on a terminal: when stdout is piped the diff is the plain unified diff bytes, fit for
``patch``; when stderr is piped the summary is plain ``path:line:col: CODE message`` lines.
"""

from __future__ import annotations

import os
import io
import sys
from typing import Optional, Sequence, TextIO

from distify.engine import FileResult, Status


def _diff_encoding(result: FileResult) -> str:
    # decode a BOM as U+FEFF (not "utf-8-sig", which drops it) so that the first line round-trips
    return "utf-8" if result.encoding.lower().replace("_", "-") == "utf-8-sig" else result.encoding


def _lines(text: str) -> list:
    # split on \n, \r\n and \r only, as Python's tokenizer does: str.splitlines would also split on
    # form feeds and other separators, breaking the diff (a "\ No newline" marker mid-file)
    return io.StringIO(text, newline="").readlines()


def _diff_name(side: str, path: str) -> str:
    """git-style `a/rel/path` for relative paths; absolute paths are shown as they are."""
    return path if os.path.isabs(path) else f"{side}/{path}"


def unified_diff(result: FileResult) -> str:
    import difflib  # only runs that print a diff need it

    old = result.source.decode(_diff_encoding(result), errors="replace")
    new = result.output.decode(_diff_encoding(result), errors="replace")
    lines = difflib.unified_diff(
        _lines(old),
        _lines(new),
        fromfile=_diff_name("a", result.path),
        tofile=_diff_name("b", result.path),
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


class Reporter:
    """Writes diffs to stdout and the report to stderr; rich output only where a person reads it.

    ``terminal`` forces (True) or forbids (False) the rich terminal output; by default each stream
    decides with ``isatty()``.
    """

    def __init__(
        self,
        quiet: bool = False,
        verbose: bool = False,
        out: Optional[TextIO] = None,
        err: Optional[TextIO] = None,
        terminal: Optional[bool] = None,
    ):
        self.quiet = quiet
        self.verbose = verbose
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.terminal = terminal
        self._err_console = None
        self._out_console = None

    def _is_tty(self, stream: TextIO) -> bool:
        if self.terminal is not None:
            return self.terminal
        try:
            return stream.isatty()
        except (AttributeError, ValueError):
            return False

    def err_console(self):
        if self._err_console is None:
            from rich.console import Console

            self._err_console = Console(
                file=self.err, highlight=False, soft_wrap=True, force_terminal=self.terminal or None
            )
        return self._err_console

    def out_console(self):
        if self._out_console is None:
            from rich.console import Console

            self._out_console = Console(
                file=self.out, highlight=False, soft_wrap=True, force_terminal=self.terminal or None
            )
        return self._out_console

    # ---------------------------------------------------------------------------------------
    def diff(self, result: FileResult) -> None:
        text = unified_diff(result)
        if not text:
            return
        if self._is_tty(self.out):
            from rich.syntax import Syntax

            self.out_console().print(Syntax(text, "diff", theme="ansi_dark", background_color="default"))
        else:
            # the file's own encoding, so that `patch` applies it (and no UnicodeEncodeError on an
            # ASCII-only stdout)
            buffer = getattr(self.out, "buffer", None)
            if buffer is None:
                self.out.write(text)
                self.out.flush()
            else:
                self.out.flush()
                buffer.write(text.encode(_diff_encoding(result), errors="replace"))
                buffer.flush()

    def error(self, path: str, message: str) -> None:
        line = f"{path}: error: {message}"
        if self._is_tty(self.err):
            from rich.markup import escape

            self.err_console().print(f"[bold red]{escape(line)}[/]")
        else:
            self.err.write(line + "\n")

    def file(self, result: FileResult, mode_word: str) -> None:
        if result.status in (Status.ERROR, Status.FAILED):
            self.error(result.path, result.message)
            return
        if result.status is Status.REFUSED:  # a non-zero exit: said even under --quiet
            # a refusal of the run's own (no warning of the file's to read) says its reason here
            why = result.message if result.message and not _warnings(result) else "file not migrated (the warnings say why)"
            self._line(f"refused {result.path}: {why}", "bold red")
        if self.quiet:
            return
        warnings = _warnings(result)
        fixes = [f for f in result.findings if f.kind in ("fix", "info")]
        if result.status is Status.CHANGED:
            self._line(f"{mode_word} {result.path} ({len(fixes)} change{'s' if len(fixes) != 1 else ''})", "bold")
            for f in fixes:
                self._line("  " + f.format(result.path), None)
        elif self.verbose and result.status is Status.UNCHANGED:
            why = f": {result.message}" if result.message else ""
            self._line(f"unchanged {result.path}{why}", "dim")
        for f in result.findings:
            if f.kind == "note":  # why a file is left as it is (a framework distributes it...): said, not implied
                self._line(f.format(result.path), None)
        for f in warnings:
            self._line(f.format(result.path), "yellow")

    # many files ------------------------------------------------------------------------------
    def progress(self, total: int) -> "Progress":
        """A progress bar on a terminal for runs over many files; a no-op otherwise."""
        if self.quiet or total < PROGRESS_MIN_FILES or not self._is_tty(self.err):
            return Progress(None)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

        bar = RichProgress(
            TextColumn("distify"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.err_console(),
            transient=True,
        )
        return Progress(bar, bar.add_task("files", total=total))

    def table(self, results: Sequence[FileResult], mode_word: str) -> None:
        """Per-file table on a terminal: what each file got (rule codes) and what it warns about.

        Piped stderr keeps the one-finding-per-line report, which editors and CI parse.
        """
        if self.quiet or not self._is_tty(self.err):
            return
        rows = [r for r in results if self.verbose or r.status is not Status.UNCHANGED or _warnings(r) or _notes(r)]
        if not rows:
            return
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=None, show_edge=False, pad_edge=False, header_style="bold")
        table.add_column("file", overflow="fold")
        table.add_column("result")
        table.add_column("rules applied", overflow="fold")
        table.add_column("warnings", overflow="fold")
        styles = {Status.CHANGED: "green", Status.UNCHANGED: "dim", Status.REFUSED: "red", Status.ERROR: "red",
                  Status.FAILED: "bold red"}
        for r in rows:
            word = mode_word if r.status is Status.CHANGED else r.status.name.lower()
            applied = _codes(f for f in r.findings if f.kind in ("fix", "info", "note"))
            warned = _codes(_warnings(r))
            table.add_row(
                escape(r.path),
                f"[{styles.get(r.status, '')}]{escape(word)}[/]",
                escape(applied) or "-",
                f"[yellow]{escape(warned)}[/]" if warned else "-",
            )
        self.err_console().print(table)

    def summary(self, changed: int, unchanged: int, errors: int, mode_word: str, refused: int = 0) -> None:
        if self.quiet:
            return
        parts = []
        done = {"rewrote": "rewritten", "would rewrite": "would be rewritten"}.get(mode_word, mode_word)
        if changed:
            parts.append(f"{changed} file{'s' if changed != 1 else ''} {done}")
        if unchanged:
            parts.append(f"{unchanged} file{'s' if unchanged != 1 else ''} unchanged")
        if refused:
            parts.append(f"{refused} file{'s' if refused != 1 else ''} refused (not migrated)")
        if errors:
            parts.append(f"{errors} file{'s' if errors != 1 else ''} failed")
        if parts:
            self._line(", ".join(parts) + ".", "bold")

    def _line(self, text: str, style: Optional[str]) -> None:
        if self._is_tty(self.err) and style:
            from rich.markup import escape

            self.err_console().print(f"[{style}]{escape(text)}[/]")
        else:
            self.err.write(text + "\n")


PROGRESS_MIN_FILES = 8  # below this a run is over before a bar would be worth drawing


class Progress:
    """Context manager around an optional rich progress bar; ``advance()`` after each file."""

    def __init__(self, bar, task=None) -> None:
        self._bar = bar
        self._task = task

    def __enter__(self) -> "Progress":
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)


def _notes(result: FileResult) -> list:
    return [f for f in result.findings if f.kind == "note"]


def _warnings(result: FileResult) -> list:
    return [f for f in result.findings if f.kind == "warning"]


def _codes(findings) -> str:
    """Rule codes in order, with a count when a rule fired more than once."""
    counts: dict = {}
    for f in findings:
        counts[f.code] = counts.get(f.code, 0) + 1
    return " ".join(code if n == 1 else f"{code}\u00d7{n}" for code, n in sorted(counts.items()))
