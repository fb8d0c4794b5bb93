"""`distify verify`: it says OK on distify's own migrations of every scenario style for each backend,
and on a migrated script broken on purpose it says FAILED (the check about that bug failing) or "not
proven", never OK -- all at the default settings (no --steps), which is what users run.

Every test here runs the command as a user does (`distify verify ... --json`, in a process of its
own), which launches the script with plain python, torchrun and Horovod's gloo launcher. Most run it
through tests/scripts/warm_verify.py, where those runs are forked from the command's process after
it has imported torch once (the warm launcher's contract, tests/scripts/warm_ranks.py); the launches
themselves are under test in real launches: `python -m distify verify` of one scenario per backend
(examples_style), and the timeout and Ctrl-C clean-ups. DISTIFY_E2E_LAUNCH=real runs them all so. Broken scripts are the golden
outputs in fixtures/ (what distify writes today; test_fixtures.py keeps them current) with one edit,
checked with --as-is. Runs are kept short (small data, large batches); the default 20 steps are
followed by the rest of each script with its data passes cut short, so end-of-training saves,
prints and evaluation are judged too.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import LAUNCH_MODE, SCENARIOS, clean_env  # noqa: E402

pytestmark = pytest.mark.e2e

SCRIPTS = Path(__file__).resolve().parent / "scripts" / "verify"
WARM_VERIFY = Path(__file__).resolve().parent / "scripts" / "warm_verify.py"
VERIFY_TIMEOUT = 900
NOT_PROVEN = 3  # distify.verify.EXIT_NOT_PROVEN (imported here only through the report's own exit_code)


def verify(script, *args, cwd, env=None, real=False):
    """(exit status, JSON report) of `distify verify SCRIPT --json ARGS` run in `cwd`; its runs
    forked from the command's warm process, or with `real` launched as distify launches them."""
    command = ["-m", "distify"] if real or LAUNCH_MODE == "real" else [str(WARM_VERIFY)]
    argv = [sys.executable, *command, "verify", str(script), "--json", *map(str, args)]
    proc = subprocess.run(argv, cwd=str(cwd), env=env or clean_env(), capture_output=True, text=True, timeout=VERIFY_TIMEOUT)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON report (exit {proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}") from None
    assert report["exit_code"] == proc.returncode, report
    return proc.returncode, report


def status(report) -> dict:
    return {c["name"]: c["status"] for c in report["checks"]}


def failed(report) -> set:
    return {c["name"] for c in report["checks"] if c["status"] == "failed"}


def check(report, name) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


def explain(report) -> str:
    return json.dumps(report, indent=1)[-6000:]


def user_dir(tmp_path, source, name="train.py") -> Path:
    """tmp_path/user holding a copy of `source` as `name`: the user's directory."""
    home = tmp_path / "user"
    home.mkdir()
    shutil.copyfile(source, home / name)
    return home


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- distify's migrations are OK -----------------------------------------------------------------

# (scenario, script arguments, checks that must hold: the run gives them evidence). No --steps: the
# runs longer than 20 steps (module_level, trainer_class) are cut short after them and still reach
# their final saves and prints.
STYLES = [
    ("module_level", ["--epochs", "3", "--batch-size", "16"], {"params", "shards", "writers", "prefix", "prints"}),
    ("examples_style", ["--epochs", "2", "--batch-size", "32", "--save-model"],
     {"params", "shards", "writers", "prefix", "prints", "metrics"}),
    ("trainer_class", ["--epochs", "3", "--batch-size", "16", "--checkpoint-dir", "ckpts"],
     {"params", "shards", "writers", "prefix", "metrics"}),  # it logs to stderr: no stdout to judge
    ("shuffled", ["--epochs", "2", "--batch-size", "64"], {"params", "shards", "order", "writers", "prefix", "prints"}),
    # hard-coded .cuda() calls: the migrated script must run with CUDA hidden
    ("legacy_cuda", ["--epochs", "2", "--batch-size", "64"], {"params", "shards", "order", "writers", "prefix"}),
]


@pytest.mark.parametrize("backend", ["ddp", pytest.param("horovod", marks=pytest.mark.horovod), "fsdp"])
@pytest.mark.parametrize("name,args,evidence", STYLES, ids=[s[0] for s in STYLES])
def test_verify_says_ok_on_distify_migrations(name, args, evidence, backend, tmp_path):
    home = user_dir(tmp_path, SCENARIOS / f"{name}.in.py")
    if name == "trainer_class":  # a folder the script writes into already exists: verify must not write there
        (home / "ckpts").mkdir()
        (home / "ckpts" / "epoch_000.pt").write_bytes(b"the user's own checkpoint")
    before = snapshot(home)
    code, report = verify("train.py", "--backend", backend, "--", *args, cwd=home, real=name == "examples_style")
    assert code == 0 and report["verdict"] == "ok", explain(report)
    checks = status(report)
    if backend == "fsdp":
        evidence = evidence | {"sharded"}
    assert {c: "held" for c in evidence} == {c: checks[c] for c in evidence}, explain(report)
    assert set(checks.values()) <= {"held", "not_applicable"}, explain(report)
    assert snapshot(home) == before, "verify changed the user's directory"


@pytest.mark.parametrize("backend", ["ddp", pytest.param("horovod", marks=pytest.mark.horovod)])
def test_verify_standalone_output(backend, tmp_path):
    home = user_dir(tmp_path, SCENARIOS / "module_level.in.py")
    code, report = verify("train.py", "--standalone", "--backend", backend, "--", "--epochs", "1", "--batch-size", "32", cwd=home)
    assert code == 0 and status(report)["params"] == "held", explain(report)


# --- against the original, on shuffled data --------------------------------------------------------


def test_against_original_on_a_shuffling_script(tmp_path):
    """The training loader shuffles: the original at 2 x batch draws the permutation the ranks'
    DistributedSampler drew, so the weights are judged (here equal). --batch-size is not passed: the
    original gets twice its argparse default."""
    home = user_dir(tmp_path, SCENARIOS / "shuffled.in.py")
    code, report = verify("train.py", "--against-original", "--batch-arg", "batch-size", "--", "--epochs", "2", cwd=home)
    weights = check(report, "weights")
    assert code == 0 and weights["status"] == "held", explain(report)
    assert "drew the ranks' shuffle" in weights["detail"] and "2 x the default of --batch-size" in weights["detail"], explain(report)


def test_against_original_fails_without_gradient_averaging(tmp_path):
    """The same shuffling script with its DDP wrap removed (each rank steps on its own gradients):
    the weights are judged and differ, at the default steps."""
    home = broken(tmp_path, SCENARIOS / "shuffled.ddp.py",
                  ("model = runtime.DDP(nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 2)).to(device), device_ids=runtime.device_ids())",
                   "model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)"),
                  ("torch.save(model.module.state_dict()", "torch.save(model.state_dict()"))
    code, report = verify("train.py", "--as-is", "--against-original", "--batch-arg", "--batch-size",
                          "--", "--epochs", "2", "--batch-size", "32", cwd=home)
    assert code == 1 and {"params", "weights"} <= failed(report), explain(report)
    assert "max |difference|" in check(report, "weights")["detail"]


def test_against_original_judges_numpy_augmentation_drawn_per_sample(tmp_path):
    """The Dataset adds np.random noise to each sample: ranks and the original fetch the samples in
    different processes and orders, so left alone they would draw different noise for the same sample
    (a difference of about 2e-3: a false FAILED). The probe seeds the global generators by sample
    index around each __getitem__ in both runs, so the weights are judged, and equal."""
    home = user_dir(tmp_path, SCRIPTS / "numpy_augment.py")
    code, report = verify("train.py", "--against-original", "--batch-arg", "batch-size", cwd=home)
    assert code == 0 and report["verdict"] == "ok", explain(report)
    weights = check(report, "weights")
    assert weights["status"] == "held" and "seeded by its index" in weights["detail"], explain(report)


def test_against_original_names_augmentation_it_cannot_align(tmp_path):
    """The noise comes from a generator object the Dataset keeps (np.random.default_rng(0)): each
    process draws its own sequence, which seeding by index cannot reach. verify says "not proven" and
    names the draw, never FAILED nor OK."""
    home = user_dir(tmp_path, SCRIPTS / "numpy_augment.py")
    code, report = verify("train.py", "--against-original", "--batch-arg", "batch-size", "--", "--noise", "generator", cwd=home)
    assert code == NOT_PROVEN and report["verdict"] == "not_proven", explain(report)
    weights = check(report, "weights")
    assert weights["status"] == "not_exercised", explain(report)
    assert "draws from numpy.random while batches are made" in weights["detail"], explain(report)
    assert "self.rng.normal(0.0, 0.05, size=12)" in weights["detail"], explain(report)
    assert {c: s for c, s in status(report).items() if c != "weights"} == {
        c: s for c, s in status(report).items() if c != "weights" and s in ("held", "not_applicable")}, explain(report)


def test_numpy_augmentation_without_gradient_averaging_fails(tmp_path):
    """The control: the same script migrated, then its DDP wrap removed. The ranks' parameters part
    after the first step and the weights, still judged, differ from the original's: FAILED."""
    migrated = subprocess.run([sys.executable, "-m", "distify", "-", "--quiet"], input=(SCRIPTS / "numpy_augment.py").read_text(),
                              capture_output=True, text=True, env=clean_env()).stdout
    wrap = "model = runtime.DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2)))"
    assert migrated.count(wrap) == 1 and migrated.count("model.module.state_dict()") == 1
    home = tmp_path / "user"
    home.mkdir()
    (home / "train.py").write_text(migrated.replace(wrap, "model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))")
                                   .replace("model.module.state_dict()", "model.state_dict()"))
    code, report = verify("train.py", "--as-is", "--against-original", "--batch-arg", "batch-size", cwd=home)
    assert code == 1 and report["verdict"] == "failed" and {"params", "weights"} <= failed(report), explain(report)


def test_verify_fsdp_against_original_compares_gathered_weights(tmp_path):
    """Under fsdp each rank holds half of every parameter: the snapshot compared with the original
    at 2 x batch is the gathered whole (shapes and values), and the params check says it gathered."""
    home = user_dir(tmp_path, SCENARIOS / "examples_style.in.py")
    code, report = verify("train.py", "--backend", "fsdp", "--against-original", "--batch-arg",
                          "--batch-size", "--", "--epochs", "1", "--batch-size", "16", "--save-model", cwd=home)
    assert code == 0, explain(report)
    weights = check(report, "weights")
    assert weights["status"] == "held" and "--batch-size 32" in weights["detail"], explain(report)
    assert "gathered" in check(report, "params")["detail"], explain(report)
    assert "torchrun" in check(report, "launch")["title"]


# --- controls: one broken thing, never OK -----------------------------------------------------------


def broken(tmp_path, golden: Path, *edits) -> Path:
    """tmp_path/user/train.py: the golden migrated script with each (old, new) edit made (each `old` once)."""
    text = golden.read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} is not in {golden.name} exactly once"
        text = text.replace(old, new)
    home = tmp_path / "user"
    home.mkdir()
    (home / "train.py").write_text(text)
    return home


