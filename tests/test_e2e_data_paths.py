"""Executed: every way a real script feeds its training data (issue 13), migrated and launched on 2 ranks.

The scripts are `fixtures/corpus/*.in.py` tagged `# distify-e2e: data` (and `equivalent` when they
train shuffle-free and deterministically with a mean-reduced loss). Each is run unmigrated with plain
python (batch B and 2B), then migrated with the real CLI and launched under `torchrun
--nproc-per-node 2` (ddp) and `horovodrun --gloo -np 2` (horovod, skipped when Horovod is missing).

A test-only sitecustomize (the *loader spy*) numbers the DataLoaders each process builds (creation
order) and records, for every pass over each of them (every iterator it hands out), the dataset
indices it yields; a second spy records the parameters every optimizer steps. Per script the test
checks, from those records and the output:

* each rank read a disjoint shard of every training loader in every pass, and the shards together
  cover the dataset (padding and `drop_last` aside); loaders that are evaluated whole are read whole
  by every rank;
* a shuffling training loader hands out a new order on every full pass (`set_epoch` reached it);
* every rank ends with the same parameters; scripts marked `equivalent` end where the original ends
  with batch 2B;
* the log lines the script prints appear as often as in the original one-process run at batch 2B
  (once, not once per rank);
* the checkpoint has the original's keys (no `module.` prefix).

`test_control_*` break one fix in a migrated script on purpose (a sampler removed, set_epoch
removed) and show the same checks fail.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    LOADER_SPY,
    REPO_ROOT,
    assert_same_weights,
    load_state,
    migrate,
    checked,
    run_horovodrun,
    run_python,
    run_torchrun,
    sitecustomize_env,
)

pytestmark = pytest.mark.e2e

CORPUS = REPO_ROOT / "fixtures" / "corpus"
B = 16
NPROC = 2
EPOCHS = 2

# Per script: which loaders (by creation order in one process) train, which of those shuffle, which
# are evaluated whole on every rank, and the regular expression of its log lines.
SPEC = {
    "zip_two_loaders": dict(train=[0, 1], shuffled=[], whole=[], log=r"^epoch \d+"),
    "tqdm_bar_in_epoch": dict(train=[0], shuffled=[], whole=[], log=r"^epoch \d+"),
    "trainer_run_epoch": dict(train=[0], shuffled=[0], whole=[], log=r"^(epoch|Epoch) \d+"),
    # the batch loop iterates `bar = tqdm(self.train_loader)`; fit() runs the epochs
    "trainer_tqdm_bar": dict(train=[0], shuffled=[0], whole=[], log=r"^epoch \d+"),
    "endless_generator": dict(train=[0], shuffled=[0], whole=[1], log=r"^iter \d+"),
    # save_pretrained("final.pt") writes a directory
    "hf_style_local": dict(train=[0], shuffled=[], whole=[1], log=r"^epoch \d+", checkpoint="final.pt/pytorch_model.bin"),
    "phase_dict_loaders": dict(train=[0], shuffled=[0], whole=[1], log=r"^epoch \d+"),
    "randint_get_batch": dict(train=[], shuffled=[], whole=[], draws=True, log=r"^step \d+"),
    # the loaders come from cifar_utils.py (copied next to the migrated script), which distify
    # rewrites too: #0 the training loader, sharded where cifar_utils builds it, #1 evaluation
    "loader_from_utils": dict(train=[0], shuffled=[0], whole=[1], log=r"^epoch \d+", modules=["cifar_utils.py"]),
    # the same module's loader drawn through an endless generator, with cifar_utils.py excluded
    # from the project ([tool.distify] exclude: never rewritten): #0 built there, #1 its shard
    # rebuilt in the script by runtime.shard_loader (passes counted in the generator), #2 evaluation
    # one loader per text file, built by a helper inside the epoch loop: #0 #1 in epoch 0, #2 #3 in
    # epoch 1 (the same files): each file's new loader reads its shard in a new order every epoch
    "loader_per_text_helper": dict(train=[0, 1, 2, 3], shuffled=[], whole=[], reshuffled=[(0, 2), (1, 3)],
                                   log=r"^epoch \d+"),
    # the training loader built in the loop header, tqdm(DataLoader(...)), each epoch (#0, #2), the
    # test loader in a generator expression's header (#1, #3): named above the loop, then sharded
    "loader_in_loop_header": dict(train=[0, 2], shuffled=[], whole=[1, 3], reshuffled=[(0, 2)], log=r"^epoch \d+"),
    "foreign_endless_generator": dict(train=[1], shuffled=[1], whole=[2], log=r"^iter \d+", modules=["cifar_utils.py"],
                                      exclude=["cifar_utils.py"]),
}


def _tags(path: Path) -> set:
    first = path.read_text().splitlines()[0]
    m = re.match(r"#\s*distify-e2e:\s*(.*)", first)
    return {t.strip() for t in m.group(1).split(",")} if m else set()


_SPY = LOADER_SPY


def train_args(batch):
    return ["--batch-size", batch, "--epochs", EPOCHS, "--checkpoint", "final.pt"]


def _run(launcher, script, workdir: Path, batch=B):
    """Launch `script`; returns (run dir, {rank: loader records}, {rank: params}, result)."""
    run_dir = workdir / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    dumps = workdir / "dumps"
    dumps.mkdir(parents=True, exist_ok=True)
    env = sitecustomize_env(workdir / "spy", _SPY, {"DISTIFY_E2E_DATA_DIR": str(dumps)})
    if launcher == "python":
        result = run_python(script, train_args(batch), env=env, cwd=run_dir)
    elif launcher == "torchrun":
        result = checked(run_torchrun(script, train_args(batch), nproc=NPROC, env=env, cwd=run_dir, check=False),
                         launcher, script.name)
    else:
        result = checked(run_horovodrun(script, train_args(batch), env=env, cwd=run_dir, check=False),
                         launcher, script.name)
    import torch

    ranks = ["single"] if launcher == "python" else [str(r) for r in range(NPROC)]
    loaders, params = {}, {}
    for r in ranks:
        path = dumps / f"loaders-rank{r}.jsonl"
        assert path.is_file(), f"rank {r} left no loader records\n" + result.describe()
        loaders[r] = [json.loads(line) for line in path.read_text().splitlines()]
        params[r] = torch.load(dumps / f"params-rank{r}.pt")
        params["initial", r] = torch.load(dumps / f"initial-rank{r}.pt")
    return run_dir, loaders, params, result


def _passes(records, loader):
    out = {}
    for rec in records:
        if rec.get("loader") == loader:
            out[rec["pass"]] = rec
    return out


def check_shards(name, loaders: dict, spec: dict) -> None:
    """The shard checks described in the module docstring; raises AssertionError with a reason."""
    ranks = sorted(loaders)
    for lid in spec["train"]:
        per_rank = {r: _passes(loaders[r], lid) for r in ranks}
        counts = {r: len(p) for r, p in per_rank.items()}
        assert all(counts.values()), f"{name}: training loader #{lid} was never iterated: {counts}"
        assert len(set(counts.values())) == 1, f"{name}: ranks made different numbers of passes over loader #{lid}: {counts}"
        size = per_rank[ranks[0]][0]["size"]
        full = []
        for k in per_rank[ranks[0]]:
            shards = [set(per_rank[r][k]["indices"]) for r in ranks]
            for i in range(len(ranks)):
                for j in range(i + 1, len(ranks)):
                    both = shards[i] & shards[j]
                    assert not both, (
                        f"{name}: ranks {ranks[i]} and {ranks[j]} both read samples {sorted(both)[:8]} of training "
                        f"loader #{lid} in pass {k}: the loader is not sharded"
                    )
            union = set().union(*shards)
            if len(union) >= size - NPROC * B:
                full.append(k)
                assert union <= set(range(size)), f"{name}: loader #{lid} read indices outside its dataset"
        assert full, f"{name}: no full pass over training loader #{lid}"
        if lid in spec["shuffled"]:
            for r in ranks:
                orders = [tuple(per_rank[r][k]["indices"]) for k in full]
                assert len(orders) >= 2, f"{name}: fewer than two full passes over shuffled loader #{lid}"
                for a, b in zip(orders, orders[1:]):
                    assert a != b, f"{name}: rank {r} read shuffled loader #{lid} in the same order in two passes (set_epoch missing)"
    for first, later in spec.get("reshuffled", ()):
        # loaders built afresh over the same data in a later epoch: a new order (set_epoch reached
        # each new sampler; a sampler left at epoch 0 repeats its permutation)
        for r in ranks:
            a, b = _passes(loaders[r], first).get(0), _passes(loaders[r], later).get(0)
            assert a and b, f"{name}: rank {r} never iterated loaders #{first} and #{later}"
            assert a["indices"] != b["indices"], (
                f"{name}: rank {r} read loaders #{first} and #{later} (the same data, a later epoch) in the same "
                "order (set_epoch missing)")
    for lid in spec["whole"]:
        # evaluation: read whole by every rank that evaluates (rank 0 at least: a result only printed
        # there may be computed there alone), or sharded without padding and overlap (DST203)
        assert _passes(loaders[ranks[0]], lid), f"{name}: rank {ranks[0]} never evaluated loader #{lid}"
        per_rank = {r: _passes(loaders[r], lid) for r in ranks}
        for k, rec in per_rank[ranks[0]].items():
            size = rec["size"]
            reads = [sorted(per_rank[r][k]["indices"]) for r in ranks if k in per_rank[r]]
            whole = all(x == list(range(size)) for x in reads)
            sharded = len(reads) == len(ranks) and sorted(i for x in reads for i in x) == list(range(size))
            assert whole or sharded, (
                f"{name}: evaluation loader #{lid} in pass {k} was neither read whole by each rank nor sharded "
                f"exactly once over the ranks: {[len(x) for x in reads]} of {size}"
            )


def check_draws(name, loaders: dict) -> None:
    """Batches drawn with torch.randint (no loader): each rank draws its own, position by position."""
    draws = {r: [rec["draw"] for rec in recs if "draw" in rec] for r, recs in loaders.items()}
    ranks = sorted(draws)
    assert draws[ranks[0]], f"{name}: no torch.randint draws were recorded"
    for r in ranks[1:]:
        assert len(draws[r]) == len(draws[ranks[0]]), f"{name}: ranks drew different numbers of batches"
        same = sum(a == b for a, b in zip(draws[ranks[0]], draws[r]))
        assert same == 0, f"{name}: rank {r} drew the same batch as rank {ranks[0]} {same} of {len(draws[r])} times"


def check_ranks_identical(name, params: dict) -> None:
    """Every rank starts from the same weights (recorded when its optimizer is built) and ends
    with the same weights."""
    import torch

    for key in ("initial", None):
        if key and ("initial", "0") not in params:
            continue  # the start is recorded when the optimizer is built: before Horovod's broadcast
        get = (lambda r: params["initial", r]) if key else (lambda r: params[r])
        ranks = [r for r in params if isinstance(r, str)]
        base = get("0")
        assert base, f"{name}: no optimizer parameters were recorded"
        for r in ranks:
            ps = get(r)
            assert len(ps) == len(base)
            for i, (a, b) in enumerate(zip(base, ps)):
                when = "at the start" if key else "at the end"
                assert torch.equal(a, b), f"{name}: parameter {i} differs between rank 0 and rank {r} {when}"


def _log_lines(output: str, pattern: str) -> list:
    """Lines matching `pattern`, with horovodrun's '[rank]<stdout>:' prefixes removed."""
    lines = (re.sub(r"^\[[\d,]+\]<std(out|err)>:", "", ln.strip()) for ln in re.split(r"[\r\n]+", output))
    return [ln for ln in lines if re.match(pattern, ln)]


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    cache = {}

    def get(name, batch):
        if (name, batch) not in cache:
            workdir = tmp_path_factory.mktemp(f"{name}-orig-{batch}")
            run_dir, loaders, params, result = _run("python", CORPUS / f"{name}.in.py", workdir, batch)
            cache[name, batch] = (load_state(run_dir / SPEC[name].get("checkpoint", "final.pt")), result.output)
        return cache[name, batch]

    return get


