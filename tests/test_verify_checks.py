"""`distify verify` without launching training: the sandbox, the probe's private copies, the batch
argument, and the judgement of recorded events (tests/test_verify.py runs the real thing)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distify import verify, verify_checks
from distify.verify_checks import FAILED as FAIL, HELD as PASS, NOT_APPLICABLE, NOT_EXERCISED, Reach, Sources
from distify.verify_facts import ScriptFacts, Site


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
END = Reach(True)
STOPPED = Reach(False, "verify stopped the run", "run with --steps 0")


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
    check = verify_checks.check_shards(_loader_events([[0, 2, 4], [1, 3, 0]], 5), SOURCES)
    assert check.status == PASS and "1 padding" in check.detail


def test_shards_overlap_beyond_padding_fails_at_the_loader():
    check = verify_checks.check_shards(_loader_events([[0, 1, 2], [1, 2, 3]], 4), SOURCES)
    assert check.status == FAIL and check.where[0]["line"] == 10


def test_shards_that_miss_samples_fail():
    check = verify_checks.check_shards(_loader_events([[0, 1], [2, 3]], 8), SOURCES)
    assert check.status == FAIL and "4 never read" in check.detail


def test_shards_of_an_unfinished_pass_need_the_samplers_lengths():
    events = _loader_events([[0, 2], [1, 3]], 8, complete=False)
    check = verify_checks.check_shards(events, SOURCES)
    assert check.status == NOT_EXERCISED and "coverage is not seen" in check.detail
    for rank, evs in events.items():
        evs[0]["sampler_len"] = 4
    check = verify_checks.check_shards(events, SOURCES)
    assert check.status == PASS and "hold 4 + 4 of 8 samples" in check.detail
    for rank, evs in events.items():
        evs[0]["sampler_len"] = 2  # a sampler over a quarter of the data on each of 2 ranks
    check = verify_checks.check_shards(events, SOURCES)
    assert check.status == FAIL and "hold 4 of 8" in check.detail


def test_order_needs_two_passes_and_a_shuffle():
    check = verify_checks.check_order(_loader_events([[0, 2], [1, 3]], 4, shuffle=True), SOURCES)
    assert check.status == NOT_EXERCISED and "--epochs 2" in check.prove
    check = verify_checks.check_order(_loader_events([[0, 2], [1, 3]], 4, shuffle=False), SOURCES)
    assert check.status == NOT_APPLICABLE and "does not shuffle" in check.detail and "DistributedSampler" in check.detail


def test_params_disagreement_names_the_optimizer_line():
    events = {r: [dict(k="opt", id=0, site=["train.py", 12]), dict(k="step", opt=0, n=1, sha=sha, abs=float(r))]
              for r, sha in enumerate(["a", "b"])}
    check = verify_checks.check_params(events, SOURCES)
    assert check.status == FAIL and "after step 1" in check.detail and check.where[0]["source"] == "line 12"


def test_prints_compare_lines_with_numbers_masked():
    events = {0: [dict(k="out", text="epoch 1 loss 0.25", site=["train.py", 30])],
              1: [dict(k="out", text="epoch 1 loss 0.31", site=["train.py", 30])]}
    assert verify_checks.check_prints(events, SOURCES, END).status == FAIL
    events[1] = [dict(k="out", text="rank 1 done", site=["train.py", 31])]
    assert verify_checks.check_prints(events, SOURCES, END).status == PASS
    # the same lines from a run verify had to stop early: what came after was not seen
    assert verify_checks.check_prints(events, SOURCES, STOPPED).status == NOT_EXERCISED
    assert verify_checks.check_prints({0: [], 1: []}, SOURCES, END).status == NOT_APPLICABLE


def test_random_draws_outside_the_loop_are_not_judged():
    once = {r: [dict(k="rand", fn="randint", site=["train.py", 5], w=0, sha="s")] for r in (0, 1)}
    assert verify_checks.check_random(once, SOURCES) is None
    loop = {r: [dict(k="rand", fn="randint", site=["train.py", 20], w=w, sha=f"{w}") for w in range(3)] for r in (0, 1)}
    assert verify_checks.check_random(loop, SOURCES).status == FAIL
    loop[1] = [dict(k="rand", fn="randint", site=["train.py", 20], w=w, sha=f"r1-{w}") for w in range(3)]
    assert verify_checks.check_random(loop, SOURCES).status == PASS


def _report(*checks):
    plan = verify.Plan(Path("train.py"), [], "ddp", 20, 2, 60.0, False, False, False, None)
    runs = [verify_checks.Run(label, [], Path("."), Path("."), returncode=0) for label in ("plain python", "2 processes")]
    return verify._report(plan, list(checks), runs, [])


def test_text_and_rich_reports_name_the_failing_line():
    failing = verify.Check("prints", "log lines are printed once", FAIL, "printed by ranks [0, 1]",
                           [{"path": "train.py", "line": 53, "source": "print(f'saved {x}')"}])
    report = _report(verify.Check("migrate", "distify migrates a copy", PASS, "13 changes"), failing)
    text = verify.render_text(report)
    assert "FAILED         log lines are printed once" in text and "at train.py:53: print(f'saved {x}')" in text
    assert text.rstrip().endswith("verdict: FAILED - 1 check failed: log lines are printed once")
    import io

    from rich.console import Console

    buffer = io.StringIO()
    verify.render_rich(report, Console(file=buffer, width=200))
    assert "train.py:53" in buffer.getvalue() and "ranks [0, 1]" in buffer.getvalue()


def test_verdict_is_ok_only_when_every_applicable_check_was_exercised():
    held = verify.Check("params", "ranks agree", PASS, "ok")
    na = verify.Check("order", "order", NOT_APPLICABLE, "the loader does not shuffle")
    report = _report(held, na)
    assert (report["verdict"], report["exit_code"]) == ("ok", 0)
    assert "verdict: OK - 1 check holds, 1 not applicable to this script" in verify.render_text(report)
    unseen = verify.Check("writers", "one rank writes each file", NOT_EXERCISED, "the save never ran",
                          [{"path": "train.py", "line": 40, "source": "torch.save(m, p)"}], prove="pass --save-model")
    report = _report(held, na, unseen)
    assert (report["verdict"], report["exit_code"]) == ("not_proven", verify.EXIT_NOT_PROVEN) and verify.EXIT_NOT_PROVEN not in (0, 1, 2)
    text = verify.render_text(report)
    assert "verdict: NOT PROVEN - 1 check not exercised: one rank writes each file" in text
    assert "to prove it: pass --save-model" in text and "at train.py:40: torch.save(m, p)" in text
    failing = verify.Check("prints", "printed once", FAIL, "twice")
    assert _report(held, unseen, failing)["verdict"] == "failed"  # a failure outranks what was not seen
    assert json.loads(json.dumps(report))["checks"][2]["prove"] == "pass --save-model"


def test_shards_of_a_stream_are_not_claimed():
    events = _loader_events([[], []], None)
    for evs in events.values():
        evs[:] = [e for e in evs if e["k"] != "batch"]
    assert verify_checks.check_shards(events, SOURCES).status == NOT_APPLICABLE


@pytest.mark.parametrize("argv", [[], ["train.py", "--bogus"], ["missing.py"], ["train.py", "--against-original"],
                                  ["train.py", "--backend", "mpi"]])
def test_usage_errors_exit_2(argv, tmp_path, monkeypatch, capsys):
    (tmp_path / "train.py").write_text("import torch\n")
    monkeypatch.chdir(tmp_path)
    assert verify.main(argv) == 2
    assert "Traceback" not in capsys.readouterr().err


def _run_with(tmp_path, events, name="multi"):
    """A Run whose records are `events` (rank -> list), written where the probe would write them."""
    records = tmp_path / name
    records.mkdir()
    for rank, evs in events.items():
        (records / f"rank{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    return verify_checks.Run(name, [], records, tmp_path, returncode=0)


SAVE = ScriptFacts(saves=(Site(40, 41, "torch.save(model.module.state_dict(), path)"),))


def test_a_save_that_never_ran_is_not_exercised_and_named(tmp_path):
    """The script has a torch.save at line 40 that the run did not reach: writers and prefix are not
    exercised (not held) and say where; once a write from that line is recorded both hold."""
    run = _run_with(tmp_path, {0: [dict(k="out", text="done", site=["train.py", 9])], 1: []})
    writers = verify_checks.check_writers(run, SOURCES, str(tmp_path / "records"), SAVE, END)
    prefix = verify_checks.check_prefix([run, run], None, SOURCES, SAVE, END)
    for check in (writers, prefix):
        assert check.status == NOT_EXERCISED and check.where[0]["line"] == 40 and "arguments that reach" in check.prove
    # no save in the script and nothing written: the checks cannot apply
    assert verify_checks.check_writers(run, SOURCES, str(tmp_path / "records"), ScriptFacts(), END).status == NOT_APPLICABLE
    saved = _run_with(tmp_path, {0: [dict(k="write", path=str(tmp_path / "m.pt"), how="torch.save", prefixed=False,
                                           site=["train.py", 41])], 1: []}, "saved")
    (tmp_path / "m.pt").write_bytes(b"")
    assert verify_checks.check_writers(saved, SOURCES, str(tmp_path / "records"), SAVE, END).status == PASS
    assert verify_checks.check_prefix([saved, saved], None, SOURCES, SAVE, END).status == PASS
    # stopped early: the end of the script was not reached, whatever the script's saves
    assert verify_checks.check_writers(saved, SOURCES, str(tmp_path / "records"), ScriptFacts(), STOPPED).status == NOT_EXERCISED


def _eval_events(reduce: bool, sharded: bool = True):
    events = {}
    for rank in (0, 1):
        evs = [dict(k="loader", id=0, site=["train.py", 10], sampler="DistributedSampler", shuffle=False, len=4, batch_size=2),
               dict(k="loader", id=1, site=["train.py", 11], sampler="ShardSampler", shuffle=False, len=4, batch_size=2),
               dict(k="pass", loader=0, p=0), dict(k="batch", loader=0, p=0, i=[rank]), dict(k="step", opt=0, n=1, sha="a", abs=1.0),
               dict(k="train", loader=0, opt=0), dict(k="pass", loader=1, p=0),
               dict(k="batch", loader=1, p=0, i=[rank * 2, rank * 2 + 1] if sharded else [0, 1, 2, 3]),
               dict(k="end", loader=1, p=0)]
        if reduce:
            evs.append(dict(k="coll", fn="all_reduce", site=["train.py", 30]))
        evs.append(dict(k="out", text="acc 0.5", site=["train.py", 31]))
        events[rank] = evs
    return events


def test_metrics_of_a_sharded_evaluation_must_be_reduced():
    check = verify_checks.check_metrics(_eval_events(reduce=False), SOURCES, END)
    assert check.status == FAIL and check.where[0]["line"] == 11 and "covers one shard" in check.detail
    check = verify_checks.check_metrics(_eval_events(reduce=True), SOURCES, END)
    assert check.status == PASS and check.where[0]["line"] == 30
    # every rank evaluates the whole set: nothing needs reducing
    assert verify_checks.check_metrics(_eval_events(reduce=False, sharded=False), SOURCES, END).status == PASS


def test_weights_are_not_judged_over_dropout_and_say_where(tmp_path):
    step = dict(k="step", opt=0, n=3, sha="a", abs=1.0)
    multi = _run_with(tmp_path, {0: [dict(k="snapshot", n=3), step, dict(k="dropout", fn="dropout", p=0.5, site=["train.py", 22])]})
    original = _run_with(tmp_path, {0: [dict(k="snapshot", n=3), step]}, "original")
    check = verify_checks.check_weights(multi, original, 2, "--batch-size 32", {"max_abs_diff": 0.3}, SOURCES)
    assert check.status == NOT_EXERCISED and "dropout (train.py:22: line 22)" in check.detail and "0.3" in check.detail
    # a draw made once, before training (a dataset generated at start), does not stop the comparison
    quiet = _run_with(tmp_path, {0: [dict(k="rand", fn="randint", site=["train.py", 5], w=0, sha="s"), dict(k="snapshot", n=3), step]}, "quiet")
    assert verify_checks.check_weights(quiet, original, 2, "x", {"max_abs_diff": 0.3}, SOURCES).status == FAIL
    assert verify_checks.check_weights(quiet, original, 2, "x", {"max_abs_diff": 1e-6}, SOURCES).status == PASS


def test_training_permutations_follow_the_ranks_sampler():
    events = _loader_events([[0, 2], [1, 3]], 4, shuffle=True)
    events[0][1:1] = [dict(k="pass", loader=0, p=0, seed=5, epoch=0), dict(k="pass", loader=0, p=1, seed=5, epoch=1)]
    assert verify_checks.training_permutations(events) == {"0": [[5, 0], [5, 1]]}


PROBED = '''\
import sys
import torch
import torch.nn as nn
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset, RandomSampler
from torch.utils.data.distributed import DistributedSampler

data = TensorDataset(torch.arange(40.0).reshape(20, 2))
loader = DataLoader(data, batch_size=2, shuffle=True)


class Noisy(torch.utils.data.Dataset):  # augmentation: a draw per sample, here in a worker process
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.rand(2) + i


for _ in DataLoader(Noisy(), batch_size=2, num_workers=1):
    pass
model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(4):
    for (x,) in loader:
        model(x).sum().backward()
        opt.step()
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[1], rank=0, world_size=1)
dist.all_reduce(torch.zeros(1))
print("the end")
reference = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=7)
reference.set_epoch(1)
print("ranks drew", list(reference))
'''


@pytest.mark.e2e
def test_probe_drains_passes_records_and_aligns(tmp_path):
    """One plain run under the probe: after 3 steps the pass in progress ends and each later pass
    yields one batch, so the code after the loop runs; the dropout, the collective and a worker's
    augmentation are recorded; and with DISTIFY_VERIFY_PERMS the RandomSampler draws the
    DistributedSampler's permutation."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run, records = tmp_path / "run", tmp_path / "records"
    run.mkdir()
    records.mkdir()
    copy, workdir = verify.build_sandbox(run, tmp_path / "train.py", PROBED.encode(), tmp_path)
    env = verify.child_env({"DISTIFY_VERIFY_SCRIPT": str(copy), "DISTIFY_VERIFY_RECORDS": str(records),
                            "DISTIFY_VERIFY_SANDBOX": str(run), "DISTIFY_VERIFY_STEPS": "3",
                            "DISTIFY_VERIFY_PERMS": json.dumps({"0": [[7, 0], [7, 1]]})})
    out = subprocess.run([sys.executable, str(copy), str(port)], cwd=str(workdir), env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in (records / "rank0.jsonl").read_text().splitlines()]
    kinds = [e["k"] for e in events]
    assert kinds.count("step") == 3 + 3 and "drain" in kinds and "the end" in out.stdout  # passes 1-3: one batch each
    batches = {}
    for e in events:
        if e["k"] == "batch" and e["loader"] == 0:
            batches.setdefault(e["p"], []).extend(e["i"])
    assert [len(batches[p]) for p in range(4)] == [6, 2, 2, 2]
    assert any(e["k"] == "end" and e.get("cut") for e in events)
    assert any(e["k"] == "dropout" and e["site"] == ["train.py", 26] for e in events)
    assert any(e["k"] == "coll" and e["fn"] == "all_reduce" and e["site"] == ["train.py", 29] for e in events)
    assert [e["loader"] for e in events if e["k"] == "datarng"] == [1]  # the augmenting loader, not the plain one
    assert any(e["k"] == "aligned" for e in events)
    drew = json.loads(out.stdout.split("ranks drew", 1)[1].strip().replace("'", '"'))
    assert batches[1] == drew[:2]  # pass 1 of the original = the DistributedSampler's epoch-1 order