GUARDED_SAVE = "if runtime.is_main_process():\n    torch.save(model.module.state_dict(), args.checkpoint)\n"
UNGUARDED_SAVE = "torch.save(model.module.state_dict(), args.checkpoint)\nif runtime.is_main_process():\n"
CONTROLS = [
    # (id, golden output, edit, script arguments, the one check that must fail)
    ("sampler-removed", "shuffled.ddp.py", ("sampler=train_sampler,", "shuffle=True,"), ["--epochs", "1", "--batch-size", "64"], "shards"),
    ("set-epoch-removed", "shuffled.ddp.py", ("    train_sampler.set_epoch(epoch)\n", ""), ["--epochs", "2", "--batch-size", "64"], "order"),
    ("save-unguarded", "module_level.ddp.py", (GUARDED_SAVE, UNGUARDED_SAVE), ["--epochs", "3", "--batch-size", "16"], "writers"),
    ("prefix-kept", "module_level.ddp.py", ("torch.save(model.module.state_dict()", "torch.save(model.state_dict()"),
     ["--epochs", "3", "--batch-size", "16"], "prefix"),
    # without --save-model: the save, which needs model.module, is not reached (and so not proven)
    ("ddp-wrap-removed", "examples_style.ddp.py", ("model = runtime.DDP(Net().to(device), device_ids=runtime.device_ids())",
                                                   "model = Net().to(device)"), ["--epochs", "1", "--batch-size", "64"], "params"),
    ("print-unguarded", "examples_style.ddp.py",
     ("        if runtime.is_main_process():\n            print('epoch {} test_loss", "        if True:\n            print('epoch {} test_loss"),
     ["--epochs", "1", "--batch-size", "64", "--save-model"], "prints"),
    ("metric-not-reduced", "examples_style.ddp.py", ("        test_loss, correct = runtime.all_reduce_sum(test_loss, correct)\n", ""),
     ["--epochs", "1", "--batch-size", "64", "--save-model"], "metrics"),
]