def _migrated(name, backend, tmp_path) -> Path:
    target = tmp_path / "script" / f"{name}.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    for module in SPEC[name].get("modules", ()):  # the script's own helper modules (distify reads them)
        shutil.copyfile(CORPUS / module, target.parent / module)
    if SPEC[name].get("exclude"):
        listed = ", ".join(f'"{m}"' for m in SPEC[name]["exclude"])
        (target.parent / "pyproject.toml").write_text(f"[tool.distify]\nexclude = [{listed}]\n")
    migrate(CORPUS / f"{name}.in.py", target, backend=backend)
    assert target.read_bytes() != (CORPUS / f"{name}.in.py").read_bytes(), f"distify left {name} unchanged"
    return target


def _check(name, backend, launcher, original, tmp_path):
    spec = SPEC[name]
    script = _migrated(name, backend, tmp_path)
    run_dir, loaders, params, result = _run(launcher, script, tmp_path)
    check_shards(f"{name} ({backend})", loaders, spec)
    if spec.get("draws"):
        check_draws(f"{name} ({backend})", loaders)
    check_ranks_identical(f"{name} ({backend})", params)
    weights_b, _ = original(name, B)
    # 2 ranks at batch B take the steps of one process at batch 2B (an iteration count derived from
    # len(loader) halves): compare the log with that run
    _, output_2b = original(name, NPROC * B)
    lines = _log_lines(result.output, spec["log"])
    expected = _log_lines(output_2b, spec["log"])
    assert expected, f"{name}: the original printed no log lines matching {spec['log']!r}"
    assert len(lines) == len(expected), f"{name} ({backend}): {len(lines)} log lines, the original printed {len(expected)}"
    saved = load_state(run_dir / spec.get("checkpoint", "final.pt"))
    assert set(saved) == set(weights_b), f"{name} ({backend}): checkpoint keys {sorted(saved)} != original {sorted(weights_b)}"
    if "equivalent" in _tags(CORPUS / f"{name}.in.py"):
        assert_same_weights(original(name, NPROC * B)[0], saved, atol=1e-5, label=f"{name} {backend} vs batch {NPROC * B}")


