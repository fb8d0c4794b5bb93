"""Bad and unusual input: every case checks the exit code, the one-line ``<path>: error: ...``
message where it is an error, and that the file's bytes and permissions are untouched unless the
rewrite succeeded. Also: encodings and newlines survive a rewrite, writes are atomic, and the
user's code is never executed.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXIT_OK, EXIT_CHANGED, EXIT_INPUT = 0, 1, 2


def snapshot(path: Path):
    st = os.lstat(path)
    return path.read_bytes(), stat.S_IMODE(st.st_mode)


def temp_leftovers(directory: Path) -> list:
    return sorted(p.name for p in directory.iterdir() if "distify-tmp" in p.name or p.name.endswith(".tmp"))


def assert_input_error(result, path, *words):
    """Exit 2 and exactly one single-line ``<path>: error: ...`` message on stderr, no traceback."""
    assert result.exit_code == EXIT_INPUT, (result.exit_code, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith(f"{path}: error: ")]
    assert len(lines) == 1, result.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout_bytes == b""
    return lines[0]


def run_bad(cli, path: Path, *words):
    """The error case in write, --check and --diff modes: nothing changes on disk."""
    before = snapshot(path)
    for extra in ((), ("--check",), ("--diff",)):
        assert_input_error(cli(*extra, path), path, *words)
        assert snapshot(path) == before
    assert temp_leftovers(path.parent) == []


# --- the bad-input matrix -------------------------------------------------------------------

def test_syntax_error(cli, tmp_path):
    path = tmp_path / "syn.py"
    path.write_text("import torch\n\ndef train(:\n    pass\n")
    run_bad(cli, path, "syntax error at 3:")


def test_python2_code(cli, tmp_path):
    path = tmp_path / "py2.py"
    path.write_text('import torch\nprint "x"\n')
    run_bad(cli, path, "syntax error at 2:")


def test_code_that_parses_but_does_not_compile(cli, tmp_path, train_py):
    # libcst accepts a module-level `return`; it is still the input's fault (exit 2), not distify's (123)
    train_py.write_bytes(train_py.read_bytes() + b"return 5\n")
    run_bad(cli, train_py, "syntax error", "'return' outside function")


def test_deep_nesting_is_an_input_error_not_a_crash(cli, tmp_path):
    # libcst's native parser overflows the C stack (SIGSEGV) on ~3000 nested parentheses
    path = tmp_path / "deep.py"
    path.write_text("import torch\nx = " + "(" * 3000 + "1" + ")" * 3000 + "\n")
    proc = subprocess.run([sys.executable, "-m", "distify", path], capture_output=True, timeout=60)
    assert proc.returncode == EXIT_INPUT, (proc.returncode, proc.stderr[-500:])
    assert proc.stderr.decode().startswith(f"{path}: error: ")


def test_non_utf8_without_cookie(cli, tmp_path):
    path = tmp_path / "latin.py"
    path.write_bytes(b"import torch\n# caf\xe9\nx = 1\n")
    run_bad(cli, path, "decode")


def test_invalid_coding_cookie(cli, tmp_path):
    path = tmp_path / "cookie.py"
    path.write_bytes(b"# -*- coding: no-such-codec -*-\nimport torch\n")
    run_bad(cli, path)


def test_binary_file_named_py(cli, tmp_path):
    path = tmp_path / "blob.py"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR torch" + bytes(range(256)))
    run_bad(cli, path, "binary")


def test_missing_path(cli, tmp_path, train_py):
    missing = tmp_path / "nope.py"
    before = snapshot(train_py)
    result = cli(missing)
    assert_input_error(result, missing, "no such file")
    # a missing path next to a good file: the good one is still processed, the exit code is 2
    both = cli("--check", train_py, missing)
    assert both.exit_code == EXIT_INPUT
    assert f"would rewrite {train_py}" in both.stderr
    assert snapshot(train_py) == before


def test_broken_symlink(cli, tmp_path):
    link = tmp_path / "dangling.py"
    link.symlink_to(tmp_path / "gone.py")
    assert_input_error(cli(link), link, "symlink")
    assert link.is_symlink()


def test_read_only_file(cli, train_py):
    train_py.chmod(0o444)
    before = snapshot(train_py)
    line = assert_input_error(cli(train_py), train_py, "read-only")
    assert "not written" in line
    assert snapshot(train_py) == before
    assert temp_leftovers(train_py.parent) == []
    # reading it is fine
    assert cli("--check", train_py).exit_code == EXIT_CHANGED


def test_empty_file(cli, tmp_path):
    path = tmp_path / "empty.py"
    path.write_bytes(b"")
    for extra in ((), ("--check",), ("--diff",)):
        result = cli(*extra, path)
        assert result.exit_code == EXIT_OK, result.stderr
        assert "error" not in result.stderr and result.stdout_bytes == b""
    assert path.read_bytes() == b""
    stdin = cli("-", input=b"")
    assert (stdin.exit_code, stdin.stdout_bytes) == (EXIT_OK, b"")


def test_directory_of_good_files(cli, tmp_path, train_py, infer_py):
    (tmp_path / "sub").mkdir()
    other = tmp_path / "sub" / "other.py"
    other.write_bytes(train_py.read_bytes())
    infer_before = snapshot(infer_py)
    result = cli(tmp_path)
    assert result.exit_code == EXIT_CHANGED, result.stderr
    assert "error" not in result.stderr
    assert b"DistributedSampler" in train_py.read_bytes() and b"DistributedSampler" in other.read_bytes()
    assert snapshot(infer_py) == infer_before
    assert temp_leftovers(tmp_path) == [] and temp_leftovers(tmp_path / "sub") == []


def test_bad_file_in_a_directory_does_not_stop_the_others(cli, tmp_path, train_py):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\ndef f(:\n")
    bad_before = snapshot(bad)
    result = cli(tmp_path)
    assert_input_error(result, bad, "syntax error")
    assert b"DistributedSampler" in train_py.read_bytes()
    assert snapshot(bad) == bad_before


# --- encodings and newlines ---------------------------------------------------------------

def test_latin1_with_cookie(cli, train_py):
    src = train_py.read_bytes().replace(b'print(f"saved {args.checkpoint}")', b'print(f"saved {args.checkpoint} \xe9t\xe9")')
    src = b"# -*- coding: latin-1 -*-\n# caf\xe9 cr\xe8me\n" + src
    train_py.write_bytes(src)

    diff = cli("--diff", train_py)
    assert diff.exit_code == EXIT_OK, diff.stderr
    # the diff is in the file's encoding (fit for `patch`), not mojibake or U+FFFD
    assert b'+    print(f"saved {args.checkpoint} \xe9t\xe9")' in diff.stdout_bytes
    assert "\ufffd".encode() not in diff.stdout_bytes and b"\xc3\xa9" not in diff.stdout_bytes
    assert train_py.read_bytes() == src

    result = cli(train_py)
    assert result.exit_code == EXIT_CHANGED, result.stderr
    out = train_py.read_bytes()
    assert out.startswith(b"# -*- coding: latin-1 -*-\n# caf\xe9 cr\xe8me\n")
    assert b"\xc3" not in out  # not re-encoded as UTF-8
    assert b'print(f"saved {args.checkpoint} \xe9t\xe9")' in out
    assert "DistributedSampler" in out.decode("latin-1")
    compile(out, str(train_py), "exec")  # honours the cookie
    assert cli(train_py).exit_code == EXIT_OK


def test_utf8_bom_is_kept(cli, train_py):
    src = b"\xef\xbb\xbf" + train_py.read_bytes()
    train_py.write_bytes(src)
    result = cli(train_py)
    assert result.exit_code == EXIT_CHANGED, result.stderr
    out = train_py.read_bytes()
    assert out.startswith(b"\xef\xbb\xbf") and out.count(b"\xef\xbb\xbf") == 1
    assert b"DistributedSampler" in out
    compile(out, str(train_py), "exec")
    assert cli(train_py).exit_code == EXIT_OK


def test_crlf_newlines_are_kept_everywhere(cli, train_py):
    src = train_py.read_bytes().replace(b"\n", b"\r\n")
    train_py.write_bytes(src)
    result = cli(train_py)
    assert result.exit_code == EXIT_CHANGED, result.stderr
    out = train_py.read_bytes()
    assert b"DistributedSampler" in out
    assert re.search(rb"(?<!\r)\n", out) is None, "a bare \\n in the output"
    assert b"\r\r" not in out
    compile(out, str(train_py), "exec")
    assert cli(train_py).exit_code == EXIT_OK


def test_mixed_newlines(cli, train_py):
    lines = train_py.read_bytes().split(b"\n")[:-1]
    src = b"".join(ln + (b"\r\n" if i % 2 else b"\n") for i, ln in enumerate(lines))
    train_py.write_bytes(src)
    result = cli(train_py)
    assert result.exit_code == EXIT_CHANGED, result.stderr
    out = train_py.read_bytes()
    compile(out, str(train_py), "exec")
    original = {}
    for ln in re.findall(rb"[^\r\n]*(?:\r\n|\n)", src):
        original.setdefault(ln.rstrip(b"\r\n"), set()).add(ln[len(ln.rstrip(b"\r\n")):])
    kept = 0
    for ln in re.findall(rb"[^\r\n]*(?:\r\n|\n)", out):
        body, ending = ln.rstrip(b"\r\n"), ln[len(ln.rstrip(b"\r\n")):]
        if body.strip() and len(original.get(body, ())) == 1:
            assert ending in original[body], (body, ending)
            kept += 1
    assert kept > 20


def test_tab_indentation(cli, train_py):
    src = train_py.read_bytes().replace(b"    ", b"\t")
    train_py.write_bytes(src)
    result = cli(train_py)
    assert result.exit_code == EXIT_CHANGED, result.stderr
    out = train_py.read_bytes()
    compile(out, str(train_py), "exec")
    assert b"DistributedSampler" in out
    assert re.search(rb"^ ", out, re.M) is None  # inserted blocks are indented with the file's tabs


# --- files on disk ------------------------------------------------------------------------

def test_symlink_target_is_rewritten_link_kept(cli, tmp_path, train_py):
    link = tmp_path / "link.py"
    link.symlink_to(train_py.name)
    result = cli(link)
    assert result.exit_code == EXIT_CHANGED, result.stderr
    assert link.is_symlink() and os.readlink(link) == train_py.name
    assert b"DistributedSampler" in train_py.read_bytes()
    assert temp_leftovers(tmp_path) == []


def test_permissions_kept_after_rewrite(cli, train_py):
    train_py.chmod(0o754)
    result = cli(train_py)
    assert result.exit_code == EXIT_CHANGED, result.stderr
    assert stat.S_IMODE(os.stat(train_py).st_mode) == 0o754
    assert b"DistributedSampler" in train_py.read_bytes()
    assert temp_leftovers(train_py.parent) == []


def test_no_temp_files_after_success_or_failure(cli, tmp_path, train_py):
    (tmp_path / "bad.py").write_text("import torch\ndef f(:\n")
    ro = tmp_path / "ro.py"
    ro.write_bytes(train_py.read_bytes())
    ro.chmod(0o444)
    names = sorted(p.name for p in tmp_path.iterdir())
    result = cli(tmp_path)
    assert result.exit_code == EXIT_INPUT
    assert sorted(p.name for p in tmp_path.iterdir()) == names


def test_write_atomic_refuses_a_file_changed_after_reading(tmp_path):
    from distify.engine import InputError, write_atomic

    path = tmp_path / "train.py"
    path.write_bytes(b"print('v1')\n")
    path.chmod(0o640)
    old = os.stat(path)

    # same size, later mtime
    path.write_bytes(b"print('v2')\n")
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns + 5_000_000_000))
    with pytest.raises(InputError, match="changed on disk"):
        write_atomic(str(path), b"print('distify')\n", expect=old)
    assert path.read_bytes() == b"print('v2')\n"

    # different size, mtime forced back to the old one
    path.write_bytes(b"print('a longer v3')\n")
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    with pytest.raises(InputError):
        write_atomic(str(path), b"print('distify')\n", expect=old)
    assert path.read_bytes() == b"print('a longer v3')\n"
    assert temp_leftovers(tmp_path) == []

    # unchanged since the stat: written, permissions kept
    now = os.stat(path)
    write_atomic(str(path), b"print('distify')\n", expect=now)
    assert path.read_bytes() == b"print('distify')\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert temp_leftovers(tmp_path) == []


def test_user_code_is_never_executed(cli, tmp_path, train_py):
    marker = tmp_path / "EXECUTED"
    payload = (
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('module level')\n"
        f"if __name__ == '__main__':\n    pathlib.Path({str(marker)!r}).write_text('main')\n"
    )
    text = train_py.read_text().replace("import argparse\n", "import argparse\n" + payload, 1)
    train_py.write_text(text)
    for args, status in ((("--check",), EXIT_CHANGED), (("--diff",), EXIT_OK), ((), EXIT_CHANGED)):
        assert cli(*args, train_py).exit_code == status
    proc = subprocess.run(
        [sys.executable, "-m", "distify", "-"], input=text.encode(), capture_output=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == EXIT_CHANGED, proc.stderr
    assert not marker.exists()
    assert b"DistributedSampler" in train_py.read_bytes()


# --- size -----------------------------------------------------------------------------------

def _big_script(train_py: Path, n_functions: int) -> bytes:
    helper = "def helper_{i}(x, y=1):\n    z = x * y + {i}\n    return z\n\n\n"
    return train_py.read_bytes() + b"\n\n" + "".join(helper.format(i=i) for i in range(n_functions)).encode()


def test_many_functions_scale(tmp_path, train_py):
    path = tmp_path / "many.py"
    path.write_bytes(_big_script(train_py, 1000))  # ~60 kB; parsing it takes well under a second
    # The timeout guards against pathological scaling; it is no timing (bench/ measures speed), so it
    # leaves room for a loaded machine.
    proc = subprocess.run([sys.executable, "-m", "distify", "-q", path], capture_output=True, timeout=60)
    assert proc.returncode == EXIT_CHANGED, proc.stderr


def test_ten_megabyte_file_is_refused_quickly_and_left_alone(tmp_path, train_py):
    """libcst needs ~30 s per MB: beyond --max-size (2 MiB by default) distify says so and stops."""
    path = tmp_path / "big.py"
    path.write_bytes(_big_script(train_py, (10 * 1024 * 1024) // 60))
    before = path.read_bytes()
    assert len(before) >= 10 * 1024 * 1024
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "distify", path], capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_INPUT
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path}: error: ") and "--max-size" in lines[0], proc.stderr
    assert path.read_bytes() == before
    assert time.monotonic() - start < 30


def test_max_size_can_be_raised(tmp_path, train_py):
    path = tmp_path / "padded.py"
    path.write_bytes(_big_script(train_py, 1500))  # ~90 KiB
    proc = subprocess.run([sys.executable, "-m", "distify", "--check", "-q", "--max-size", "0.05", path], capture_output=True, timeout=60)
    assert proc.returncode == EXIT_INPUT and b"--max-size" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "distify", "--check", "-q", "--max-size", "1", path], capture_output=True, timeout=300)
    assert proc.returncode == EXIT_CHANGED, proc.stderr
