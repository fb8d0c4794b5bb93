"""Executed: The Annotated Transformer's shape (training in a loss-compute object handed to the loop),
migrated for DDP and launched on 2 ranks.

``run_epoch(data_iter, model, loss_compute)`` trains when it is handed
``SimpleLossCompute(criterion, opt)`` and evaluates when handed ``SimpleLossCompute(criterion, None)``
under ``no_grad``. Before distify.callable_training the loop was no training loop: the training
loader was never sharded and nothing was said. The loader spy (tests/e2e_support.LOADER_SPY) records
each pass's indices on every rank: the training loader (#0) must give the ranks disjoint shards that
cover the set, in a new order every epoch (set_epoch), and the evaluation loader (#1) is read whole by
every rank. The control removes the sampler from the migrated script: the same check fails.

Each runs migrated for ddp, horovod and fsdp (the parameters compared between ranks under DDP and
Horovod; FSDP's are shards), and so does fixtures/DST201/loader_in_place: a loader built in place as
the argument of the script's training function every epoch, inside a print distify guards. Its five
loaders (one an epoch) must each give the ranks disjoint shards covering the dataset, in a new order
each epoch (the set_epoch DST202 adds before the statement); control: the sampler taken out. And
fixtures/DST201/loader_in_constructor: a loader built in place as a trainer class's constructor
argument, kept on the instance and read by its own epoch loop (disjoint shards, a new order each
epoch); control the same.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import LOADER_SPY, SCENARIOS, checked, executed, launcher, migrate, sitecustomize_env  # noqa: E402
from test_e2e_data_paths import check_ranks_identical, check_shards  # noqa: E402

pytestmark = pytest.mark.e2e

SCRIPT = SCENARIOS / "annotated_transformer.in.py"
SPEC = dict(train=[0], shuffled=[0], whole=[1])
ARGS = ["--batch-size", 16, "--epochs", 2, "--checkpoint", "final.pt"]
IN_PLACE = SCENARIOS.parent / "DST201" / "loader_in_place.in.py"
IN_PLACE_SPEC = dict(train=[0, 1, 2, 3, 4], shuffled=[], whole=[])


def _launch(script: Path, tmp_path: Path, backend: str, args=ARGS):
    import torch

    dumps = tmp_path / "dumps"
    dumps.mkdir(parents=True, exist_ok=True)
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    env = sitecustomize_env(tmp_path / "spy", LOADER_SPY, {"DISTIFY_E2E_DATA_DIR": str(dumps)})
    result = checked(launcher(backend)(script, args, nproc=2, env=env, cwd=run_dir, check=False), backend, script.name)
    loaders, params = {}, {}
    for r in ("0", "1"):
        path = dumps / f"loaders-rank{r}.jsonl"
        assert path.is_file(), f"rank {r} left no loader records\n" + result.describe()
        loaders[r] = [json.loads(line) for line in path.read_text().splitlines()]
        if backend != "fsdp":  # (FSDP's parameters are each rank's shards)
            params[r] = torch.load(dumps / f"params-rank{r}.pt")
        if backend == "ddp":  # (Horovod builds its optimizer before it broadcasts the parameters)
            params["initial", r] = torch.load(dumps / f"initial-rank{r}.pt")
    return loaders, params, result


BACKENDS = ("ddp", "horovod", "fsdp")


class Case:
    """A shape: its input, arguments, the loader spy's expectations, the sampler distify names, the
    epochs it prints, and whether each epoch builds its own loader."""

    def __init__(self, source, args, spec, sampler, epochs, per_epoch_loader=False, set_epoch=None):
        self.source, self.args, self.spec, self.sampler = source, args, spec, sampler
        self.epochs, self.per_epoch_loader = epochs, per_epoch_loader
        self.set_epoch = set_epoch or f"{sampler}.set_epoch(epoch)"  # where the epoch reaches the sampler


CASES = {
    "scenarios/annotated_transformer": Case(SCRIPT, ARGS, SPEC, "train_iter_sampler", 2),
    "DST201/loader_in_place": Case(IN_PLACE, [], IN_PLACE_SPEC, "loader_sampler", 5, per_epoch_loader=True),
    # built in place as a class's constructor argument, kept as self.loader, looped over by a method:
    # shuffled, so a pass in the same order as the one before means the epoch never reached the sampler
    "DST201/loader_in_constructor": Case(SCENARIOS.parent / "DST201" / "loader_in_constructor.in.py", [],
                                         dict(train=[0], shuffled=[0], whole=[]), "loader_sampler", 3,
                                         set_epoch="self.loader.sampler.set_epoch(epoch)"),
}


@pytest.mark.parametrize("case,backend", [executed(c, b, c, b, id=f"{c.split('/')[1]}-{b}") for c in CASES for b in BACKENDS])
def test_the_loader_the_training_call_hands_in_is_sharded(tmp_path, case, backend):
    shape = CASES[case]
    script = tmp_path / "script" / shape.source.name.replace(".in.py", ".py")
    script.parent.mkdir()
    migrate(shape.source, script, backend=backend)
    text = script.read_text()
    assert f"sampler={shape.sampler})" in text and shape.set_epoch in text, text
    loaders, params, result = _launch(script, tmp_path / "migrated", backend, args=shape.args)
    check_shards(case, loaders, shape.spec)
    if shape.per_epoch_loader:  # a new order each epoch: the sampler is told the epoch
        for r, records in loaders.items():
            orders = [tuple(rec["indices"]) for rec in records if "loader" in rec]
            assert len(orders) == shape.epochs == len(set(orders)), f"rank {r} read the same order in two epochs"
    if params:
        check_ranks_identical(case, params)
    assert sum(line.startswith("epoch ") for line in result.output.splitlines()) == shape.epochs  # once per epoch
    if backend != "ddp":
        return

    # control: the sampler taken out again (as distify left it before), both ranks read the same samples
    broken = script.with_name("unsharded.py")
    unsharded = text.replace(f"sampler={shape.sampler})", "shuffle=True)")
    if ".sampler.set_epoch(" in shape.set_epoch:  # told through the loader: a RandomSampler has no set_epoch
        unsharded = unsharded.replace(shape.set_epoch, "pass")
    broken.write_text(unsharded)
    assert broken.read_text() != text
    loaders, _, _ = _launch(broken, tmp_path / "control", backend, args=shape.args)
    with pytest.raises(AssertionError, match="the loader is not sharded"):
        check_shards("control", loaders, shape.spec)
