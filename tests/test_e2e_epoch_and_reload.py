"""Executed checks for two things the corpus' rank-agreement test cannot see.

* set_epoch through a helper: `fixtures/corpus/loaders_tuple_shuffled` builds its shuffling loaders in
  `get_loaders(args)` and unpacks `train_loader, val_loader = get_loaders(args)`. Migrated and launched
  on 2 ranks, a test-only sitecustomize records the indices every DistributedSampler hands out; each
  epoch's order on each rank must be the one DistributedSampler documents for that epoch (a
  permutation seeded with seed + epoch, rank r taking every 2nd index from r). A missing
  `set_epoch` repeats epoch 0's order, which the ranks still agree on – hence this test. A control run
  with the `set_epoch` line deleted must fail the check.
* reload after a rank-0 save: `fixtures/corpus/best_checkpoint_reload` saves best.pt (rank 0 only)
  whenever validation improves and reloads it on every rank at the end. The sitecustomize makes
  rank 0's writes of best.pt slow (a slow shared filesystem) and records every state_dict each rank
  loads. With distify's barrier every rank loads the last best weights, which are also the saved
  final model; a control run without the barrier must fail the check (rank 1 reads the previous best).
* reload of whole modules pickled in a checkpoint dict (fixtures/DST102/save_state_by_name, ddp and
  horovod): every file loads in a plain process as the script's own modules (below).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    REPO_ROOT,
    RunFailed,
    assert_same_weights,
    executed,
    load_state,
    migrate,
    rank_parameters,
    run_python,
    run_horovodrun,
    run_torchrun,
    same_on_every_rank,
    sitecustomize_env,
)

pytestmark = pytest.mark.e2e

CORPUS = REPO_ROOT / "fixtures" / "corpus"
NPROC = 2
B = 16
EPOCHS = 3
BACKENDS = [
    "ddp",
    pytest.param(
        "horovod",
        marks=pytest.mark.horovod,
    ),
]

# Test-only sitecustomize. DISTIFY_E2E_SPY_DIR: where to write. Records (1) every pass over a
# DistributedSampler as a JSON line {"epoch", "indices"} in order-rank<sampler rank>.jsonl, (2) every
# state_dict given to Module.load_state_dict, as loads-rank<RANK>.pt at exit; with
# DISTIFY_E2E_SLOW_SAVE=<name>, torch.save sleeps 2 s before writing a file of that name.
_SPY = '''\
import os

_DIR = os.environ.get("DISTIFY_E2E_SPY_DIR")

if _DIR:
    import atexit
    import json
    import time

    def _patch(torch):
        sampler_cls = torch.utils.data.distributed.DistributedSampler
        real_iter = sampler_cls.__iter__

        def __iter__(self):
            indices = [int(i) for i in real_iter(self)]
            with open(os.path.join(_DIR, "order-rank%d.jsonl" % self.rank), "a") as fh:
                fh.write(json.dumps({"epoch": self.epoch, "indices": indices}) + "\\n")
            return iter(indices)

        sampler_cls.__iter__ = __iter__

        loads = []
        real_load_state_dict = torch.nn.Module.load_state_dict

        def load_state_dict(self, state_dict, *args, **kwargs):
            loads.append({k: v.detach().cpu().clone() for k, v in state_dict.items()})
            return real_load_state_dict(self, state_dict, *args, **kwargs)

        torch.nn.Module.load_state_dict = load_state_dict

        slow = os.environ.get("DISTIFY_E2E_SLOW_SAVE")
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if slow and isinstance(f, (str, os.PathLike)) and os.path.basename(os.fspath(f)) == slow:
                time.sleep(2.0)
            return real_save(obj, f, *args, **kwargs)

        torch.save = save

        def dump():
            rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "single"
            real_save(loads, os.path.join(_DIR, "loads-rank%s.pt" % rank))

        atexit.register(dump)

    _after_torch_import(_patch)
'''


def _spy_env(root: Path, extra=None) -> tuple:
    out = root / "records"
    out.mkdir(parents=True, exist_ok=True)
    env = sitecustomize_env(root / "spy", _SPY, {"DISTIFY_E2E_SPY_DIR": str(out), **(extra or {})})
    return env, out


def _args(batch, epochs=EPOCHS):
    return ["--batch-size", batch, "--epochs", epochs, "--checkpoint", "final.pt"]


def _launch(backend: str, script: Path, workdir: Path, extra_env=None) -> Path:
    """Run `script` on NPROC ranks with the spy; returns the directory of its records."""
    run_dir = workdir / "run"
    run_dir.mkdir(parents=True)
    env, records = _spy_env(workdir, extra_env)
    if backend == "ddp":
        run_torchrun(script, _args(B), nproc=NPROC, env=env, cwd=run_dir, timeout=240)
    else:
        run_horovodrun(script, _args(B), nproc=NPROC, env=env, cwd=run_dir, timeout=300)
    return records


def _migrated(name: str, backend: str, tmp_path: Path) -> Path:
    target = tmp_path / "script" / f"{name}.py"
    migrate(CORPUS / f"{name}.in.py", target, backend=backend)
    return target


def _without(script: Path, line_part: str) -> None:
    """Delete the (single) line of `script` containing `line_part`."""
    lines = script.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line_part in line]
    assert len(hits) == 1, f"expected one line with {line_part!r} in {script.name}:\n" + "".join(lines)
    del lines[hits[0]]
    script.write_text("".join(lines))


# set_epoch --------------------------------------------------------------------------------------

N_TRAIN = 256  # loaders_tuple_shuffled: 256 training samples


def expected_order(epoch: int, rank: int, n: int = N_TRAIN, replicas: int = NPROC, seed: int = 0) -> list:
    """DistributedSampler(shuffle=True)'s documented order: a permutation of range(n) drawn from a
    generator seeded with seed + epoch, padded to a multiple of `replicas`, every replicas-th index
    from `rank` on."""
    import torch

    g = torch.Generator()
    g.manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    total = -(-n // replicas) * replicas
    perm += perm[: total - n]
    return perm[rank:total:replicas]


def check_orders(records: Path) -> None:
    """Every rank saw EPOCHS passes, epoch e in the order DistributedSampler gives for epoch e."""
    for rank in range(NPROC):
        path = records / f"order-rank{rank}.jsonl"
        assert path.is_file(), f"rank {rank} never iterated a DistributedSampler"
        passes = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(passes) == EPOCHS, f"rank {rank}: {len(passes)} passes over the sampler, expected {EPOCHS}"
        orders = [p["indices"] for p in passes]
        assert len({tuple(o) for o in orders}) == EPOCHS, f"rank {rank}: the shard order repeats across epochs"
        for epoch, order in enumerate(orders):
            assert order == expected_order(epoch, rank), (
                f"rank {rank}, epoch {epoch}: the sampler's order is not epoch {epoch}'s "
                f"(set_epoch value {passes[epoch]['epoch']})"
            )
    # the shards of one epoch are disjoint and cover the training set
    for epoch in range(EPOCHS):
        seen = sorted(i for rank in range(NPROC) for i in expected_order(epoch, rank))
        assert seen == list(range(N_TRAIN))


def test_expected_order_is_what_the_sampler_documents():
    """The reference order equals a DistributedSampler's own (so a mismatch means a wrong epoch)."""
    from torch.utils.data.distributed import DistributedSampler

    for epoch in range(EPOCHS):
        for rank in range(NPROC):
            sampler = DistributedSampler(range(N_TRAIN), num_replicas=NPROC, rank=rank, shuffle=True)
            sampler.set_epoch(epoch)
            assert list(sampler) == expected_order(epoch, rank)