def test_every_data_script_has_a_spec():
    tagged = {p.name[: -len(".in.py")] for p in CORPUS.glob("*.in.py") if "data" in _tags(p)}
    assert tagged == set(SPEC), sorted(tagged ^ set(SPEC))


@pytest.mark.parametrize("name", sorted(SPEC))
def test_ddp_data_path(name, original, tmp_path):
    _check(name, "ddp", "torchrun", original, tmp_path)


@pytest.mark.horovod
@pytest.mark.parametrize("name", sorted(SPEC))
def test_horovod_data_path(name, original, tmp_path):
    _check(name, "horovod", "horovodrun", original, tmp_path)


# --- controls: undo one fix in the migrated script, the checks must fail ---------------------------


def _broken(name, tmp_path, edit, module=None):
    """The migrated script with `edit` applied to its text (and, with `module` = (file, edit), to
    that helper module's migrated text)."""
    script = _migrated(name, "ddp", tmp_path)
    for path, change in [(script, edit)] + ([(script.parent / module[0], module[1])] if module else []):
        text = path.read_text()
        new = change(text)
        assert new != text, "the control's edit did not apply:\n" + text
        path.write_text(new)
    return script


def test_control_second_zip_loader_unsharded(tmp_path):
    """zip(source, target): with target_loader's sampler removed, rank 0 and 1 read the same target
    samples, and the spy says so."""
    script = _broken("zip_two_loaders", tmp_path, lambda t: t.replace(", sampler=target_sampler)", ")"))
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="loader #1 in pass 0: the loader is not sharded"):
        check_shards("control", loaders, SPEC["zip_two_loaders"])


