"""Crash safety of in-place rewrites: SIGKILL the real CLI in the middle of a large multi-file run.

300 copies of a migratable script, each padded to ~200 KB with extra functions, are rewritten in
place by ``distify <dir>`` in a subprocess (its own process group, so the worker processes die with
it). Several times, once the run has started writing (a file on disk changed), the whole group is
SIGKILLed at a random moment. After every kill each script must be byte-identical to either the
original or the fully migrated version (computed in-process with ``migrate_source``) -- never
truncated or half-written. The only other debris allowed is the engine's temporary files,
``.<name>.<random>.distify-tmp`` next to the script: a kill between creating the temporary file and
renaming it over the script leaves one behind (the script itself is untouched). They are hidden
(dot) files without a ``.py`` suffix, so a later distify run ignores them.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from distify.engine import migrate_source
from distify.rules.base import Options

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "fixtures" / "scenarios" / "module_level.in.py"
N_FILES = 300
TARGET_SIZE = 200_000
KILLS = 4
TMP_RE = re.compile(r"^\.(train_\d{3}\.py)\.[^/]+\.distify-tmp$")


def _padded_script() -> bytes:
    """module_level.in.py plus helper functions returning large constants (~200 KB in all).

    The padding is in string literals so that a file is big on disk (long writes) but cheap to parse.
    """
    base = SCRIPT.read_text()
    row = "0123456789abcdef" * 6 + "\n"
    parts, i = [base], 0
    while sum(map(len, parts)) < TARGET_SIZE:
        parts.append(f'\n\ndef padding_{i}():\n    """Padding helper {i}."""\n    return """\n{row * 200}"""\n')
        i += 1
    return "".join(parts).encode()


def _states(folder: Path, original: bytes, migrated: bytes):
    """(#original, #migrated, temp files) -- fails on anything else."""
    n_old = n_new = 0
    debris = []
    names = set()
    for entry in os.scandir(folder):
        if TMP_RE.match(entry.name):
            debris.append(entry.name)
            continue
        assert re.fullmatch(r"train_\d{3}\.py", entry.name), f"unexpected file left behind: {entry.name}"
        names.add(entry.name)
        data = Path(entry.path).read_bytes()
        if data == original:
            n_old += 1
        elif data == migrated:
            n_new += 1
        else:
            raise AssertionError(
                f"{entry.name} is neither the original ({len(original)} bytes) nor the migrated "
                f"version ({len(migrated)} bytes): {len(data)} bytes"
            )
    assert len(names) == N_FILES, f"scripts missing: {N_FILES - len(names)}"
    return n_old, n_new, debris


def _n_migrated(folder: Path, migrated_size: int) -> int:
    n = 0
    for entry in os.scandir(folder):
        if not entry.name.startswith("."):
            try:
                n += entry.stat().st_size == migrated_size
            except FileNotFoundError:
                pass
    return n


def _wait_group_gone(pgid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process group {pgid} still alive {timeout}s after SIGKILL")


def test_sigkill_mid_run_leaves_every_file_whole(tmp_path):
    original = _padded_script()
    migrated = migrate_source(original, Options(backend="ddp")).output
    assert migrated != original and len(migrated) != len(original)
    folder = tmp_path / "project"
    folder.mkdir()
    for i in range(N_FILES):
        (folder / f"train_{i:03d}.py").write_bytes(original)

    rng = random.Random(20240521)
    env = {**os.environ, "NO_COLOR": "1"}
    kills, history, all_debris = 0, [], set()
    started = time.monotonic()
    for attempt in range(KILLS):
        before = _n_migrated(folder, len(migrated))
        proc = subprocess.Popen(
            [sys.executable, "-m", "distify", str(folder), "--backend", "ddp", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True,
        )
        try:
            # poll until this run has written something, then kill it at a random moment
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:
                if _n_migrated(folder, len(migrated)) > before:
                    break
                time.sleep(0.005)
            assert proc.poll() is None or proc.returncode in (0, 1), proc.stderr.read().decode()[-2000:]
            if proc.poll() is None:
                time.sleep(rng.uniform(0.0, 0.8))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                kills += 1
            proc.wait()
            proc.stderr.close()
            _wait_group_gone(proc.pid)
        n_old, n_new, debris = _states(folder, original, migrated)
        all_debris.update(debris)
        history.append((n_old, n_new, len(debris)))
        if n_old == 0:
            break  # everything was migrated before a kill could land
    print(f"(#original, #migrated, #temp files) after each kill: {history}")
    assert kills >= 3, f"only {kills} kills landed: {history}"
    assert history[-1][1] > 0, "nothing was ever written"
    assert time.monotonic() - started < 60, history
    # leftover temp files: each names a script that is itself whole (checked above)
    for name in all_debris:
        assert TMP_RE.match(name)


def test_later_run_finishes_the_job_and_ignores_debris(tmp_path):
    """After a crash, rerunning distify completes the migration; temp files are not picked up."""
    original = SCRIPT.read_bytes()
    migrated = migrate_source(original, Options(backend="ddp")).output
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train_000.py").write_bytes(migrated)  # done before the crash
    (folder / "train_001.py").write_bytes(original)  # not reached
    debris = folder / ".train_001.py.k3j2h1.distify-tmp"
    debris.write_bytes(migrated[: len(migrated) // 2])  # half-written temp file from the crash
    proc = subprocess.run(
        [sys.executable, "-m", "distify", str(folder), "--backend", "ddp"], capture_output=True, timeout=60,
    )
    assert proc.returncode == 1, proc.stderr.decode()
    assert (folder / "train_000.py").read_bytes() == migrated
    assert (folder / "train_001.py").read_bytes() == migrated
    assert debris.exists() and b"distify-tmp" not in proc.stderr  # left alone, not reported
