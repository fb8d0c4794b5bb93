"""Exit codes say what happened: a training script distify refuses to migrate exits 3, in every mode.

0 nothing to change, 1 changed (or would change), 2 usage or input error, 3 refused (a rule blocked
the migration: the file is left as it was and the warnings say why), 123 internal error. Which
fixtures are refusals is read from the goldens, not from distify's own verdict: a case that must
come out unchanged and whose expected warnings say "not migrated" / "not converted".
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distify.runner import EXIT_INPUT, EXIT_OK, EXIT_REFUSED, execute

from test_fixtures import FLAGS, cases, expected_refusal

ROOT = Path(__file__).resolve().parent.parent
REFUSED = ROOT / "fixtures" / "DST904" / "second_gpu.in.py"  # a fixed cuda:1: refused under every backend
CHANGES = ROOT / "fixtures" / "scenarios" / "module_level.in.py"


REFUSALS = [c for c in cases() if expected_refusal(*c.values)]


def test_the_fixtures_hold_refusals_for_every_backend():
    backends = {c.values[1] for c in REFUSALS}
    assert backends == {"ddp", "horovod", "fsdp"} and len(REFUSALS) >= 30, len(REFUSALS)


@pytest.mark.parametrize("src,backend", REFUSALS)
def test_every_refusal_in_the_fixtures_exits_with_the_refusal_code(src, backend, tmp_path, capsys):
    """The command (in-process, as the console script runs it), in place and with --check: exit 3,
    the file untouched, and the refusal said on stderr."""
    flags_path = src.with_name(src.name[: -len(".in.py")] + ".flags")
    flags = {FLAGS[f]: True for f in (flags_path.read_text().split() if flags_path.exists() else [])}
    flags = {k: v for k, v in flags.items() if (k != "adasum" or backend == "horovod") and (k != "bf16" or backend == "fsdp")}
    copy = tmp_path / "train.py"
    shutil.copyfile(src, copy)
    for check in (False, True):
        assert execute([str(copy)], backend=backend, check=check, no_cache=True, **flags) == EXIT_REFUSED
        assert copy.read_bytes() == src.read_bytes()
    assert f"refused {copy}: file not migrated" in capsys.readouterr().err


def run(*args, input: bytes = b""):
    return subprocess.run([sys.executable, "-m", "distify", "--no-cache", *map(str, args)], input=input,
                          capture_output=True, timeout=120)


@pytest.mark.parametrize("mode", [[], ["--check"], ["--diff"], ["--diff", "--check"], ["--strict"], ["-q"]])
def test_a_refusal_exits_3_in_every_mode(tmp_path, mode):
    copy = shutil.copyfile(REFUSED, tmp_path / "train.py")
    proc = run(*mode, copy)
    assert proc.returncode == EXIT_REFUSED, proc.stderr
    assert copy.read_bytes() == REFUSED.read_bytes() and proc.stdout == b""
    assert b"refused" in proc.stderr and b"not migrated" in proc.stderr


def test_a_refusal_on_stdin_exits_3_and_echoes_the_script():
    proc = run("-", input=REFUSED.read_bytes())
    assert proc.returncode == EXIT_REFUSED, proc.stderr
    assert proc.stdout == REFUSED.read_bytes()  # an editor gets its text back unchanged
    assert b"DST904" in proc.stderr


def test_a_directory_mixing_changed_and_refused_files_exits_3(tmp_path):
    """Precedence: the rewritable file is rewritten, but the run says that not everything was migrated
    (3 over 1); an unreadable file still says 2 (an input error outranks a refusal)."""
    changed = shutil.copyfile(CHANGES, tmp_path / "a_train.py")
    refused = shutil.copyfile(REFUSED, tmp_path / "b_train.py")
    check = run("--check", tmp_path)
    assert check.returncode == EXIT_REFUSED, check.stderr
    assert b"1 file would be rewritten, 1 file refused (not migrated)." in check.stderr
    write = run(tmp_path)
    assert write.returncode == EXIT_REFUSED, write.stderr
    assert b"DistributedSampler" in changed.read_bytes() and refused.read_bytes() == REFUSED.read_bytes()
    (tmp_path / "c_broken.py").write_text("import torch\ndef f(:\n")
    assert run(tmp_path).returncode == EXIT_INPUT
    (tmp_path / "c_broken.py").unlink()
    refused.unlink()  # control: without the refused file, the same run says "nothing to change"
    assert run("--check", tmp_path).returncode == EXIT_OK


def test_a_file_distify_cannot_convert_exits_3(tmp_path):
    """DST003: a script written for another backend whose constructs cannot be stripped."""
    src = ROOT / "fixtures" / "DST003" / "fsdp1_unconvertible.in.py"
    copy = shutil.copyfile(src, tmp_path / "train.py")
    assert run("--check", "--backend", "ddp", copy).returncode == EXIT_REFUSED
    assert run("--check", "--backend", "ddp", "--select", "DST2", copy).returncode == EXIT_OK  # conversion not asked for


def test_a_cached_refusal_still_exits_3(tmp_path, monkeypatch):
    """The cache stores the refused file (it is left as it was) with the verdict: the replay, which
    does not parse, says and exits what the first run did."""
    monkeypatch.setenv("DISTIFY_CACHE_DIR", str(tmp_path / "cache"))
    copy = shutil.copyfile(REFUSED, tmp_path / "train.py")
    runs = [subprocess.run([sys.executable, "-m", "distify", "--check", copy], capture_output=True, timeout=120)
            for _ in range(2)]
    assert [p.returncode for p in runs] == [EXIT_REFUSED, EXIT_REFUSED] and runs[0].stderr == runs[1].stderr
    assert len([p for p in (tmp_path / "cache").rglob("*") if p.is_file()]) == 1
    stdin = [run_cached("-", input=REFUSED.read_bytes()) for _ in range(2)]
    assert [p.returncode for p in stdin] == [EXIT_REFUSED, EXIT_REFUSED] and stdin[1].stdout == REFUSED.read_bytes()


def run_cached(*args, input: bytes = b""):
    return subprocess.run([sys.executable, "-m", "distify", *map(str, args)], input=input, capture_output=True,
                          timeout=120)
