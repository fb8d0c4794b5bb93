"""What the user sees: diffs on stdout, summary and warnings on stderr.

Colour only on a terminal: when stdout is piped the diff is the plain unified diff bytes, fit for
``patch``; when stderr is piped the summary is plain ``path:line:col: CODE message`` lines.
"""

from __future__ import annotations

import difflib
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
    def __init__(self, quiet: bool = False, verbose: bool = False, out: Optional[TextIO] = None, err: Optional[TextIO] = None):
        self.quiet = quiet
        self.verbose = verbose
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._err_console = None
        self._out_console = None

    def _is_tty(self, stream: TextIO) -> bool:
        try:
            return stream.isatty()
        except (AttributeError, ValueError):
            return False

    def err_console(self):
        if self._err_console is None:
            from rich.console import Console

            self._err_console = Console(file=self.err, highlight=False, soft_wrap=True)
        return self._err_console

    def out_console(self):
        if self._out_console is None:
            from rich.console import Console

            self._out_console = Console(file=self.out, highlight=False, soft_wrap=True)
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
        if self.quiet:
            return
        warnings = [f for f in result.findings if f.kind == "warning"]
        fixes = [f for f in result.findings if f.kind in ("fix", "info")]
        if result.status is Status.CHANGED:
            self._line(f"{mode_word} {result.path} ({len(fixes)} change{'s' if len(fixes) != 1 else ''})", "bold")
            for f in fixes:
                self._line("  " + f.format(result.path), None)
        elif self.verbose:
            why = f": {result.message}" if result.message else ""
            self._line(f"unchanged {result.path}{why}", "dim")
        for f in warnings:
            self._line(f.format(result.path), "yellow")

    def summary(self, changed: int, unchanged: int, errors: int, mode_word: str) -> None:
        if self.quiet:
            return
        parts = []
        if changed:
            parts.append(f"{changed} file{'s' if changed != 1 else ''} {mode_word}")
        if unchanged:
            parts.append(f"{unchanged} file{'s' if unchanged != 1 else ''} unchanged")
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
