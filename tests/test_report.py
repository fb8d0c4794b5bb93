"""The report a person reads on a terminal: per-file table and progress bar (piped output stays plain)."""

from __future__ import annotations

import io
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distify.engine import FileResult, Status
from distify.report import Reporter
from distify.rules.base import Finding

ROOT = Path(__file__).resolve().parents[1]
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _results():
    fixes = (
        Finding("DST302", 9, 5, "print on rank 0"),
        Finding("DST001", 3, 1, "init_process_group"),
        Finding("DST302", 12, 5, "print on rank 0"),
    )
    return [
        FileResult("train.py", Status.CHANGED, fixes + (Finding("DST903", 20, 1, "no epoch loop", "warning"),)),
        FileResult("utils.py", Status.UNCHANGED, ()),
        FileResult("legacy.py", Status.UNCHANGED, (Finding("DST904", 4, 10, "cuda:1", "warning"),)),
        FileResult("broken.py", Status.ERROR, message="syntax error at 3:1"),
    ]


def _table(**kw) -> str:
    err = io.StringIO()
    Reporter(err=err, terminal=True, **kw).table(_results(), "rewrote")
    return ANSI_RE.sub("", err.getvalue()).replace("\u2502", " ")  # drop the column rules


def test_table_lists_rules_and_warnings_per_file():
    text = _table()
    rows = {line.split()[0]: line for line in text.splitlines() if line.split() and line.split()[0].endswith(".py")}
    assert set(rows) == {"train.py", "legacy.py", "broken.py"}  # quiet unchanged files are left out
    assert re.search(r"rewrote\s+.*DST001 DST302\u00d72\s+.*DST903", rows["train.py"]), rows["train.py"]
    assert re.search(r"unchanged\s+-\s+.*DST904", rows["legacy.py"]), rows["legacy.py"]
    assert "error" in rows["broken.py"]
    assert "rules applied" in text and "warnings" in text


def test_table_verbose_lists_every_file_and_quiet_none():
    assert "utils.py" in _table(verbose=True)
    assert _table(quiet=True) == ""


def test_no_table_when_stderr_is_piped():
    err = io.StringIO()
    Reporter(err=err, terminal=False).table(_results(), "rewrote")
    assert err.getvalue() == ""


def test_progress_bar_only_for_many_files_on_a_terminal():
    err = io.StringIO()
    with Reporter(err=err, terminal=True).progress(12) as progress:
        for _ in range(12):
            progress.advance()
    assert "12/12" in ANSI_RE.sub("", err.getvalue())
    for reporter, total in [
        (Reporter(err=io.StringIO(), terminal=True), 3),
        (Reporter(err=io.StringIO(), terminal=True, quiet=True), 50),
        (Reporter(err=io.StringIO(), terminal=False), 50),
    ]:
        with reporter.progress(total) as progress:
            progress.advance()
        assert reporter.err.getvalue() == ""


@pytest.mark.skipif(not hasattr(pty, "openpty"), reason="needs a pseudo-terminal")
def test_directory_run_on_a_terminal_shows_bar_and_table(tmp_path):
    corpus = sorted((ROOT / "fixtures" / "corpus").glob("*.in.py"))[:10]
    for src in corpus:
        shutil.copy(src, tmp_path / src.name)
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="160", TERM="xterm")
    proc = subprocess.Popen(
        [sys.executable, "-m", "distify", str(tmp_path), "--check"],
        stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(master)
    screen = ANSI_RE.sub("", b"".join(chunks).decode("utf-8", "replace"))
    assert proc.returncode == 1  # --check: some file would change
    assert proc.stdout.read() == b""  # the report never goes to stdout
    assert "rules applied" in screen
    changed = [line for line in screen.splitlines() if "would rewrite" in line and "\u2502" in line]  # table rows
    assert changed and all("DST" in line for line in changed)
    assert "10/10" in screen or "files would be rewritten" in screen  # the bar may be erased before the read