def test_json_report_matches_the_schema_the_readme_documents():
    """Every key of the report, of a check and of a run is in the README's schema block and the other
    way round; so are the verdicts and the check states."""
    import re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### The JSON report", 1)[1]
    schema = section.split("```", 2)[1]
    documented = set(re.findall(r'"(\w+)":', schema))
    check = verify.Check("writers", "one rank writes each file", NOT_EXERCISED, "never ran",
                         [{"path": "train.py", "line": 4, "source": "x"}], prove="p")
    report = _report(check)
    keys = set(report) | set(report["checks"][0]) | set(report["runs"][0]) | set(report["checks"][0]["where"][0])
    assert keys == documented
    assert {f'"{v}"' for v in ("ok", "failed", "not_proven", "held", "not_exercised", "not_applicable")} <= set(re.findall(r'"\w+"', schema))
    assert f"exit_code\": 0|1|{verify.EXIT_NOT_PROVEN}" in schema and f'"schema": {verify.SCHEMA_VERSION}' in schema


def test_script_facts_name_every_save_with_its_lines():
    """The save sites come from the anatomy: through an alias, under a condition, spanning lines;
    a script that does not parse has none (its runs say why)."""
    from distify.verify_facts import script_facts

    text = ("import torch as T\nimport argparse\nargs = argparse.ArgumentParser().parse_args()\n"
            "def save(m, path):\n    T.save(\n        m.state_dict(), path)\n"
            "if args.save:\n    save(1, 'x')\nprint('torch.save(model)')\n")
    facts = script_facts(text)
    assert [(s.first, s.last, s.source) for s in facts.saves] == [(5, 6, "T.save(")]
    assert facts.saves[0].covers(6) and not facts.saves[0].covers(7)
    assert script_facts("def (:\n").readable is False


