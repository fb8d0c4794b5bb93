"""`distify verify` without launching training: the sandbox, the probe's private copies, the batch
argument, and the judgement of recorded events (tests/test_verify.py runs the real thing)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distify import verify
from distify.verify import FAIL, PASS, SKIP, Sources


def test_sandbox_mirrors_the_users_directory(tmp_path):
    home = tmp_path / "proj"
    (home / "data").mkdir(parents=True)
    (home / "data" / "train.csv").write_text("1,2\n")
    (home / "src").mkdir()
    (home / "src" / "train.py").write_text("original")
    (home / "src" / "models.py").write_text("models")
    run = tmp_path / "run"
    run.mkdir()
    copy, workdir = verify.build_sandbox(run, home / "src" / "train.py", b"migrated", home)
    assert workdir == run and copy == run / "src" / "train.py"
    assert copy.read_bytes() == b"migrated" and not copy.is_symlink()
    assert (run / "src").is_dir() and not (run / "src").is_symlink()  # real: the copy lives in it
    assert (run / "data").is_symlink() and (run / "data" / "train.csv").read_text() == "1,2\n"
    assert (run / "src" / "models.py").is_symlink()
    assert (home / "src" / "train.py").read_text() == "original"


def test_sandbox_of_a_script_outside_the_current_directory(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    script = tmp_path / "elsewhere" / "train.py"
    script.write_text("x")
    (tmp_path / "elsewhere" / "data.bin").write_text("d")
    (tmp_path / "cwd").mkdir()
    run = tmp_path / "run"
    run.mkdir()
    copy, workdir = verify.build_sandbox(run, script, b"y", tmp_path / "cwd")
    assert copy == run / "train.py" and workdir == run and (run / "data.bin").is_symlink()


WRITER = '''\
import os, sys
os.makedirs("out/new", exist_ok=True)
with open("out/log.txt", "a") as fh:
    fh.write("run\\n")
with open("out/new/x.txt", "w") as fh:
    fh.write("x")
with open("top.txt", "w") as fh:
    fh.write("t")
print("hello from", os.getpid())
'''


def test_probe_writes_land_in_the_sandbox_not_the_users_files(tmp_path):
    """Writing through a link to the user's folder (append to an existing log, a new subfolder) makes
    private copies first: the user's files stay as they were, the run sees its own writes."""
    home = tmp_path / "home"
    (home / "out").mkdir(parents=True)
    (home / "out" / "log.txt").write_text("user\n")
    (home / "train.py").write_text(WRITER)
    run = tmp_path / "run"
    records = tmp_path / "records"
    run.mkdir()
    records.mkdir()
    copy, workdir = verify.build_sandbox(run, home / "train.py", WRITER.encode(), home)
    env = verify.child_env({"DISTIFY_VERIFY_SCRIPT": str(copy), "DISTIFY_VERIFY_RECORDS": str(records),
                            "DISTIFY_VERIFY_SANDBOX": str(run)})
    subprocess.run([sys.executable, str(copy)], cwd=str(workdir), env=env, check=True, capture_output=True)
    assert (home / "out" / "log.txt").read_text() == "user\n"
    assert sorted(p.name for p in (home / "out").iterdir()) == ["log.txt"] and not (home / "top.txt").exists()
    assert (run / "out" / "log.txt").read_text() == "user\nrun\n" and (run / "out" / "new" / "x.txt").read_text() == "x"
    events = [json.loads(line) for line in (records / "rank0.jsonl").read_text().splitlines()]
    written = {os.path.relpath(e["path"], run.resolve()) for e in events if e["k"] == "write"}
    assert {"out/log.txt", "out/new/x.txt", "top.txt"} <= written
    out = [e for e in events if e["k"] == "out"]
    assert out and out[0]["text"].startswith("hello from") and out[0]["site"] == ["train.py", 9]


