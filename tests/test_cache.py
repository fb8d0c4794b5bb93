"""The cache of files found clean (``distify.cache``) and the typer-free start-up (``distify.runner``).

A cached run must print exactly what an uncached run prints and exit with the same code; it must
not parse (nor import libcst); it must never store a file that changes or fails; a damaged entry is
a miss; concurrent runs never see half an entry. The conftest gives each test an empty cache
folder (``DISTIFY_CACHE_DIR``), inherited by the ``python -m distify`` subprocesses started here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distify.cache import Cache, code_fingerprint, settings_key
from distify.findings import Finding
from distify.options import Options

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"

# unchanged and silent / unchanged with warnings (and a note) / changed / no torch at all
CLEAN = FIX / "scenarios" / "examples_style.ddp.py"
WARNS = FIX / "DST911" / "hand_ddp.in.py"  # already distributed: 3 warnings, a note
BLOCKED = FIX / "DST904" / "second_gpu.in.py"  # not migrated: warnings, file left alone
CHANGES = FIX / "scenarios" / "module_level.in.py"
CHANGES_H = FIX / "scenarios" / "module_level.horovod.py"  # clean under horovod, changes under ddp


def distify(*args, input: bytes = b"", cwd=None, importtime=False):
    cmd = [sys.executable] + (["-X", "importtime"] if importtime else []) + ["-m", "distify", *map(str, args)]
    return subprocess.run(cmd, input=input, capture_output=True, cwd=cwd, timeout=120)


def typer_distify(*args, input: bytes = b"", cwd=None):
    """The same command through typer's parser (``distify.cli.main``), not the fast path."""
    code = "import sys; from distify.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], input=input, capture_output=True, cwd=cwd,
                          timeout=120)


def entries(root=None) -> list:
    root = Path(root or os.environ["DISTIFY_CACHE_DIR"])
    return sorted(p for p in root.rglob("*") if p.is_file())


def same(a, b):
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr), (a, b)