RANDOM_PROBED = '''\
import random
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):  # numpy's global generator, per sample
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor(np.random.normal(size=2), dtype=torch.float32) + i


class Held(Dataset):  # a generator object the dataset keeps, built by a class the probe does not wrap
    def __init__(self):
        self.state = np.random.RandomState(0)

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((2,), float(self.state.randint(3)))


class Plain(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((2,), float(i))


def jitter(batch):  # Python's random in a collate
    return torch.stack(batch) * random.uniform(0.9, 1.1)


np.random.seed(0)
table = np.random.rand(3)  # seeded: both runs draw the same
first = random.random()  # nobody seeded Python's random: the runs draw different numbers
rng = np.random.default_rng()
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for loader in (DataLoader(Augmented(), batch_size=2), DataLoader(Held(), batch_size=2), DataLoader(Plain(), batch_size=2, collate_fn=jitter)):
    for x in loader:
        (model(x).sum() * float(rng.random())).backward()
        opt.step()
'''


def _probe_run(tmp_path, text: str, name: str = "run", **env_extra) -> list:
    """The records of one plain run of `text` as train.py under the probe (and its stdout, last)."""
    run, records = tmp_path / name, tmp_path / f"{name}-records"
    run.mkdir()
    records.mkdir()
    copy, workdir = verify.build_sandbox(run, tmp_path / "train.py", text.encode(), tmp_path)
    env = verify.child_env({"DISTIFY_VERIFY_SCRIPT": str(copy), "DISTIFY_VERIFY_RECORDS": str(records),
                            "DISTIFY_VERIFY_SANDBOX": str(run), "DISTIFY_VERIFY_RANDOM": verify._RANDOM_SPEC, **env_extra})
    out = subprocess.run([sys.executable, str(copy)], cwd=str(workdir), env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in (records / "rank0.jsonl").read_text().splitlines()] + [out.stdout]