@pytest.mark.parametrize("golden,edit,args,name", [c[1:] for c in CONTROLS], ids=[c[0] for c in CONTROLS])
def test_control_fails_exactly_its_check(golden, edit, args, name, tmp_path):
    home = broken(tmp_path, SCENARIOS / golden, edit)
    code, report = verify("train.py", "--as-is", "--", *args, cwd=home)
    assert code == 1 and report["verdict"] == "failed", explain(report)
    assert failed(report) == {name}, explain(report)
    where = check(report, name)["where"]
    assert where and all(w["path"] == "train.py" and w["line"] > 0 for w in where), explain(report)


def test_planted_bugs_after_the_default_steps_fail(tmp_path):
    """The issue's script: set_epoch deleted, the save unguarded and saving the wrapper's keys, 40
    steps of training -- the save comes well after the default 20 steps and is still judged."""
    home = broken(tmp_path, SCENARIOS / "module_level.ddp.py", ("    train_sampler.set_epoch(epoch)\n", ""),
                  (GUARDED_SAVE, "torch.save(model.state_dict(), args.checkpoint)\nif runtime.is_main_process():\n"))
    code, report = verify("train.py", "--as-is", "--", "--epochs", "5", "--batch-size", "16", cwd=home)
    assert code == 1 and {"writers", "prefix"} <= failed(report), explain(report)
    assert "data passes cut short after 20" in check(report, "launch")["detail"], explain(report)
    order = check(report, "order")
    assert order["status"] == "not_applicable" and "does not shuffle" in order["detail"], explain(report)