def test_probe_is_inactive_in_other_processes(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    env = verify.child_env({"DISTIFY_VERIFY_SCRIPT": str(tmp_path / "train.py"), "DISTIFY_VERIFY_RECORDS": str(records)})
    subprocess.run([sys.executable, "-c", "open('x', 'w').write('1')"], cwd=str(tmp_path), env=env, check=True)
    assert list(records.iterdir()) == []


@pytest.mark.parametrize("args,name,expected", [
    (["--batch-size", "16", "--lr", "1"], "--batch-size", (["--batch-size", "32", "--lr", "1"], None)),
    (["--batch-size=16"], "batch-size", (["--batch-size=32"], None)),
    (["--batch_size", "8"], "batch_size", (["--batch_size", "16"], None)),
    (["--lr", "1"], "--batch-size", (["--lr", "1"], "batch_size")),
])
def test_scale_batch(args, name, expected):
    out, dest, _ = verify.scale_batch(args, name, 2)
    assert (out, dest) == expected


def test_scale_batch_rejects_a_non_integer():
    with pytest.raises(verify.VerifyError):
        verify.scale_batch(["--batch-size", "big"], "--batch-size", 2)


SOURCES = Sources("train.py", "\n".join(f"line {i}" for i in range(1, 60)), Path("."))


def _loader_events(shards, length, complete=True, shuffle=False):
    """rank -> events of one training loader whose pass 0 yielded `shards[rank]`."""
    events = {}
    for rank, indices in enumerate(shards):
        evs = [dict(k="loader", id=0, site=["train.py", 10], sampler="DistributedSampler", shuffle=shuffle, len=length,
                    batch_size=2, drop_last=False, replicas=len(shards)),
               dict(k="batch", loader=0, p=0, i=indices), dict(k="opt", id=0, site=["train.py", 12]),
               dict(k="step", opt=0, n=1, sha="a", abs=1.0), dict(k="train", loader=0, opt=0)]
        if complete:
            evs.append(dict(k="end", loader=0, p=0))
        events[rank] = evs
    return events


def test_shards_padding_up_to_n_minus_1_is_reported_not_failed():
    # DistributedSampler over 5 samples on 2 ranks pads with sample 0
    check = verify.check_shards(_loader_events([[0, 2, 4], [1, 3, 0]], 5), SOURCES)
    assert check.status == PASS and "1 padding" in check.detail


def test_shards_overlap_beyond_padding_fails_at_the_loader():
    check = verify.check_shards(_loader_events([[0, 1, 2], [1, 2, 3]], 4), SOURCES)
    assert check.status == FAIL and check.where[0]["line"] == 10


def test_shards_that_miss_samples_fail():
    check = verify.check_shards(_loader_events([[0, 1], [2, 3]], 8), SOURCES)
    assert check.status == FAIL and "4 never read" in check.detail


def test_shards_of_an_unfinished_pass_are_only_checked_for_overlap():
    check = verify.check_shards(_loader_events([[0, 2], [1, 3]], 8, complete=False), SOURCES)
    assert check.status == PASS and "did not finish" in check.detail


def test_order_needs_two_passes():
    check = verify.check_order(_loader_events([[0, 2], [1, 3]], 4, shuffle=True), SOURCES, 20)
    assert check.status == SKIP and "raise --steps" in check.detail


def test_params_disagreement_names_the_optimizer_line():
    events = {r: [dict(k="opt", id=0, site=["train.py", 12]), dict(k="step", opt=0, n=1, sha=sha, abs=float(r))]
              for r, sha in enumerate(["a", "b"])}
    check = verify.check_params(events, SOURCES)
    assert check.status == FAIL and "after step 1" in check.detail and check.where[0]["source"] == "line 12"


def test_prints_compare_lines_with_numbers_masked():
    events = {0: [dict(k="out", text="epoch 1 loss 0.25", site=["train.py", 30])],
              1: [dict(k="out", text="epoch 1 loss 0.31", site=["train.py", 30])]}
    assert verify.check_prints(events, SOURCES).status == FAIL
    events[1] = [dict(k="out", text="rank 1 done", site=["train.py", 31])]
    assert verify.check_prints(events, SOURCES).status == PASS


def test_random_draws_outside_the_loop_are_not_judged():
    once = {r: [dict(k="rand", fn="randint", site=["train.py", 5], w=0, sha="s")] for r in (0, 1)}
    assert verify.check_random(once, SOURCES) is None
    loop = {r: [dict(k="rand", fn="randint", site=["train.py", 20], w=w, sha=f"{w}") for w in range(3)] for r in (0, 1)}
    assert verify.check_random(loop, SOURCES).status == FAIL
    loop[1] = [dict(k="rand", fn="randint", site=["train.py", 20], w=w, sha=f"r1-{w}") for w in range(3)]
    assert verify.check_random(loop, SOURCES).status == PASS


def _report(*checks):
    plan = verify.Plan(Path("train.py"), [], "ddp", 20, 2, 60.0, False, False, False, None)
    runs = [verify.Run(label, [], Path("."), Path("."), returncode=0) for label in ("plain python", "2 processes")]
    return verify._report(plan, list(checks), runs, [])


def test_text_and_rich_reports_name_the_failing_line():
    failing = verify.Check("prints", "log lines are printed once", FAIL, "printed by ranks [0, 1]",
                           [{"path": "train.py", "line": 53, "source": "print(f'saved {x}')"}])
    report = _report(verify.Check("migrate", "distify migrates a copy", PASS, "13 changes"), failing)
    text = verify.render_text(report)
    assert "FAIL  log lines are printed once" in text and "at train.py:53: print(f'saved {x}')" in text
    assert text.rstrip().endswith("verdict: FAILED - 1 check failed: log lines are printed once")
    import io

    from rich.console import Console

    buffer = io.StringIO()
    verify.render_rich(report, Console(file=buffer, width=200))
    assert "train.py:53" in buffer.getvalue() and "ranks [0, 1]" in buffer.getvalue()


def test_all_passing_report_is_ok():
    report = _report(verify.Check("params", "ranks agree", PASS, "ok"), verify.Check("order", "order", SKIP, "n/a"))
    assert report["verdict"] == PASS and "verdict: OK - 1 check holds (1 not applicable)" in verify.render_text(report)


def test_shards_of_a_stream_are_not_claimed():
    events = _loader_events([[], []], None)
    for evs in events.values():
        evs[:] = [e for e in evs if e["k"] != "batch"]
    assert verify.check_shards(events, SOURCES).status == SKIP


@pytest.mark.parametrize("argv", [[], ["train.py", "--bogus"], ["missing.py"], ["train.py", "--against-original"],
                                  ["train.py", "--backend", "mpi"]])
def test_usage_errors_exit_2(argv, tmp_path, monkeypatch, capsys):
    (tmp_path / "train.py").write_text("import torch\n")
    monkeypatch.chdir(tmp_path)
    assert verify.main(argv) == 2
    assert "Traceback" not in capsys.readouterr().err