@pytest.mark.e2e
def test_probe_sees_python_and_numpy_draws_while_batches_are_made_and_in_steps(tmp_path):
    """Which generator drew while each loader made its batches (numpy's global one in __getitem__, a
    RandomState the dataset holds, Python's random in a collate), which drew in the training step (an
    unseeded default_rng), and where user code drew before training, seeded or not."""
    events = _probe_run(tmp_path, RANDOM_PROBED)[:-1]
    assert sorted((e["loader"], e["lib"]) for e in events if e["k"] == "datarng") == [
        (0, "numpy.random"), (1, "numpy.random"), (2, "random")]
    assert {lib for e in events if e["k"] == "step" for lib in e["rngs"]} == {"numpy.random"}
    assert not any(e["rng"] for e in events if e["k"] == "step")  # torch's generator never drew in a step
    draws = {(e["lib"], e["site"][1], e["phase"], e["seeded"]) for e in events if e["k"] == "draw"}
    assert draws == {("numpy.random", 12, "data", True), ("random", 35, "data", False),
                     ("numpy.random", 39, "setup", True), ("random", 40, "setup", False)}
    assert [e["drew"] for e in events if e["k"] == "gens"] == [[["numpy.random", ["train.py", 41], False]]]
    assert [e["paths"] for e in events if e["k"] == "modules"] == [["train.py"]]