def test_a_save_the_arguments_never_reach_is_not_proven(tmp_path):
    """examples_style saves only with --save-model: without it the save never runs, and verify says
    "not proven" (exit 3), naming the save's line and what would reach it."""
    home = user_dir(tmp_path, SCENARIOS / "examples_style.ddp.py")
    code, report = verify("train.py", "--as-is", "--", "--epochs", "1", "--batch-size", "64", cwd=home)
    assert code == NOT_PROVEN and report["verdict"] == "not_proven", explain(report)
    writers = check(report, "writers")
    assert writers["status"] == "not_exercised" and "never ran" in writers["detail"], explain(report)
    assert [w["source"] for w in writers["where"]] == ["torch.save(model.module.state_dict(), args.checkpoint)"], explain(report)
    assert "arguments that reach the save" in writers["prove"], explain(report)


def test_control_image_write_unguarded(tmp_path):
    """distify writes the image on rank 0 only (os.devnull elsewhere); unguarded, both ranks write it."""
    home = user_dir(tmp_path, SCRIPTS / "sample_images.py")
    code, report = verify("train.py", "--", "--epochs", "1", cwd=home)
    assert code == 0 and status(report)["writers"] == "held", explain(report)
    assert "samples/epoch_0.pgm (rank 0)" in check(report, "writers")["detail"]

    migrated = subprocess.run([sys.executable, "-m", "distify", "-", "--quiet"], input=(SCRIPTS / "sample_images.py").read_text(),
                              capture_output=True, text=True, env=clean_env()).stdout
    old = "open(path if runtime.is_main_process() else os.devnull, \"wb\")"
    assert migrated.count(old) == 1
    (home / "train.py").write_text(migrated.replace(old, "open(path, \"wb\")"))
    code, report = verify("train.py", "--as-is", "--", "--epochs", "1", cwd=home)
    assert code == 1 and failed(report) == {"writers"}, explain(report)
    assert "samples/epoch_0.pgm was written by ranks [0, 1]" in check(report, "writers")["detail"]


# --- projects: the training loop, its prints and its saves in another module -------------------------


def test_verify_migrates_a_whole_project_and_judges_its_helper_module(tmp_path):
    """An undistributed project whose loop, print and save live in utils.py: `distify verify train.py`
    migrates the project as `distify train.py` does (both files), runs the rewritten modules, and
    every check that applies holds at the default settings. The user's files are untouched."""
    home = tmp_path / "user"
    shutil.copytree(SCRIPTS / "project_plain", home)
    before = snapshot(home)
    code, report = verify("train.py", cwd=home)
    assert code == 0 and report["verdict"] == "ok", explain(report)
    assert "in 2 files" in check(report, "migrate")["detail"], explain(report)
    assert {c: status(report)[c] for c in ("params", "shards", "order", "writers", "prefix", "prints")} == dict.fromkeys(
        ("params", "shards", "order", "writers", "prefix", "prints"), "held"), explain(report)
    assert snapshot(home) == before, "verify changed the user's project"