def test_control_generator_without_set_epoch(tmp_path):
    """forever(loader): without the per-pass set_epoch in the generator, each rank reads its shard in
    the same order on every pass."""
    script = _broken("endless_generator", tmp_path, lambda t: t.replace("loader.sampler.set_epoch(epoch)\n", "pass\n"))
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="same order in two passes"):
        check_shards("control", loaders, SPEC["endless_generator"])


def test_control_foreign_generator_unsharded_or_without_set_epoch(tmp_path):
    """infinite(train_loader) over another module's loader: without the re-shard both ranks read
    the same samples; without the per-pass set_epoch the shard's order repeats."""
    script = _broken("foreign_endless_generator", tmp_path,
                     lambda t: t.replace("train_loader = runtime.shard_loader(train_loader)\n", "pass\n")
                     .replace("loader.sampler.set_epoch(epoch)\n", "pass\n"))  # a RandomSampler has no epochs
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    spec = dict(SPEC["foreign_endless_generator"], train=[0], shuffled=[0], whole=[1])  # no rebuilt loader
    with pytest.raises(AssertionError, match="not sharded"):
        check_shards("control", loaders, spec)
    script = _broken("foreign_endless_generator", tmp_path,
                     lambda t: t.replace("loader.sampler.set_epoch(epoch)\n", "pass\n"))
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="same order in two passes"):
        check_shards("control", loaders, SPEC["foreign_endless_generator"])


def test_control_trainer_without_set_epoch(tmp_path):
    """Trainer._run_epoch: without set_epoch in train()'s epoch loop the order repeats."""
    script = _broken(
        "trainer_run_epoch", tmp_path, lambda t: t.replace("self.train_data.sampler.set_epoch(epoch)\n", "pass\n")
    )
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="same order in two passes"):
        check_shards("control", loaders, SPEC["trainer_run_epoch"])


def test_control_tqdm_loader_unsharded(tmp_path):
    """pbar = tqdm(dataloader): the loader built without its sampler is read whole by each rank."""
    script = _broken("tqdm_bar_in_epoch", tmp_path, lambda t: t.replace(", sampler=data_sampler)", ")"))
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="not sharded"):
        check_shards("control", loaders, SPEC["tqdm_bar_in_epoch"])