def test_weights_are_not_judged_over_python_or_numpy_randomness_and_say_where(tmp_path):
    """Randomness the runs cannot draw alike, each named with its line: numpy in the data pipeline
    (the probe's draw site), a generator drawn in the step (the facts' site), an unseeded draw before
    training, a RandomState the probe cannot watch. A seeded draw before training stops nothing."""
    base = [dict(k="loader", id=0, site=["train.py", 5], shuffle=True), dict(k="train", loader=0, opt=0),
            dict(k="snapshot", n=3), dict(k="aligned", loader=0)]
    step = dict(k="step", opt=0, n=3, sha="a", abs=1.0, rng=False, rngs=[])
    original = _run_with(tmp_path, {0: base + [dict(k="aligned", loader=0), step]}, "original")
    diff = {"max_abs_diff": 0.3}

    def judged(name, extra, facts=None, step=step):
        return verify_checks.check_weights(_run_with(tmp_path, {0: base + [step] + extra}, name), original, 2, "x", diff,
                                           SOURCES, facts)

    augment = judged("augment", [dict(k="datarng", loader=0, lib="numpy.random"),
                                 dict(k="draw", lib="numpy.random", fn="normal", site=["train.py", 12], phase="data", seeded=True)])
    assert augment.status == NOT_EXERCISED, augment.detail
    assert "draws from numpy.random while batches are made" in augment.detail and "train.py:12: line 12" in augment.detail
    generator = ScriptFacts(draws=(Site(30, 30, "rng.random()", "train.py", "numpy.random", "numpy.random.default_rng"),))
    stepped = judged("stepped", [], generator, dict(step, rngs=["numpy.random"]))
    assert stepped.status == NOT_EXERCISED and "training step draws from numpy.random (train.py:30: line 30)" in stepped.detail
    # a numpy function the probe never saw called is not named: it did not run (the probe sees every such call)
    both = ScriptFacts(draws=generator.draws + (Site(31, 31, "np.random.rand()", "train.py", "numpy.random"),))
    stepped = judged("both", [], both, dict(step, rngs=["numpy.random"]))
    assert "line 30" in stepped.detail and "line 31" not in stepped.detail
    unseeded = judged("unseeded", [dict(k="draw", lib="random", fn="shuffle", site=["train.py", 8], phase="setup", seeded=False)])
    assert unseeded.status == NOT_EXERCISED and "does not seed" in unseeded.detail and "train.py:8" in unseeded.detail
    held = ScriptFacts(draws=(Site(20, 20, "s.randint(3)", "train.py", "numpy.random", "numpy.random.RandomState"),))
    unwatched = judged("unwatched", [], held)
    assert unwatched.status == NOT_EXERCISED and "cannot watch (train.py:20" in unwatched.detail
    seeded = judged("seeded", [dict(k="draw", lib="numpy.random", fn="rand", site=["train.py", 8], phase="setup", seeded=True)],
                    ScriptFacts(draws=(Site(8, 8, "np.random.rand(3)", "train.py", "numpy.random"),)))
    assert seeded.status == FAIL, seeded.detail  # judged: 0.3 apart