def test_project_helper_module_print_and_save_unguarded_fail_at_their_lines(tmp_path):
    """The control: the project as distify migrates it, then the rank-0 guards of the print and the
    save in utils.py removed: checked as it is, both checks fail and name utils.py's lines."""
    home = tmp_path / "user"
    shutil.copytree(SCRIPTS / "project_plain", home)
    subprocess.run([sys.executable, "-m", "distify", "train.py", "--quiet"], cwd=str(home), env=clean_env(), check=False)
    text = (home / "utils.py").read_text()
    guards = ("    if runtime.is_main_process():\n        print(", "    if runtime.is_main_process():\n        torch.save(")
    assert all(text.count(g) == 1 for g in guards), text
    for guard in guards:
        text = text.replace(guard, guard.replace("runtime.is_main_process()", "True"))
    (home / "utils.py").write_text(text)
    code, report = verify("train.py", "--as-is", cwd=home)
    assert code == 1 and failed(report) == {"prints", "writers"}, explain(report)
    assert [(w["path"], w["source"]) for w in check(report, "prints")["where"]] == [
        ("utils.py", 'print(f"epoch {epoch} loss {loss.item():.4f}")')], explain(report)
    assert ("utils.py", "torch.save(runtime.unwrap(model).state_dict(), path)") in [
        (w["path"], w["source"]) for w in check(report, "writers")["where"]], explain(report)


FSDP_CONTROLS = [
    # the optimizer moved above fully_shard: it steps dead tensors (no error, ranks still agree)
    ("optimizer-before-shard", "module_level.fsdp.py", "fully_shard(model)\noptimizer = torch.optim.SGD(model.parameters(), lr=args.lr)\n",
     "optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)\nfully_shard(model)\n", {"sharded"}),
    # no sharding at all: plain parameters, each rank steps on its own gradients
    ("shard-removed", "module_level.fsdp.py", "fully_shard(model)\n", "", {"params", "sharded"}),
]


@pytest.mark.parametrize("golden,old,new,checks", [c[1:] for c in FSDP_CONTROLS], ids=[c[0] for c in FSDP_CONTROLS])
def test_fsdp_control_fails_exactly_its_checks(golden, old, new, checks, tmp_path):
    home = broken(tmp_path, SCENARIOS / golden, (old, new))
    code, report = verify("train.py", "--as-is", "--backend", "fsdp", "--", "--epochs", "1", "--batch-size", "32", cwd=home)
    assert code == 1 and failed(report) == checks, explain(report)


@pytest.mark.horovod
def test_control_horovod_broadcast_removed(tmp_path):
    home = broken(tmp_path, SCENARIOS / "examples_style.horovod.py",
                  ("    hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n", ""))
    code, report = verify("train.py", "--as-is", "--backend", "horovod", "--", "--epochs", "1", "--save-model", cwd=home)
    assert code == 1 and failed(report) == {"params"}, explain(report)


def test_random_batches_reported(tmp_path):
    """Batches drawn with torch.randint: distify re-seeds each rank once the models are built
    (DST204), so the ranks draw different batches; without that line every rank draws the same."""
    home = user_dir(tmp_path, SCRIPTS / "random_batches.py")
    code, report = verify("train.py", "--", "--iters", "12", cwd=home)
    assert code == 0 and status(report)["random"] == "held", explain(report)

    migrated = subprocess.run([sys.executable, "-m", "distify", "-", "--quiet"], input=(SCRIPTS / "random_batches.py").read_text(),
                              capture_output=True, text=True, env=clean_env()).stdout
    reseed = "torch.manual_seed(torch.initial_seed() + dist.get_rank())\n"
    assert migrated.count(reseed) == 1
    (home / "train.py").write_text(migrated.replace(reseed, ""))
    code, report = verify("train.py", "--as-is", cwd=home)
    assert code == 1 and failed(report) == {"random"}, explain(report)
    where = check(report, "random")["where"]
    assert [w["source"] for w in where] == ["ix = torch.randint(len(data), (args.batch_size,))"], explain(report)
    # 40 iterations, no DataLoader to cut short: verify stops it after 23 steps and says the end was not seen
    assert "does not end when its data passes do" in check(report, "prints")["detail"], explain(report)


# --- the command itself --------------------------------------------------------------------------