def test_control_loader_per_text_without_set_epoch(tmp_path):
    """create_dataloader(text) in the epoch loop: without set_epoch on each new loader's sampler
    every epoch reads each file's shard in the first epoch's order."""
    script = _broken("loader_per_text_helper", tmp_path,
                     lambda t: t.replace("train_loader.sampler.set_epoch(epoch)\n", "pass\n"))
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="in the same order"):
        check_shards("control", loaders, SPEC["loader_per_text_helper"])


def test_control_loader_in_loop_header_unsharded(tmp_path):
    """for x, y in tqdm(DataLoader(...)): the loader distify named above the loop, without its
    sampler again, is read whole by both ranks."""
    script = _broken("loader_in_loop_header", tmp_path, lambda t: t.replace(", sampler=train_sampler)", ")"))
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="loader #0 in pass 0: the loader is not sharded"):
        check_shards("control", loaders, SPEC["loader_in_loop_header"])


def test_control_randint_without_reseed(tmp_path):
    """get_batch's torch.randint: without the per-rank re-seed every rank draws the same batches."""
    script = _broken(
        "randint_get_batch", tmp_path,
        lambda t: t.replace("torch.manual_seed(torch.initial_seed() + dist.get_rank())\n", "pass\n"),
    )
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="drew the same batch"):
        check_draws("control", loaders)


def test_control_phase_dict_unsharded(tmp_path):
    """{x: DataLoader(...) for x in ["train", "val"]}: with the train key's sampler taken out again,
    both ranks read the whole training set."""
    script = _broken(
        "phase_dict_loaders", tmp_path,
        lambda t: t.replace('shuffle=x != "train", sampler=train_sampler if x == "train" else None)', "shuffle=True)").replace(
            'dataloaders["train"].sampler.set_epoch(epoch)\n', "pass\n"
        ),
    )
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="loader #0 in pass 0: the loader is not sharded"):
        check_shards("control", loaders, SPEC["phase_dict_loaders"])


def test_control_hf_loader_unsharded(tmp_path):
    """transformers-style loop (an AdamW over model.parameters() that steps after backward): the
    whole migration hangs on recognising that loop as training; with the training loader's sampler
    taken out again the spy sees both ranks read the same samples."""
    script = _broken("hf_style_local", tmp_path, lambda t: t.replace(", sampler=train_data_sampler)", ")"))
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="loader #0 in pass 0: the loader is not sharded"):
        check_shards("control", loaders, SPEC["hf_style_local"])


def test_control_loader_from_utils_unsharded(tmp_path):
    """cifar_utils.get_training_dataloader(): without the sampler distify adds where the helper
    module builds the loader (and the set_epoch it makes possible in the script) both ranks read
    all of it."""
    script = _broken(
        "loader_from_utils", tmp_path,
        lambda t: t.replace("        training_loader.sampler.set_epoch(epoch)\n", ""),
        module=("cifar_utils.py", lambda t: t.replace("sampler=DistributedSampler(training_set, shuffle=shuffle)", "shuffle=shuffle")),
    )
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="loader #0 in pass 0: the loader is not sharded"):
        check_shards("control", loaders, SPEC["loader_from_utils"])


def test_control_loader_from_utils_without_set_epoch(tmp_path):
    """Sharded where it is built but never told the epoch: each rank reads its shard in the same
    order every epoch."""
    script = _broken(
        "loader_from_utils", tmp_path, lambda t: t.replace("        training_loader.sampler.set_epoch(epoch)\n", "")
    )
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="same order in two passes"):
        check_shards("control", loaders, SPEC["loader_from_utils"])


def test_control_trainer_set_epoch_on_the_bar(tmp_path):
    """trainer_tqdm_bar: the epoch set on the progress bar instead of the loader it wraps (what distify
    wrote before the bar was followed to its loader) dies with a NameError in fit(), where the bar is
    unbound, under plain python already; set on nothing, the shard's order repeats."""
    script = _broken("trainer_tqdm_bar", tmp_path, lambda t: t.replace("self.train_loader.sampler.set_epoch(epoch)", "bar.sampler.set_epoch(epoch)"))
    result = run_python(script, train_args(B), cwd=tmp_path, check=False)
    assert result.returncode != 0 and "NameError: name 'bar' is not defined" in result.output, result.describe()
    script = _broken("trainer_tqdm_bar", tmp_path, lambda t: t.replace("self.train_loader.sampler.set_epoch(epoch)\n", "pass\n"))
    _, loaders, _, _ = _run("torchrun", script, tmp_path)
    with pytest.raises(AssertionError, match="same order in two passes"):
        check_shards("control", loaders, SPEC["trainer_tqdm_bar"])