def test_draw_sites_resolve_through_imports_and_generator_bindings():
    """Draw sites by what the callee is: a numpy function through any alias, a method of a generator
    bound to default_rng/Random (in __init__, also as one branch of a conditional expression, used in
    another method), a fresh generator's method;
    random.seed and a method of an object that is not a generator are not draws."""
    from distify.verify_facts import script_facts

    text = ("import numpy as xp\nimport random as chance\nfrom numpy.random import default_rng as make\n"
            "class Data:\n    def __init__(self):\n        self.source = make(0)\n        self.other = chance.Random(1) if xp else None\n"
            "        self.plain = dict()\n"
            "    def __getitem__(self, i):\n        chance.seed(i)\n        a = self.source.normal()\n"
            "        b = self.other.random() + self.plain.get(i, 0)\n"
            "        return xp.random.rand(2) + xp.random.default_rng(i).integers(3) + chance.random()\n")
    draws = {(d.first, d.lib, d.via) for d in script_facts(text, "data.py").draws}
    assert draws == {(11, "numpy.random", "numpy.random.default_rng"), (12, "random", "random.Random"),
                     (13, "numpy.random", ""), (13, "numpy.random", "numpy.random.default_rng"), (13, "random", "")}


def test_a_save_in_a_helper_module_that_never_ran_is_named(tmp_path):
    """The project's facts cover every module the runs imported (the probe's `modules` record): a
    save in utils.py under a condition the run did not meet leaves writers not exercised, naming
    utils.py's line -- the script's own facts alone would let it pass. A write from that line holds."""
    from distify.verify_facts import project_facts, script_facts

    script = "import utils\nutils.train()\n"
    helper = "import torch\n\ndef train(save=False):\n    if save:\n        torch.save({}, 'ckpt.pt')\n"
    run = _run_with(tmp_path, {0: [dict(k="modules", paths=["train.py", "utils.py"])], 1: []})
    (tmp_path / "train.py").write_text(script)
    (tmp_path / "utils.py").write_text(helper)
    modules = verify._imported_modules([run], tmp_path)
    assert [path for path, _ in modules] == ["train.py", "utils.py"]
    facts = project_facts([("train.py", script), *modules])
    writers = verify_checks.check_writers(run, SOURCES, str(tmp_path / "records"), facts, END)
    assert writers.status == NOT_EXERCISED and [(w["path"], w["line"]) for w in writers.where] == [("utils.py", 5)]
    assert verify_checks.check_writers(run, SOURCES, str(tmp_path / "records"), script_facts(script), END).status == NOT_APPLICABLE
    saved = _run_with(tmp_path, {0: [dict(k="write", path=str(tmp_path / "ckpt.pt"), how="torch.save", prefixed=False,
                                           site=["utils.py", 5])], 1: []}, "saved")
    (tmp_path / "ckpt.pt").write_bytes(b"")
    assert verify_checks.check_writers(saved, SOURCES, str(tmp_path / "records"), facts, END).status == PASS
    # the same line number in another module is not that save
    elsewhere = _run_with(tmp_path, {0: [dict(k="write", path=str(tmp_path / "ckpt.pt"), how="torch.save", prefixed=False,
                                               site=["train.py", 5])], 1: []}, "elsewhere")
    assert verify_checks.check_writers(elsewhere, SOURCES, str(tmp_path / "records"), facts, END).status == NOT_EXERCISED