@pytest.mark.parametrize("backend", BACKENDS)
def test_helper_loaders_reshuffle_every_epoch(backend, tmp_path):
    script = _migrated("loaders_tuple_shuffled", backend, tmp_path)
    assert "train_loader.sampler.set_epoch(epoch)" in script.read_text()
    check_orders(_launch(backend, script, tmp_path))


def test_order_check_detects_missing_set_epoch(tmp_path):
    """Control: the same run without the set_epoch line repeats epoch 0's order; the check says so."""
    script = _migrated("loaders_tuple_shuffled", "ddp", tmp_path)
    _without(script, "train_loader.sampler.set_epoch(epoch)")
    records = _launch("ddp", script, tmp_path)
    with pytest.raises(AssertionError, match="repeats across epochs"):
        check_orders(records)


# reload after a rank-0 save ---------------------------------------------------------------------

SLOW = {"DISTIFY_E2E_SLOW_SAVE": "best.pt"}


def check_reloads(records: Path, final: dict) -> None:
    """Every rank loaded exactly one state_dict (the best checkpoint), all equal to the final model."""
    import torch

    for rank in range(NPROC):
        loads = torch.load(records / f"loads-rank{rank}.pt")
        assert len(loads) == 1, f"rank {rank} loaded {len(loads)} state_dicts, expected 1"
        assert_same_weights(final, loads[0], atol=1e-7, label=f"rank {rank}'s reloaded best.pt vs final model")


@pytest.mark.parametrize("backend", BACKENDS)
def test_reload_waits_for_rank0_save(backend, tmp_path):
    original = tmp_path / "original"
    original.mkdir()
    run_python(CORPUS / "best_checkpoint_reload.in.py", _args(NPROC * B), cwd=original)
    script = _migrated("best_checkpoint_reload", backend, tmp_path)
    assert ".barrier()" in script.read_text()
    records = _launch(backend, script, tmp_path, SLOW)
    final = load_state(tmp_path / "run" / "final.pt")
    check_reloads(records, final)
    # and it is the single-process run's best model at batch 2B
    assert_same_weights(load_state(original / "final.pt"), final, atol=1e-5, label=f"{backend} vs batch {NPROC * B}")


