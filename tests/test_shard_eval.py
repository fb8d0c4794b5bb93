"""DST203: evaluation loaders sharded with runtime.ShardSampler and their sums reduced over ranks.

* Which loaders are sharded and why the others are left whole (the info line DST201 prints).
* The runtime pieces: ShardSampler splits without padding; all_reduce_sum keeps number kinds.
* Executed: fixtures/DST203/sharded_sums.in.py (101 validation samples: 51 + 50 on two ranks),
  migrated and launched with torchrun and with horovodrun, prints the single-process loss sum,
  correct count and total, once per epoch, while each rank reads only its half of the set.
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    REPO_ROOT,
    migrate,
    checked,
    run_python,
    run_horovodrun,
    run_torchrun,
    sitecustomize_env,
)
from distify.engine import migrate_source  # noqa: E402
from distify.rules.base import Options  # noqa: E402

FIXTURES = REPO_ROOT / "fixtures" / "DST203"


def _findings(name: str, backend: str = "ddp", **options):
    source = (FIXTURES / f"{name}.in.py").read_bytes()
    return migrate_source(source, Options(backend=backend, **options))


def _left_whole(result) -> dict:
    """loader name -> the reason DST201 gives for leaving it whole."""
    out = {}
    for f in result.findings:
        m = re.match(r"(\S+) left whole: (.*); every rank evaluates the full set", f.message)
        if f.code == "DST201" and f.kind == "info" and m:
            out[m.group(1)] = m.group(2)
    return out


# ------------------------------------------------------------------------------- choices


FALLBACK_REASONS = {
    "mean_loader": "`val_loss += F.cross_entropy(model(xb), yb).item()` adds a per-batch value",
    "denominator_loader": "`len(loader)` counts this rank's batches only",
    "predictions_loader": "`preds.append(pred)` changes preds in every batch",
    "chatty_loader": "its evaluation loop prints",
    "last_loader": "`out` is set per batch and read after the evaluation loop",
    "guarded_loader": "the evaluation runs under a rank check",
    # print(printed(model, printed_loader)) no longer keeps it whole: the rank-0 guard computes the
    # argument on every rank first (Context.guard_statement); what remains is the shared loop
    "printed_loader": "its evaluation loop (line 67) also evaluates shuffled_loader, which stays whole",
    "shuffled_loader": "it shuffles (shuffle=True)",
}


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_each_fallback_is_left_whole_with_its_reason(backend):
    result = _findings("fallbacks", backend)
    reasons = _left_whole(result)
    assert set(reasons) == set(FALLBACK_REASONS), reasons
    for loader, expected in FALLBACK_REASONS.items():
        assert reasons[loader].startswith(expected), f"{loader}: {reasons[loader]}"
    text = result.output.decode()
    assert "ShardSampler" not in text and "all_reduce_sum" not in text


def test_sharded_loader_reported_by_dst203_not_as_left_whole():
    result = _findings("sharded_sums")
    assert _left_whole(result) == {}
    messages = [f.message for f in result.findings if f.code == "DST203"]
    assert any(m.startswith("val_loader is sharded for evaluation") for m in messages), messages
    assert any(m.startswith("test_loss, correct, total summed over all ranks") for m in messages), messages
    text = result.output.decode()
    assert text.count("runtime.ShardSampler(val_set)") == 1
    assert text.count("test_loss, correct, total = runtime.all_reduce_sum(test_loss, correct, total)") == 1


def test_not_selected_means_left_whole():
    result = _findings("sharded_sums", ignore=("DST203",))
    assert _left_whole(result) == {"val_loader": "DST203 (shard-eval) is not selected"}
    assert "ShardSampler" not in result.output.decode()


def test_loop_shared_with_the_training_loader_is_not_reduced():
    reasons = _left_whole(_findings("shared_loop"))
    assert reasons["val_loader"].startswith("`accuracy` is also called with train_loader")


def test_gradients_enabled_blocks_ddp_only():
    assert _left_whole(_findings("grad_enabled", "ddp"))["val_loader"].startswith(
        "its evaluation loop runs with gradients enabled"
    )
    horovod = _findings("grad_enabled", "horovod")
    assert _left_whole(horovod) == {}
    assert "loss_sum, n = runtime.all_reduce_sum(loss_sum, n)" in horovod.output.decode()


def test_metric_accumulated_across_an_outer_loop_is_left_whole():
    source = (FIXTURES / "module_level.in.py").read_text()
    # the counters start once, before the epoch loop: reducing after every epoch would add up
    # already-reduced totals, so the loader must stay whole
    moved = source.replace("    correct = 0\n    seen = 0  # samples\n", "").replace(
        "for epoch in range(3):", "correct = 0\nseen = 0\nfor epoch in range(3):"
    )
    assert moved != source
    result = migrate_source(moved.encode(), Options(backend="ddp"))
    reason = _left_whole(result)["val_loader"]
    assert reason.startswith("metric `correct` is set outside a loop around the evaluation loop"), reason


# ------------------------------------------------------------------------------- runtime


@pytest.mark.parametrize("n", [0, 1, 2, 7, 101])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_shard_sampler_covers_the_set_once_without_padding(n, world):
    from distify import runtime

    shards = [list(runtime.ShardSampler(range(n), num_replicas=world, rank=r)) for r in range(world)]
    assert [len(runtime.ShardSampler(range(n), num_replicas=world, rank=r)) for r in range(world)] == [
        len(s) for s in shards
    ]
    assert sorted(i for s in shards for i in s) == list(range(n))
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1


def test_shard_sampler_rejects_a_rank_outside_the_world():
    from distify import runtime

    with pytest.raises(ValueError):
        list(runtime.ShardSampler(range(4), num_replicas=2, rank=2))


def test_all_reduce_sum_without_a_group_returns_the_values():
    import torch

    from distify import runtime

    t = torch.tensor([1.5])
    assert runtime.all_reduce_sum(3) == 3
    a, b, c = runtime.all_reduce_sum(3, 0.25, t)
    assert (a, b) == (3, 0.25) and type(a) is int and type(b) is float and c is t
    with pytest.raises(TypeError):
        runtime.all_reduce_sum("3")
    with pytest.raises(TypeError):
        runtime.all_reduce_sum()


_REDUCE_SCRIPT = '''\
import json, os, sys
import torch
import torch.distributed as dist
from distify import runtime

dist.init_process_group(**runtime.init_kwargs())
r = runtime.rank()
ints, floats, tensor = runtime.all_reduce_sum(r + 1, 0.5 * (r + 1), torch.tensor([r, 10 * r]))
single = runtime.all_reduce_sum(7)
shard = list(runtime.ShardSampler(range(5)))
with open(os.path.join(sys.argv[1], "rank%d.json" % r), "w") as fh:
    json.dump({"ints": ints, "int_kind": type(ints).__name__, "floats": floats, "tensor": tensor.tolist(),
               "single": single, "shard": shard}, fh)
'''


@pytest.mark.e2e
def test_all_reduce_sum_and_shard_sampler_under_torchrun(tmp_path):
    script = tmp_path / "reduce.py"
    script.write_text(_REDUCE_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    run_torchrun(script, [out], nproc=2, cwd=tmp_path)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for got in ranks:
        assert got["ints"] == 3 and got["int_kind"] == "int"
        assert got["floats"] == 1.5
        assert got["tensor"] == [1, 10]
        assert got["single"] == 14
    assert ranks[0]["shard"] == [0, 2, 4] and ranks[1]["shard"] == [1, 3]


# ------------------------------------------------------------------------------- executed

EVAL_SIZE = 101
EPOCHS = 2
# lr 0: the weights stay the initial ones on every run, so the evaluations of the original and of
# the migrated script see the same model and must report the same sums
ARGS = ["--epochs", EPOCHS, "--lr", 0.0, "--batch-size", 16, "--eval-batch-size", 16]
LINE = re.compile(r"epoch (\d+) val_loss_sum (\S+) correct (\d+) total (\d+)")

# Records, per process, every index read from a TensorDataset of EVAL_SIZE samples; dumps them at exit.
_SEEN_SPY = f'''\
import atexit, json, os

_DIR = os.environ.get("DISTIFY_E2E_SEEN_DIR")
if _DIR:
    _seen = []

    def _dump():
        if not _seen:
            return  # a launcher process, or a run that never evaluated
        rank = os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or "single"
        with open(os.path.join(_DIR, "seen-%s.json" % rank), "w") as fh:
            json.dump(_seen, fh)

    atexit.register(_dump)

    def _patch(torch):
        cls = torch.utils.data.TensorDataset
        real = cls.__getitem__

        def getitem(self, index):
            if len(self) == {EVAL_SIZE}:
                _seen.append(int(index))
            return real(self, index)

        cls.__getitem__ = getitem

    _after_torch_import(_patch)
'''


def _spy_env(root: Path):
    seen = root / "seen"
    seen.mkdir()
    return sitecustomize_env(root / "spy", _SEEN_SPY, {"DISTIFY_E2E_SEEN_DIR": str(seen)}), seen


def _launch(launcher: str, script: Path, root: Path):
    """Run `script` with `launcher`; returns (parsed metric lines, output, {rank: indices read})."""
    run_root = root / launcher
    run_root.mkdir(parents=True)
    env, seen = _spy_env(run_root)
    if launcher == "python":
        result = run_python(script, ARGS, env=env, cwd=run_root)
    elif launcher == "torchrun":
        result = run_torchrun(script, ARGS, nproc=2, env=env, cwd=run_root, check=False)
    else:
        result = run_horovodrun(script, ARGS, nproc=2, env=env, cwd=run_root, check=False)
    result = checked(result, launcher, script.name)
    lines = [(int(e), float(loss), int(c), int(t)) for e, loss, c, t in LINE.findall(result.output)]
    reads = {p.stem[len("seen-"):]: json.loads(p.read_text()) for p in seen.glob("seen-*.json")}
    return lines, result.output, reads


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    lines, output, reads = _launch("python", FIXTURES / "sharded_sums.in.py", tmp_path_factory.mktemp("orig"))
    assert len(lines) == EPOCHS, output
    assert all(total == EVAL_SIZE for _, _, _, total in lines)
    assert Counter(reads["single"]) == Counter({i: EPOCHS for i in range(EVAL_SIZE)})
    return lines


def _check_same_metrics(lines, expected, output):
    assert len(lines) == EPOCHS, f"expected {EPOCHS} metric lines (printed once each):\n{output[-4000:]}"
    for (epoch, loss, correct, total), (e0, loss0, correct0, total0) in zip(lines, expected):
        assert (epoch, correct, total) == (e0, correct0, total0)
        assert loss == pytest.approx(loss0, rel=1e-6, abs=1e-6), (loss, loss0)
    assert output.count("  accuracy ") == EPOCHS, output[-4000:]


def _check_halves(reads, output):
    assert set(reads) == {"0", "1"}, f"per-rank dumps: {sorted(reads)}\n{output[-3000:]}"
    for rank in (0, 1):
        expected = range(rank, EVAL_SIZE, 2)  # ShardSampler: every second sample, no padding
        assert Counter(reads[str(rank)]) == Counter({i: EPOCHS for i in expected}), f"rank {rank}"
    assert len(set(reads["0"])) == 51 and len(set(reads["1"])) == 50


@pytest.mark.e2e
def test_torchrun_reports_the_single_process_metrics(original, tmp_path):
    script = tmp_path / "sharded_sums.py"
    migrate(FIXTURES / "sharded_sums.in.py", script, backend="ddp")
    assert "runtime.ShardSampler(val_set)" in script.read_text()
    lines, output, reads = _launch("torchrun", script, tmp_path)
    _check_same_metrics(lines, original, output)
    _check_halves(reads, output)

    # the same migrated script, one plain process: the whole set on one rank, the same numbers
    plain, output, reads = _launch("python", script, tmp_path / "plain")
    assert [(e, c, t) for e, _, c, t in plain] == [(e, c, t) for e, _, c, t in original]
    assert [loss for _, loss, _, _ in plain] == [loss for _, loss, _, _ in original]
    assert Counter(reads["single"]) == Counter({i: EPOCHS for i in range(EVAL_SIZE)})


@pytest.mark.e2e
@pytest.mark.horovod
def test_horovodrun_reports_the_single_process_metrics(original, tmp_path):
    script = tmp_path / "sharded_sums.py"
    migrate(FIXTURES / "sharded_sums.in.py", script, backend="horovod")
    text = script.read_text()
    assert "hvd.init()" in text and "runtime.ShardSampler(val_set)" in text
    lines, output, reads = _launch("horovodrun", script, tmp_path)
    _check_same_metrics(lines, original, output)
    _check_halves(reads, output)