def test_sandbox_of_a_package_mirrors_its_project_root_and_writes_rewritten_modules(tmp_path):
    """Run from inside a package (cwd proj/pkg): the sandbox mirrors the package root (proj), so
    `from pkg import helpers` and `..`-relative paths resolve; a module the migration rewrote is a
    real file with the new text, every other entry a link; the run's working directory is real."""
    proj = tmp_path / "proj"
    (proj / "pkg" / "sub").mkdir(parents=True)
    (proj / "pkg" / "__init__.py").write_text("")
    (proj / "pkg" / "train.py").write_text("original")
    (proj / "pkg" / "sub" / "helpers.py").write_text("helpers")
    (proj / "pkg" / "sub" / "other.py").write_text("other")
    (proj / "data").mkdir()
    run = tmp_path / "run"
    run.mkdir()
    copy, workdir = verify.build_sandbox(run, proj / "pkg" / "train.py", b"migrated", proj / "pkg", proj,
                                         {proj / "pkg" / "sub" / "helpers.py": b"rewritten"})
    assert copy == run / "pkg" / "train.py" and workdir == run / "pkg" and not workdir.is_symlink()
    assert (run / "data").is_symlink() and (run / "pkg" / "__init__.py").is_symlink()
    assert not (run / "pkg" / "sub").is_symlink() and (run / "pkg" / "sub" / "other.py").is_symlink()
    assert (run / "pkg" / "sub" / "helpers.py").read_bytes() == b"rewritten" and not (run / "pkg" / "sub" / "helpers.py").is_symlink()
    assert (proj / "pkg" / "sub" / "helpers.py").read_text() == "helpers" and (proj / "pkg" / "train.py").read_text() == "original"
    # the working directory elsewhere in the project is real too (a link would resolve to the user's folder)
    (proj / "scripts").mkdir()
    run2 = tmp_path / "run2"
    run2.mkdir()
    copy, workdir = verify.build_sandbox(run2, proj / "pkg" / "train.py", b"m", proj / "scripts", proj)
    assert workdir == run2 / "scripts" and workdir.is_dir() and not workdir.is_symlink()
    with pytest.raises(verify.VerifyError):
        verify.build_sandbox(tmp_path / "run3", proj / "pkg" / "train.py", b"m", proj, proj, {tmp_path / "outside.py": b"x"})