def test_reload_check_detects_missing_barrier(tmp_path):
    """Control: without the barrier, rank 1 reads best.pt while rank 0 is still writing the new best;
    it continues with the previous best and the check fails (or the run does)."""
    script = _migrated("best_checkpoint_reload", "ddp", tmp_path)
    _without(script, ".barrier()")
    with pytest.raises((AssertionError, RunFailed)):
        records = _launch("ddp", script, tmp_path, SLOW)
        check_reloads(records, load_state(tmp_path / "run" / "final.pt"))


# ------------------------------------------------------------ whole modules in a checkpoint dict
# fixtures/DST102/save_state_by_name pickles the encoder and decoder whole: in a dict built first and
# saved by name in the script's save_checkpoint (twice), in one completed by item assignment, in a
# dict(...) of a list handed to its own write_snapshot (distify.pickled follows each by data flow).
# Migrated and run on 2 ranks, every file must load in a plain process without a process group as
# the script's own nn.Linear modules, holding the weights every rank ended with. Control (ddp): the
# DDP wrappers saved instead (the migration before distify.pickled): the files do not load so.
# fixtures/DST111/pickled_optimizer keeps the optimizer itself in the checkpoint (refused for
# Horovod, whose DistributedOptimizer class cannot be pickled): under DDP it loads as the script's
# Adam, stepping the weights the ranks ended with.
PICKLED = {
    "DST102/save_state_by_name": ("checkpoint.pth.tar", "last.pth.tar", "snapshot.pth.tar"),
    "DST111/pickled_optimizer": ("checkpoint.pth.tar",),
}
RELOAD = '''\
import sys

import torch
import torch.nn as nn

found = {}
for name in sys.argv[1:]:
    state = torch.load(name, weights_only=False)
    optimizer = state.get("decoder_optimizer")
    if optimizer is not None and not isinstance(optimizer, dict):  # the optimizer itself, not its state_dict
        assert type(optimizer) is torch.optim.Adam, type(optimizer)
        found[name] = [p.detach().clone() for group in optimizer.param_groups for p in group["params"]]
        assert all(torch.equal(a, b) for a, b in zip(found[name], state["decoder"].values()))
        continue
    modules = state["models"] if "models" in state else [state["encoder"], state["decoder"]]
    assert [type(m) for m in modules] == [nn.Linear, nn.Linear], [type(m) for m in modules]
    found[name] = [p.detach().clone() for m in modules for p in m.parameters()]
torch.save(found, "reloaded.pt")
'''
WRAPPED_SAVES = {"runtime.unwrap(encoder)": "encoder", "runtime.unwrap(decoder)": "decoder",
                 "encoder.module": "encoder", "decoder.module": "decoder"}


def _reloaded(script: Path, work: Path, backend: str, files):
    """Each rank's parameters at exit, and what a plain process loads from each saved file."""
    import torch

    ranks = rank_parameters(script, [], work, backend)[1]
    (work / "reload.py").write_text(RELOAD)
    run_python(work / "reload.py", files, cwd=work)
    return ranks, torch.load(work / "reloaded.pt")


@pytest.mark.parametrize("case,backend", [
    executed(case, b, case, b, id=f"{case.split('/')[1]}-{b}")
    for case, b in (("DST102/save_state_by_name", "ddp"), ("DST102/save_state_by_name", "horovod"),
                    ("DST111/pickled_optimizer", "ddp"))
])
def test_modules_pickled_in_a_checkpoint_dict_load_without_a_process_group(tmp_path, case, backend):
    import torch

    script = tmp_path / "script" / "pickled.py"
    migrate(REPO_ROOT / "fixtures" / f"{case}.in.py", script, backend=backend)
    text = script.read_text()
    ranks, files = _reloaded(script, tmp_path / "migrated", backend, PICKLED[case])
    assert ranks[0] and same_on_every_rank(ranks), "the ranks trained different models"
    assert sorted(files) == sorted(PICKLED[case])
    for name, params in files.items():
        assert len(params) == len(ranks[0]) and all(torch.equal(a, b) for a, b in zip(params, ranks[0])), (
            f"{name} does not hold the weights the ranks ended with")
    if (case, backend) != ("DST102/save_state_by_name", "ddp"):
        return
    control = text
    for unwrapped, wrapped in WRAPPED_SAVES.items():
        control = control.replace(unwrapped, wrapped)
    assert control != text
    script.write_text(control)
    with pytest.raises(RunFailed, match="DistributedDataParallel|process group|Linear"):
        _reloaded(script, tmp_path / "control", backend, PICKLED[case])