HANG = '''\
import os, subprocess, sys, time
import torch
name = os.environ.get("RANK", "plain")
# a helper in a session of its own (as a server or a worker pool may start): verify must find it too
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(os.path.join(sys.argv[1], name + "-helper"), "w") as fh:
    fh.write(str(helper.pid))
with open(os.path.join(sys.argv[1], name), "w") as fh:
    fh.write(str(os.getpid()))
time.sleep(600)
'''


def _start_hanging(tmp_path, *options):
    """`distify verify hang.py` in the background; each process of the script starts a helper, writes
    both pids into tmp_path/pids/<RANK or plain>[-helper] and sleeps."""
    home = tmp_path / "user"
    home.mkdir()
    (home / "hang.py").write_text(HANG)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    pids = tmp_path / "pids"
    pids.mkdir()
    env = clean_env({"TMPDIR": str(tmpdir)})
    argv = [sys.executable, "-m", "distify", "verify", "hang.py", "--as-is", "--json", *options, "--", str(pids)]
    return subprocess.Popen(argv, cwd=str(home), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), pids, tmpdir


def _gone(pid: int) -> bool:
    for _ in range(50):
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_timeout_kills_every_run_and_cleans_up(tmp_path):
    """The plain run and the torchrun run (launcher and both ranks) hang: each is killed at the
    timeout, and nothing is left of them, not even torchrun's temporary directory."""
    proc, pids, tmpdir = _start_hanging(tmp_path, "--timeout", "25")
    out, err = proc.communicate(timeout=400)
    report = json.loads(out)
    assert proc.returncode == 1 and status(report)["plain"] == "failed" and status(report)["launch"] == "failed", out + err
    assert all("timed out" in c["detail"] for c in report["checks"] if c["name"] in ("plain", "launch"))
    assert sorted(p.name for p in pids.iterdir()) == ["0", "0-helper", "1", "1-helper", "plain", "plain-helper"], \
        "not every process got to run"
    assert all(_gone(int(p.read_text())) for p in pids.iterdir()), "a timed-out process is still running"
    assert list(tmpdir.iterdir()) == [], "the temporary directory was not removed"


def test_ctrl_c_kills_the_run_and_cleans_up(tmp_path):
    proc, pids, tmpdir = _start_hanging(tmp_path, "--timeout", "300")
    deadline = time.monotonic() + 120
    while not ((pids / "plain").exists() and (pids / "plain").read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, out + err
    assert _gone(int((pids / "plain").read_text())) and _gone(int((pids / "plain-helper").read_text())), \
        "the interrupted script or its helper is still running"
    assert list(tmpdir.iterdir()) == [], "the temporary directory was not removed"


def test_cli_never_imports_torch(tmp_path):
    """The verify command itself (parsing, migrating, judging, reporting) runs without torch."""
    code = ("import sys\nfrom distify import verify\n"
            "rc = verify.main(['missing.py'])\n"
            "assert rc == 2, rc\nassert 'torch' not in sys.modules\n"
            "r = verify.render_text(verify._report(verify.Plan(__import__('pathlib').Path('t.py'), [], 'ddp', 20, 2, 1, False, False, False, None), [], [], []))\n"
            "assert 'torch' not in sys.modules\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), capture_output=True, text=True, env=clean_env())
    assert out.stdout.strip() == "ok", out.stderr


def test_unchanged_script_needs_as_is(tmp_path):
    home = user_dir(tmp_path, SCENARIOS / "module_level.ddp.py")
    code, report = verify("train.py", cwd=home)
    assert code == 1 and failed(report) == {"migrate"} and "--as-is" in report["checks"][0]["detail"]


def test_horovod_missing_skips_its_runs_with_a_message(tmp_path):
    """A horovod that cannot be imported: the Horovod runs are skipped with the reason, and the verdict
    is "not proven" (nothing was exercised across processes), not OK."""
    fake = tmp_path / "fake"
    (fake / "horovod").mkdir(parents=True)
    (fake / "horovod" / "__init__.py").write_text("raise ImportError('horovod was built without PyTorch support')\n")
    home = user_dir(tmp_path, SCENARIOS / "module_level.in.py")
    env = clean_env({"PYTHONPATH": os.pathsep.join(p for p in (str(fake), os.environ.get("PYTHONPATH", "")) if p)})
    code, report = verify("train.py", "--backend", "horovod", "--steps", "2", cwd=home, env=env)
    assert code == NOT_PROVEN and report["verdict"] == "not_proven" and failed(report) == set(), explain(report)
    launch = check(report, "launch")
    assert launch["status"] == "not_exercised" and "horovod.torch is not importable" in launch["detail"], explain(report)