ALIGNED_PROBED = '''\
import json
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor(np.random.normal(size=2)) + torch.rand(1)


seen = {}
for order in ([0, 1, 2, 3], [3, 1, 2, 0], [2, 3, 0, 1]):
    for i, x in zip(order, DataLoader(Augmented(), batch_size=1, sampler=order)):
        seen.setdefault(i, []).append(x.tolist())
print(json.dumps(seen))
'''


@pytest.mark.e2e
def test_probe_draws_the_same_augmentation_for_the_same_sample_against_the_original(tmp_path):
    """With --against-original (DISTIFY_VERIFY_SNAPSHOT=1) each sample draws from torch's and numpy's
    global generators seeded by its index: whatever the order it is fetched in, a sample gets the
    same noise, so a run at N ranks and the original draw alike; the records say it is aligned.
    Without it (the control), the same sample gets different noise on each pass."""
    *events, out = _probe_run(tmp_path, ALIGNED_PROBED, "aligned", DISTIFY_VERIFY_SNAPSHOT="1")
    seen = json.loads(out)
    assert all(len({json.dumps(v) for v in values}) == 1 for values in seen.values()), seen
    assert sorted({(e["lib"], e["aligned"]) for e in events if e["k"] == "datarng"}) == [("numpy.random", True), ("torch", True)]
    *events, out = _probe_run(tmp_path, ALIGNED_PROBED, "free")
    assert all(len({json.dumps(v) for v in values}) == 3 for values in json.loads(out).values())
    assert sorted({(e["lib"], e["aligned"]) for e in events if e["k"] == "datarng"}) == [("numpy.random", False), ("torch", False)]
    # the generators a Dataset keeps, and draws in a collate, are out of the seeding's reach
    events = _probe_run(tmp_path, RANDOM_PROBED, "held", DISTIFY_VERIFY_SNAPSHOT="1")[:-1]
    assert sorted((e["loader"], e["lib"], e["aligned"]) for e in events if e["k"] == "datarng") == [
        (0, "numpy.random", True), (1, "numpy.random", False), (2, "random", False)]


def _plan(script: Path, **kw) -> "verify.Plan":
    return verify.Plan(script, [], "ddp", 20, 2, 60.0, False, False, kw.pop("against", False), kw.pop("batch", None), **kw)


def test_verify_migrates_the_project_and_runs_the_rewritten_modules(tmp_path, monkeypatch):
    """verify takes what distify's project migration rewrote: the script and each module of the
    project, written into the sandboxes of the migrated runs (the original of --against-original
    runs the user's modules); the user's files are untouched."""
    from distify import project as project_mod
    from distify.engine import FileResult, Status

    home = tmp_path / "proj"
    home.mkdir()
    (home / "train.py").write_bytes(b"import helpers\n")
    (home / "helpers.py").write_bytes(b"old = 1\n")
    (home / "data.txt").write_text("d")

    def fake_migrate_project(paths, options, mode=None):
        return project_mod.ProjectResult(str(home), (
            FileResult(str(home / "train.py"), Status.CHANGED, source=b"import helpers\n", output=b"import helpers  # new\n"),
            FileResult(str(home / "helpers.py"), Status.CHANGED, source=b"old = 1\n", output=b"new = 1\n")), ())

    seen = {}

    def fake_execute(run, workdir, env, timeout, log):
        seen[run.label] = {p.name: (p.read_bytes(), p.is_symlink()) for p in sorted(run.sandbox.iterdir())}
        run.returncode = 0

    monkeypatch.setattr(project_mod, "migrate_project", fake_migrate_project)
    monkeypatch.setattr(verify, "execute", fake_execute)
    monkeypatch.setattr(verify, "compare_weights", lambda a, b: {})
    monkeypatch.chdir(home)
    report = verify.verify(_plan(home / "train.py", against=True, batch="batch-size"))
    assert "in 2 files" in report["checks"][0]["detail"], report["checks"][0]
    plain, multi, original = (seen[label] for label in ("plain python", "2 processes", "original: 2 x the default of --batch-size"))
    for run in (plain, multi):
        assert run["train.py"] == (b"import helpers  # new\n", False) and run["helpers.py"] == (b"new = 1\n", False)
        assert run["data.txt"][1] is True
    assert original["train.py"] == (b"import helpers\n", False) and original["helpers.py"] == (b"old = 1\n", True)
    assert (home / "helpers.py").read_bytes() == b"old = 1\n"