def imported(stderr: bytes) -> set:
    mods = set()
    for line in stderr.decode(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line:
            mods.add(line.rsplit("|", 1)[1].strip())
    return mods


@pytest.fixture
def tree(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    for i, f in enumerate([CLEAN, WARNS, BLOCKED, CHANGES]):
        shutil.copyfile(f, d / f"t{i}_{f.name.split('.')[0]}.py")
    (d / "broken.py").write_text("import torch\ndef f(:\n")
    (d / "notorch.py").write_text("x = 1\n")
    return d


# --- a cached run says and does what an uncached run does --------------------------------------

@pytest.mark.parametrize("flags", [
    ["--check"], ["--check", "-v"], ["--diff"], ["--check", "--strict"], ["--check", "-q"],
    ["--check", "--backend", "horovod"], ["--check", "--select", "DST2,DST9", "--ignore=DST911"],
])
def test_cached_run_prints_and_exits_as_an_uncached_one(tree, flags):
    reference = distify(*flags, "--no-cache", tree)
    assert not entries(), "--no-cache wrote to the cache"
    cold = distify(*flags, tree)
    stored = entries()
    warm = distify(*flags, tree)
    same(reference, cold)
    same(reference, warm)
    assert warm.returncode in (1, 2) and b"broken.py" in warm.stderr  # the run is not trivial
    # every file found unchanged (refused ones too: left as they were) is stored; the changing and
    # failing ones never are
    text = distify(*[f for f in flags if f != "-q"], "-v", "--no-cache", tree).stderr.decode()
    unchanged = {p for p in tree.iterdir() if f"unchanged {p}" in text or f"refused {p}" in text}
    assert len(unchanged) >= 2
    assert {p.name for p in stored} == {Cache.digest(p.read_bytes()) for p in unchanged}
    assert entries() == stored


def test_stdin_is_cached_and_identical(tmp_path):
    for f in (WARNS, CHANGES):
        src = f.read_bytes()
        for flags in ([], ["--diff", "--strict"]):
            reference = distify(*flags, "--no-cache", "-", input=src)
            same(reference, distify(*flags, "-", input=src))
            same(reference, distify(*flags, "-", input=src))
    assert len(entries()) == 1  # WARNS (both flag sets share one key: the same options)


def test_write_mode_rewrites_then_caches_the_result(tmp_path):
    script = tmp_path / "train.py"
    shutil.copyfile(CHANGES, script)
    first = distify(script)
    assert first.returncode == 1 and not entries()  # a rewritten file is not stored as clean
    again = distify(script)
    assert again.returncode == 0 and len(entries()) == 1
    same(again, distify(script))


def test_warm_run_neither_parses_nor_imports_libcst(tree):
    files = [p for p in tree.iterdir() if p.name.startswith(("t0", "t1", "t2"))]
    cold = distify("--check", *files, importtime=True)
    cold_mods = imported(cold.stderr)
    assert "libcst" in cold_mods  # control: the check sees a parse
    # piped output, plain arguments: no rich, no typer (nor the pydantic it builds), never torch
    assert not {m for m in cold_mods if m.split(".")[0] in ("rich", "typer", "click", "pydantic", "torch")}
    warm = distify("--check", *files, importtime=True)
    mods = imported(warm.stderr)
    assert "distify.cache" in mods, "importtime output not understood"
    heavy = {m for m in mods if m.split(".")[0] in ("libcst", "typer", "click", "pydantic", "rich", "torch")}
    heavy |= {m for m in mods if m.startswith(("distify.rules", "distify.anatomy", "distify.edits"))}
    assert not heavy, sorted(heavy)


def test_digests_are_sha256():
    """The cache hashes with CPython's own SHA-256 module (not hashlib, which loads OpenSSL): the
    digests must be SHA-256's, as the entries' ``sha256`` field says."""
    import hashlib

    from distify.cache import Cache, sha256

    for data in (b"", b"import torch\n", bytes(range(256)) * 4099):
        assert Cache.digest(data) == hashlib.sha256(data).hexdigest()
        h = sha256()
        h.update(data[:7])
        h.update(data[7:])
        assert h.hexdigest() == hashlib.sha256(data).hexdigest()


def test_cache_is_read_and_no_cache_ignores_it(tmp_path):
    """A planted entry is replayed (the cache is really consulted), and --no-cache does not read it."""
    script = tmp_path / "train.py"
    shutil.copyfile(CLEAN, script)
    assert distify("--check", script).returncode == 0
    (entry,) = entries()
    data = json.loads(entry.read_text())
    data["findings"] = [["DST999", 1, 1, "planted", "warning"]]
    entry.write_text(json.dumps(data))
    assert b"DST999 planted" in distify("--check", script).stderr
    assert b"DST999" not in distify("--check", "--no-cache", script).stderr


# --- what the key holds ------------------------------------------------------------------------

HELPED = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import penalty


def main():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4, shuffle=True)
    for epoch in range(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y) + penalty(model)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_an_edit_of_a_project_module_the_script_imports_is_a_miss(tmp_path):
    """The result of a script depends on the modules of its project: refused while helpers.py reads
    `.weight` on the model its result trains (DST102), cached so; once helpers.py no longer does,
    the same script bytes must be migrated, not answered from the cache."""
    (tmp_path / "train.py").write_text(HELPED)
    (tmp_path / "helpers.py").write_text("def penalty(model):\n    return model.weight.pow(2).sum() * 0.01\n")
    first = distify("--check", "train.py", cwd=tmp_path)
    assert first.returncode == 3 and b"DST102 helpers.penalty()" in first.stderr, first.stderr
    assert len(entries()) == 1  # the refusal is stored
    (tmp_path / "helpers.py").write_text("def penalty(model):\n    return sum(p.pow(2).sum() for p in model.parameters())\n")
    again = distify("--check", "train.py", cwd=tmp_path)
    assert again.returncode == 1 and b"DST201" in again.stderr, again.stderr

def test_options_are_in_the_key(tmp_path):
    """A file clean with no rule selected must still change under the full rule set."""
    script = tmp_path / "train.py"
    shutil.copyfile(CHANGES, script)
    assert distify("--check", "--select", "DST999", script).returncode == 0
    assert len(entries()) == 1
    assert distify("--check", script).returncode == 1
    assert distify("--check", "--backend", "horovod", "--select", "DST999", script).returncode == 0
    assert len(entries()) == 2
    keys = {settings_key(Options(**kw)) for kw in (
        {}, {"backend": "horovod"}, {"select": ("DST2",)}, {"ignore": ("DST2",)}, {"scale_lr": True},
        {"fp16_allreduce": True}, {"adasum": True}, {"seed_per_rank": True}, {"standalone": True},
        {"positions": False}, {"max_bytes": 1}, {"backend": "fsdp"}, {"backend": "fsdp", "bf16": True},
    )}
    assert len(keys) == 13


def test_code_fingerprint_follows_the_package_files(tmp_path, monkeypatch):
    """An editable install keeps its version string while its rules change: the key must not."""
    import distify.cache as cache

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    rule = pkg / "dst201.py"
    rule.write_text("A = 1\n")
    (pkg / "__pycache__").mkdir()
    monkeypatch.setattr(cache, "_package_dirs", lambda: [str(pkg)])
    before = code_fingerprint()
    (pkg / "__pycache__" / "dst201.cpython.pyc").write_bytes(b"x")  # compiled files do not count
    assert code_fingerprint() == before
    rule.write_text("A = 2\n")
    os.utime(rule, ns=(1, 1))
    assert code_fingerprint() != before


def test_real_package_dirs_cover_engine_rules_and_runtime():
    """The runtime too: --standalone writes its source into scripts (inline_helpers.py)."""
    import distify.cache as cache

    names = {f for d in cache._package_dirs() for _, _, files in os.walk(d) for f in files}
    assert {"engine.py", "anatomy.py", "dst201_distributed_sampler.py", "_env.py"} <= names


# --- damage and concurrency ---------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "other_content", "bad_finding", "directory"])
def test_a_damaged_entry_is_a_miss(tmp_path, damage):
    script = tmp_path / "train.py"
    shutil.copyfile(WARNS, script)
    reference = distify("--check", "--no-cache", script)
    same(reference, distify("--check", script))
    (entry,) = entries()
    text = entry.read_text()
    if damage == "truncate":
        entry.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        entry.write_bytes(b"\x00\xff" * 50)
    elif damage == "empty":
        entry.write_text("")
    elif damage == "other_content":  # an entry that describes other bytes
        data = json.loads(text)
        data["sha256"] = "0" * 64
        entry.write_text(json.dumps(data))
    elif damage == "bad_finding":
        data = json.loads(text)
        data["findings"][0][1] = "one"
        entry.write_text(json.dumps(data))
    else:
        entry.unlink()
        entry.mkdir()
    same(reference, distify("--check", script))
    if damage != "directory":  # rewritten whole by the run that missed
        assert json.loads(entry.read_text())["sha256"] == Cache.digest(script.read_bytes())


def test_stale_settings_folders_are_pruned(tmp_path):
    root = tmp_path / "root"
    old, recent, foreign = root / ("a" * 32), root / ("b" * 32), root / "mine"
    for d in (old, recent, foreign):
        d.mkdir(parents=True)
        (d / "x").write_text("{}")
    for d in (old, foreign):
        os.utime(d, (1, 1))
    Cache(str(root / ("c" * 32))).put(b"import torch\n", [], "", "utf-8")
    assert sorted(p.name for p in root.iterdir()) == sorted(["b" * 32, "c" * 32, "mine"])


def test_unwritable_cache_is_no_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DISTIFY_CACHE_DIR", str(blocker / "cache"))
    script = tmp_path / "train.py"
    shutil.copyfile(WARNS, script)
    same(distify("--check", "--no-cache", script), distify("--check", script))


def _hammer(args):
    directory, seed = args
    import random

    rng = random.Random(seed)
    cache = Cache(directory)
    bad, written = 0, set()
    for _ in range(400):
        k = rng.randrange(8)
        src = f"source {k}\n".encode() * (k + 1)
        if rng.random() < 0.5:
            cache.put(src, [Finding("DST%03d" % k, k, 1, "m" * 20000 * k, "warning")], f"note {k}", "utf-8")
            written.add(k)
        else:
            hit = cache.get(src)
            if hit is None:
                bad += k in written  # once complete, an entry stays complete (renamed into place whole)
            elif hit.note != f"note {k}" or hit.findings[0].message != "m" * 20000 * k:
                bad += 1
    return bad


def test_concurrent_writers_and_readers_never_see_half_an_entry(tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    directory = str(tmp_path / "c")
    with ProcessPoolExecutor(4) as pool:
        assert sum(pool.map(_hammer, [(directory, s) for s in range(8)])) == 0
    files = os.listdir(directory)
    assert len(files) == 8, files  # no temporary file left behind
    for k in range(8):
        assert Cache(directory).get(f"source {k}\n".encode() * (k + 1)).note == f"note {k}"


def test_concurrent_runs_agree(tree):
    reference = distify("--check", "--no-cache", tree)
    cmd = [sys.executable, "-m", "distify", "--check", str(tree)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(6)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert (p.returncode, out, err) == (reference.returncode, reference.stdout, reference.stderr)
    assert len(entries()) == 4
    same(reference, distify("--check", tree))


# --- the typer-free start-up ---------------------------------------------------------------------

ARGVS = [
    ["--check", "F"], ["F", "--diff"], ["-q", "--check", "F", "G"], ["--backend", "horovod", "F"],
    ["-b", "horovod", "F"], ["--backend=horovod", "F"], ["--select", "DST2", "--select=DST3,DST9", "F"],
    ["--ignore", "DST911", "-v", "F"], ["--strict", "--check", "F"], ["--max-size", "0.5", "F"],
    ["--max-size=3", "F"], ["--scale-lr", "--fp16-allreduce", "--seed-per-rank", "--standalone", "F"],
    ["--adasum", "-b", "horovod", "F"], ["--bf16", "-b", "fsdp", "F"], ["--no-cache", "-", ], ["F", "G", "--check", "--check"],
    ["--json", "--check", "F"], ["check", "help"],
]


@pytest.mark.parametrize("argv", ARGVS)
def test_fast_parse_gives_what_typer_gives(argv, monkeypatch):
    from typer.testing import CliRunner

    import distify.cli as cli
    from distify.runner import execute, parse_fast

    seen = {}

    def record(**kwargs):
        seen.update(kwargs)
        return 0

    monkeypatch.setattr(cli, "execute", record)
    result = CliRunner().invoke(cli.app, argv)
    assert result.exit_code == 0, result.output
    import inspect

    defaults = {k: p.default for k, p in inspect.signature(execute).parameters.items() if p.default is not p.empty}
    fast = {**defaults, **parse_fast(argv)}
    typed = {k: (list(v) if isinstance(v, tuple) else v) for k, v in seen.items()}
    assert fast == typed


@pytest.mark.parametrize("argv", [
    [], ["--help"], ["-h"], ["--version"], ["--launch", "F"], ["--list-rules"], ["--explain", "DST201"],
    ["F", "--", "x"], ["-qv", "F"], ["--check=1", "F"], ["--max-size", "-1", "F"], ["--max-size", "0", "F"],
    ["--max-size", "1e3", "F"], ["--select"], ["--select", "--check", "F"], ["--nproc", "2", "F"],
    ["--unknown", "F"], ["lint", "F"], ["verify", "F"], ["-x"],
])
def test_fast_parse_leaves_everything_else_to_typer(argv):
    from distify.runner import parse_fast

    assert parse_fast(argv) is None


@pytest.mark.parametrize("flags", [["--check"], ["--diff"], [], ["-v", "--strict"], ["-q"]])
def test_fast_path_and_typer_print_the_same(tmp_path, tree, flags):
    work = tmp_path / "work"
    for args in (lambda: [*flags, work], lambda: [*flags, "--no-cache", work / "t3_module_level.py"]):
        outcomes = []
        for run in (distify, typer_distify):
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(tree, work)
            proc = run(*args(), cwd=tmp_path)
            outcomes.append((proc.returncode, proc.stdout, proc.stderr, {p.name: p.read_bytes() for p in work.iterdir()}))
        assert outcomes[0] == outcomes[1]


def test_fast_path_and_typer_agree_on_stdin_help_and_errors():
    for args in (["-"], ["--diff", "-"], ["--help"], ["--bogus", "x.py"], ["--backend", "mpi", "x.py"]):
        same(distify(*args, input=CHANGES.read_bytes()), typer_distify(*args, input=CHANGES.read_bytes()))


def test_fast_path_and_typer_end_alike_on_a_closed_pipe(tmp_path):
    """`distify --diff DIR | head -c 1`: typer's main turns the broken pipe into status 1, silently."""
    for i in range(40):  # more diff than a pipe buffers
        shutil.copyfile(CHANGES, tmp_path / f"t{i}.py")
    outcomes = []
    for cmd in (["-m", "distify"], ["-c", "import sys; from distify.cli import main; main()"]):
        p = subprocess.Popen([sys.executable, *cmd, "--diff", "-q", str(tmp_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        assert p.stdout.read(1) == b"-"
        p.stdout.close()
        err = p.stderr.read()
        outcomes.append((p.wait(timeout=120), err))
    assert outcomes[0] == outcomes[1] == (1, b"")
