"""Multi-file projects migrated where their training lives, run on two ranks (issue 21, item 4).

For fixtures/projects/<name>: the migrated copy (tests/test_project_goldens.py) is launched with
torchrun, horovodrun --gloo or torchrun under FSDP, with the loader spy of tests/e2e_support.py.
Each run must show: the training loader's passes split into disjoint shards that cover the
dataset; the same final weights on every rank; each progress line of the helper module printed
once; the evaluation's metric (a sum in the helper, divided by the dataset's length) equal to the
whole validation set's, computed here from the saved weights. The control puts the helper module
back as the user wrote it: lines are printed twice and the metric covers half the set."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from e2e_support import _FS_SPY, LOADER_SPY, assert_same_weights, load_state, run_horovodrun, run_torchrun, sitecustomize_env
from test_project_goldens import PROJECTS, migrated_copy

pytestmark = pytest.mark.e2e
NPROC = 2
ARGS = ["--batch-size", "4", "--epochs", "2"]


def _launch(launcher: str, project: Path, work: Path, sharded: bool = False):
    """Run the project on NPROC ranks with the loader spy and the file-system spy (every file a
    rank opens for writing or torch.saves, in work/fs.log)."""
    dumps = work / "dumps"
    dumps.mkdir(parents=True)
    env = sitecustomize_env(work / "spy", LOADER_SPY + "\n\n" + _FS_SPY,
                            {"DISTIFY_E2E_DATA_DIR": str(dumps), "DISTIFY_E2E_FS_LOG": str(work / "fs.log")})
    args = ARGS + ["--checkpoint", str(work / "final.pt")]
    run = run_horovodrun if launcher == "horovodrun" else run_torchrun
    result = run(project / "train.py", args, nproc=NPROC, env=env, cwd=project)
    import torch

    loaders = {r: [json.loads(line) for line in (dumps / f"loaders-rank{r}.jsonl").read_text().splitlines()] for r in range(NPROC)}
    # under FSDP each rank holds its shard of the parameters: they agree by construction
    params = None if sharded else {r: torch.load(dumps / f"params-rank{r}.pt") for r in range(NPROC)}
    return result, loaders, params


def _sharded(loaders, params, train_id: int = 0) -> list:
    """What the run got wrong about the data and the weights: the training loader's passes (the
    `train_id`-th loader built, the first by default) are split into disjoint shards covering the
    dataset, and every rank ends with the same parameters."""
    out = []
    train = {r: [rec for rec in loaders[r] if rec.get("loader") == train_id] for r in range(NPROC)}
    for p in range(len(train[0])):
        shards = [set(train[r][p]["indices"]) for r in range(NPROC)]
        if shards[0] & shards[1] or shards[0] | shards[1] != set(range(train[0][p]["size"])):
            out.append(f"pass {p} of the training loader is not split into disjoint covering shards")
    if not train[0]:
        out.append("the training loader never ran")
    if params is not None:
        assert_same_weights({str(i): t for i, t in enumerate(params[0])}, {str(i): t for i, t in enumerate(params[1])},
                            label="rank 0 vs rank 1")
    return out


def _problems(project: Path, work: Path, result, loaders, params) -> list:
    """What the run of loop_in_module got wrong, in words (empty: nothing)."""
    out = _sharded(loaders, params)
    lines = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    steps = [line.split(" loss ")[0] for line in lines if " step " in line]  # ranks print other losses
    if not steps or len(steps) != len(set(steps)):
        out.append("progress lines printed more than once")
    vals = [float(m.group(1)) for line in lines if (m := re.match(r"epoch \d+ val (\S+)", line))]
    x, y = _data(PROJECTS / "loop_in_module" / "in", 32, 2)  # the user's own code: no launcher import here
    state = load_state(work / "final.pt")
    whole = float(((x @ state["weight"].T + state["bias"] - y) ** 2).sum() / len(x))
    if not vals or abs(vals[-1] - whole) > 1e-4:
        out.append(f"the last validation metric {vals[-1:]} is not the whole set's {whole:.6f}")
    return out


def _data(project: Path, n: int, seed: int):
    """The project's own ``make_data(n, seed)`` tensors (its entry script imported, not run)."""
    import sys

    sys.path.insert(0, str(project))
    try:
        spec = importlib.util.spec_from_file_location("project_train", project / "train.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.make_data(n, seed).tensors
    finally:
        sys.path.remove(str(project))
        for name in [m for m, mod in sys.modules.items() if str(project) in str(getattr(mod, "__file__", "") or "")]:
            del sys.modules[name]


@pytest.mark.parametrize("launcher,backend", [
    ("torchrun", "ddp"),
    pytest.param("horovodrun", "horovod", marks=pytest.mark.horovod),
    ("torchrun", "fsdp"),
])
def test_loop_in_module(launcher, backend, tmp_path):
    migrated_copy("loop_in_module", backend, tmp_path / "p")
    run = _launch(launcher, tmp_path / "p", tmp_path, sharded=backend == "fsdp")
    assert _problems(tmp_path / "p", tmp_path, *run) == [], run[0].stdout


def test_loop_in_module_called_through_a_module_alias(tmp_path):
    """`import trainlib as m0_` ... `m0_.train_one_epoch(...)` (tests/test_project_spellings.py):
    migrated where the loop lives and run on two ranks, as the plain spelling is."""
    from distify.engine import Mode
    from distify.options import Options
    from distify.project import migrate_project
    from test_project_spellings import respell

    shutil.copytree(PROJECTS / "loop_in_module" / "in", tmp_path / "p")
    script = tmp_path / "p" / "train.py"
    script.write_text(respell(script.read_text(), tmp_path / "p", "alias"))
    assert "m0_.train_one_epoch(" in script.read_text()
    assert migrate_project([str(script)], Options(), Mode.WRITE).changed
    run = _launch("torchrun", tmp_path / "p", tmp_path)
    assert _problems(tmp_path / "p", tmp_path, *run) == [], run[0].stdout


def test_control_loop_in_module_without_the_helper_edits(tmp_path):
    migrated_copy("loop_in_module", "ddp", tmp_path / "p")
    shutil.copy(PROJECTS / "loop_in_module" / "in" / "trainlib.py", tmp_path / "p" / "trainlib.py")
    problems = _problems(tmp_path / "p", tmp_path, *_launch("torchrun", tmp_path / "p", tmp_path))
    assert "progress lines printed more than once" in problems
    assert any("is not the whole set's" in p for p in problems)


def test_attr_read_in_module(tmp_path):
    """The script's own loop hands the wrapped model to a helper of another module that reads
    `model.pos_emb`: it gets the unwrapped model, and the run ends with the shards and weights right."""
    migrated_copy("attr_read_in_module", "ddp", tmp_path / "p")
    result, loaders, params = _launch("torchrun", tmp_path / "p", tmp_path)
    assert _sharded(loaders, params) == [] and "sample [[1, 2, 3" in result.stdout


def test_control_attr_read_in_module_with_the_wrapper(tmp_path):
    """Control: the call handed the wrapper again, as the script was written: the run dies."""
    migrated_copy("attr_read_in_module", "ddp", tmp_path / "p")
    script = tmp_path / "p" / "train.py"
    script.write_text(script.read_text().replace("print_sample(model.module,", "print_sample(model,"))
    result = run_torchrun(script, ARGS, nproc=NPROC, cwd=tmp_path / "p", check=False)
    assert result.returncode != 0 and "has no attribute 'pos_emb'" in result.stdout + result.stderr


def _built_in_modules_problems(work: Path, result, loaders, params, name="built_in_modules", train_id=0) -> list:
    """What a run of built_in_modules got wrong: the training loader built in data.py split into
    disjoint covering shards, the model built in models.py agreeing across ranks, and metrics.py's
    evaluation printed once per epoch with the whole validation set's error (shared_factory: the
    same checks, its training loader the one `runtime.shard_loader` rebuilds, #1)."""
    out = _sharded(loaders, params, train_id)
    # where every rank prints (the control), their lines share one pipe: print writes the text and
    # the newline apart, so one rank's line can run into another's ("3.675094epoch 1 val ...")
    vals = [float(v) for v in re.findall(r"epoch \d+ val (-?\d+\.\d{6})", result.stdout)]
    if len(vals) != int(ARGS[ARGS.index("--epochs") + 1]):
        out.append(f"validation lines printed {len(vals)} times")
    x, y = _module_data(PROJECTS / name / "in" / "data.py", 32, 2)
    state = load_state(work / "final.pt")
    whole = float(((x @ state["weight"].T + state["bias"] - y) ** 2).sum() / len(x))
    if not vals or abs(vals[-1] - whole) > 1e-4:
        out.append(f"the last validation metric {vals[-1:]} is not the whole set's {whole:.6f}")
    return out


def _module_data(path: Path, n: int, seed: int):
    """``make_data(n, seed)`` of the project's own data module (imported alone: it imports torch only)."""
    spec = importlib.util.spec_from_file_location("project_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_data(n, seed).tensors


@pytest.mark.parametrize("launcher,backend", [
    ("torchrun", "ddp"),
    pytest.param("horovodrun", "horovod", marks=pytest.mark.horovod),
    ("torchrun", "fsdp"),
])
def test_built_in_modules(launcher, backend, tmp_path):
    """Loaders built by data.get_loaders(), the model by models.build(), evaluation in
    metrics.evaluate(), the loops in the script: the sampler is added where data.py builds the
    training loader, the model is wrapped in the script, metrics.py prints once."""
    migrated_copy("built_in_modules", backend, tmp_path / "p")
    run = _launch(launcher, tmp_path / "p", tmp_path, sharded=backend == "fsdp")
    assert _built_in_modules_problems(tmp_path, *run) == [], run[0].stdout


@pytest.mark.parametrize("module,problem", [
    ("data.py", "is not split into disjoint covering shards"),
    ("metrics.py", "validation lines printed 4 times"),
])
def test_control_built_in_modules_without_a_helper_edit(module, problem, tmp_path):
    """Control: one helper module put back as the user wrote it: without data.py's sampler every
    rank reads the whole training set (the script's set_epoch then reaches the loader's default
    sampler, which has none: the run dies, or the shards overlap); without metrics.py's guard each
    rank prints its line."""
    migrated_copy("built_in_modules", "ddp", tmp_path / "p")
    shutil.copy(PROJECTS / "built_in_modules" / "in" / module, tmp_path / "p" / module)
    if module == "data.py":
        script = tmp_path / "p" / "train.py"
        script.write_text(script.read_text().replace("        train_loader.sampler.set_epoch(epoch)\n", ""))
    problems = _built_in_modules_problems(tmp_path, *_launch("torchrun", tmp_path / "p", tmp_path))
    assert any(problem in p for p in problems), problems


def _simclr_problems(work: Path, result, loaders, params) -> list:
    """What the run of simclr_trainer got wrong: shards and weights (see `_sharded`), the same order
    on both passes (no set_epoch in the method's epoch loop), the step lines
    of the helper printed more than once, a file written by more than one rank, the checkpoint's
    state_dict keyed for the DDP wrapper (`module.`) instead of the user's model."""
    out = _sharded(loaders, params)
    passes = [rec["indices"] for rec in loaders[0] if rec.get("loader") == 0]
    if len(passes) < 2 or passes[0] == passes[1]:
        out.append("the sampler was not told the epoch: every pass reads the same order")
    steps = [line.split(" loss ")[0] for line in result.stdout.splitlines() if line.startswith("step ")]
    if not steps or len(steps) != len(set(steps)):
        out.append("progress lines printed more than once")
    writers = {}
    for line in (work / "fs.log").read_text().splitlines():
        kind, _pid, rank, path = line.split("\t")
        if kind in ("save", "write") and path.endswith(("final.pt", "config.txt")):
            writers.setdefault(Path(path).name, set()).add(rank)
    for name in ("final.pt", "config.txt"):
        if len(writers.get(name, ())) != 1:
            out.append(f"{name} written by ranks {sorted(writers.get(name, ()))}")
    keys = list(load_state(work / "final.pt")["state_dict"])
    if not keys or any(k.startswith("module.") for k in keys):
        out.append(f"the checkpoint's keys are the wrapper's: {keys[:2]}")
    return out


@pytest.mark.parametrize("launcher,backend", [
    ("torchrun", "ddp"),
    pytest.param("horovodrun", "horovod", marks=pytest.mark.horovod),
])
def test_shared_factory(launcher, backend, tmp_path):
    """data.make_loader() builds the training and the validation loader alike: the training call's
    loader is re-sharded in the script (loader #1, rebuilt over this rank's shard), validation runs
    whole on every rank and is printed once."""
    migrated_copy("shared_factory", backend, tmp_path / "p")
    run = _launch(launcher, tmp_path / "p", tmp_path)
    assert _built_in_modules_problems(tmp_path, *run, name="shared_factory", train_id=1) == [], run[0].stdout


def test_control_shared_factory_without_the_reshard(tmp_path):
    """Control: without the re-shard (and its set_epoch) the factory's training loader, #0, is read
    whole by every rank."""
    migrated_copy("shared_factory", "ddp", tmp_path / "p")
    script = tmp_path / "p" / "train.py"
    text = script.read_text()
    for line in ("    train_loader = runtime.shard_loader(train_loader)\n", "        train_loader.sampler.set_epoch(epoch)\n"):
        assert line in text
        text = text.replace(line, "")
    script.write_text(text)
    problems = _built_in_modules_problems(tmp_path, *_launch("torchrun", tmp_path / "p", tmp_path), name="shared_factory")
    assert any("is not split into disjoint covering shards" in p for p in problems), problems


def test_control_built_in_modules_without_the_wrap(tmp_path):
    """Control for the model built in models.py: with the script's wrap taken out again, each rank
    steps on its own shard's gradients and the ranks end with different weights."""
    migrated_copy("built_in_modules", "ddp", tmp_path / "p")
    script = tmp_path / "p" / "train.py"
    text = script.read_text()
    assert "runtime.DDP(build({\"width\": 4}))" in text
    script.write_text(text.replace("runtime.DDP(build({\"width\": 4}))", "build({\"width\": 4})").replace(
        "model.module.state_dict()", "model.state_dict()"))
    with pytest.raises(AssertionError, match="rank 0 vs rank 1"):
        _built_in_modules_problems(tmp_path, *_launch("torchrun", tmp_path / "p", tmp_path))


@pytest.mark.parametrize("launcher,backend", [
    ("torchrun", "ddp"),
    pytest.param("horovodrun", "horovod", marks=pytest.mark.horovod),
])
def test_simclr_trainer(launcher, backend, tmp_path):
    """SimCLR's shape: the loader handed to `SimCLR(...).train(loader)`, whose method owns the epoch
    loop and saves through a helper of utils.py."""
    migrated_copy("simclr_trainer", backend, tmp_path / "p")
    run = _launch(launcher, tmp_path / "p", tmp_path)
    assert _simclr_problems(tmp_path, *run) == [], run[0].stdout


def test_control_simclr_trainer_without_the_method_edits(tmp_path):
    """Control: simclr.py put back as the user wrote it (the script still migrated): each rank
    prints and writes, and the checkpoint is the wrapper's."""
    migrated_copy("simclr_trainer", "ddp", tmp_path / "p")
    shutil.copy(PROJECTS / "simclr_trainer" / "in" / "simclr.py", tmp_path / "p" / "simclr.py")
    problems = _simclr_problems(tmp_path, *_launch("torchrun", tmp_path / "p", tmp_path))
    assert "progress lines printed more than once" in problems
    assert "final.pt written by ranks ['0', '1']" in problems and "config.txt written by ranks ['0', '1']" in problems
    assert any("keys are the wrapper's" in p for p in problems)


def test_control_simclr_trainer_without_set_epoch(tmp_path):
    """Control for the epoch: the set_epoch distify puts in `SimCLR.train`'s epoch loop taken out,
    both passes read the same shards in the same order."""
    migrated_copy("simclr_trainer", "ddp", tmp_path / "p")
    helper = tmp_path / "p" / "simclr.py"
    line = "            train_loader.sampler.set_epoch(epoch_counter)\n"
    assert line in helper.read_text()
    helper.write_text(helper.read_text().replace(line, ""))
    problems = _simclr_problems(tmp_path, *_launch("torchrun", tmp_path / "p", tmp_path))
    assert problems == ["the sampler was not told the epoch: every pass reads the same order"], problems



def _flag_loader_problems(work: Path, result, loaders, params, train_id: int) -> list:
    """What the run of flag_loader_trainer got wrong: the training loader (`train_id`: the
    factory's own #0 where the call sets its `distributed` switch, #1 where it is rebuilt over this
    rank's shard by runtime.shard_loader) split into disjoint covering shards, the same weights on
    every rank (see `_sharded`), a new order on the second pass (set_epoch in train()'s epoch loop),
    each validation line printed once."""
    out = _sharded(loaders, params, train_id=train_id)
    passes = [rec["indices"] for rec in loaders[0] if rec.get("loader") == train_id]
    if len(passes) < 2 or passes[0] == passes[1]:
        out.append("the sampler was not told the epoch: every pass reads the same order")
    vals = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    if not vals or len(vals) != len(set(vals)):
        out.append("validation lines printed more than once")
    return out


@pytest.mark.parametrize("launcher,backend,train_id", [
    ("torchrun", "ddp", 0),
    pytest.param("horovodrun", "horovod", 1, marks=pytest.mark.horovod),
])
def test_flag_loader_trainer(launcher, backend, train_id, tmp_path):
    """NERSC's shape: `self.train_loader, self.train_sampler = get_data_loader(..., False, ...)` in
    a Trainer method, iterated in another method. DDP: the training call passes True for the
    factory's own switch (its DistributedSampler shards), `self.train_sampler.set_epoch(epoch)` in
    train()'s epoch loop; the validation call keeps False (whole on every rank). Horovod (no
    torch.distributed group for that sampler): re-sharded where the script binds it."""
    migrated_copy("flag_loader_trainer", backend, tmp_path / "p")
    run = _launch(launcher, tmp_path / "p", tmp_path)
    assert _flag_loader_problems(tmp_path, *run, train_id=train_id) == [], run[0].stdout


def test_control_flag_loader_trainer_with_the_flag_left_false(tmp_path):
    """Control: the training call's switch put back to False (and the set_epoch on the None it then
    returns taken out), the factory's loader (#0) is read whole by every rank: the shards overlap."""
    migrated_copy("flag_loader_trainer", "ddp", tmp_path / "p")
    script = tmp_path / "p" / "train.py"
    text = script.read_text()
    for old, new in (("get_data_loader(self.args.batch_size, 64, 1, True, train=True)",
                      "get_data_loader(self.args.batch_size, 64, 1, False, train=True)"),
                     ("            self.train_sampler.set_epoch(epoch)\n", "")):
        assert old in text
        text = text.replace(old, new)
    script.write_text(text)
    problems = _sharded(*_launch("torchrun", tmp_path / "p", tmp_path)[1:], train_id=0)
    assert problems == ["pass 0 of the training loader is not split into disjoint covering shards",
                        "pass 1 of the training loader is not split into disjoint covering shards"], problems
