"""Executed: the sums a training loop adds up and the script reports after it cover every rank
(issue 22, item 5; DST206, fixtures/DST206/epoch_loss).

The script prints, each epoch, the mean loss over the training set (a per-sample sum over
``len(loader.dataset)``), the mean of the batch losses (a sum of batch means over ``len(loader)``,
this rank's count of batches) and the training accuracy. It is deterministic and its loader does not
shuffle, so 2 ranks at batch 8 see, batch by batch, the samples the single process sees at batch 16
(DistributedSampler deals index i to rank i % 2) and train the same weights: the printed lines must
be the single process's, under torchrun (DDP and FSDP) and horovodrun. Control: the same migrated script without DST206's reductions prints rank
0's half. Every other DST206 shape below runs the same way under each backend, with its ddp control.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, epoch_lines, executed, launcher, migrate, run_python  # noqa: E402

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST206" / "epoch_loss.in.py"
REDUCTIONS = re.compile(r"^ *\w+(, \w+)* = runtime\.(all_reduce_sum|reduce_mean)\(.*\)\n", re.M)


def _numbers(lines: list) -> list:
    return [[float(x) for x in re.findall(r"-?\d+\.\d+", line)] for line in lines]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> list:
    work = tmp_path_factory.mktemp("original")
    script = work / "train.py"
    script.write_text(SOURCE.read_text())
    return _numbers(epoch_lines(run_python(script, ["--batch-size", "16"], cwd=work).stdout))


def with_control(case: str):
    """Each backend's run of fixtures/DST206/<case>, and the ddp run without the reduction (the control)."""
    return pytest.mark.parametrize("backend,reduced", [
        executed(f"DST206/{case}", "ddp", "ddp", True, id="ddp"),
        executed(f"DST206/{case}", "ddp", "ddp", False, id="control-ddp-unreduced"),
        executed(f"DST206/{case}", "fsdp", "fsdp", True, id="fsdp"),
        executed(f"DST206/{case}", "horovod", "horovod", True, id="horovod"),
    ])


@with_control("epoch_loss")
def test_epoch_summary_equals_single_process(tmp_path, single_process, backend, reduced):
    script = tmp_path / "train.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    assert len(REDUCTIONS.findall(text)) == 2, "DST206 did not reduce the epoch's sums"
    if not reduced:
        script.write_text(REDUCTIONS.sub("", text))
    found = _numbers(epoch_lines(launcher(backend)(script, ["--batch-size", "8"], nproc=2, cwd=tmp_path).stdout))
    assert len(found) == len(single_process) == 3, found
    close = all(
        abs(a - b) <= 2e-6 for got, want in zip(found, single_process) for a, b in zip(got, want)
    )
    if reduced:
        assert close, f"2 ranks printed {found}, the single process {single_process}"
    else:
        assert not close, "control: rank 0's own sums already equal the whole set's"


def _single_and_migrated(tmp_path, source: Path, pattern, backend: str = "ddp"):
    """The lines `pattern` finds in the single process's run of `source` at batch 16, and the
    migrated script (in `tmp_path`) with its text."""
    original = tmp_path / "original" / "train.py"
    original.parent.mkdir()
    original.write_text(source.read_text())
    want = pattern.findall(run_python(original, ["--batch-size", "16"], cwd=original.parent).stdout)
    script = tmp_path / "train.py"
    migrate(source, script, backend=backend)
    return want, script, script.read_text()


def _two_ranks(tmp_path, source: Path, pattern, backend: str, reduction, reduced: bool):
    """(the single process's lines at batch 16, the migrated script's on 2 ranks at batch 8), the
    lines `pattern` finds; the migrated script must hold the one `reduction` (a pattern), which
    the control (`reduced` False) takes out."""
    want, script, text = _single_and_migrated(tmp_path, source, pattern, backend)
    assert len(reduction.findall(text)) == 1, "DST206 did not reduce the sum"
    if not reduced:
        script.write_text(reduction.sub("", text))
    return want, pattern.findall(launcher(backend)(script, ["--batch-size", "8"], nproc=2, cwd=tmp_path).stdout)


ACCURACY = REPO_ROOT / "fixtures" / "DST206" / "accuracy_on_train_set.in.py"
GOT = re.compile(r"^Got (\S+) / (\S+) with accuracy (\S+)$", re.M)


@with_control("accuracy_on_train_set")
def test_accuracy_on_the_training_set_counts_every_rank(tmp_path, backend, reduced):
    """fixtures/DST206/accuracy_on_train_set: after training, `check_accuracy(train_loader, model)`
    counts correct predictions over the (now sharded) training loader. 2 ranks at batch 8 train the
    single process's weights at batch 16 (no shuffle, deterministic), so the printed line must be the
    single process's: every one of the 64 samples counted. Control: without the reduction rank 0
    prints its 32."""
    want, script, text = _single_and_migrated(tmp_path, ACCURACY, GOT, backend)
    assert len(REDUCTIONS.findall(text)) == 1, "DST206 did not reduce the accuracy's sums"
    if not reduced:
        script.write_text(REDUCTIONS.sub("", text))
    got = GOT.findall(launcher(backend)(script, ["--batch-size", "8"], nproc=2, cwd=tmp_path).stdout)
    assert len(want) == 1 and want[0][1] == "64", want
    if reduced:
        assert got == want, f"2 ranks printed {got}, the single process {want}"
    else:
        assert len(got) == 1 and got[0][1] == "32", f"control: rank 0 alone counts its half: {got}"


LIST = REPO_ROOT / "fixtures" / "DST206" / "loss_list_scheduler.in.py"
LINE = re.compile(r"^epoch \d+ loss \S+ lr \S+$", re.M)


@with_control("loss_list_scheduler")
def test_a_list_of_batch_losses_steers_the_scheduler_as_one_process(tmp_path, backend, reduced):
    """fixtures/DST206/loss_list_scheduler: the batch losses kept in a list, averaged after the
    epoch and handed to ReduceLROnPlateau. 2 ranks at batch 8 (no shuffle, deterministic) must print
    the single process's lines at batch 16, learning-rate decisions included. Control: without
    `runtime.reduce_each` rank 0 prints its own half's losses."""
    each = re.compile(r"^ *losses = runtime\.reduce_each\(losses\)\n", re.M)
    want, got = _two_ranks(tmp_path, LIST, LINE, backend, each, reduced)
    assert len(want) == 5 and len({w.split(" lr ")[1] for w in want}) > 1, f"the schedule must change the lr: {want}"
    if reduced:
        assert _numbers(got) and all(
            abs(a - b) <= 2e-6 for g, w in zip(_numbers(got), _numbers(want)) for a, b in zip(g, w)
        ) and len(got) == len(want), f"2 ranks printed {got}, the single process {want}"
    else:
        assert got != want, "control: rank 0's own losses already equal the whole batch's"


WEIGHTED = REPO_ROOT / "fixtures" / "DST206" / "weighted_sampler_epoch.in.py"
SEEN = re.compile(r"^epoch \d+ seen (\d+) loss \S+$", re.M)


@with_control("weighted_sampler_epoch")
def test_sums_over_a_shared_sampler_count_every_rank(tmp_path, backend, reduced):
    """fixtures/DST206/weighted_sampler_epoch: the loader's own WeightedRandomSampler is shared out
    (DST901, runtime.ShareSampler: each rank keeps every N-th draw of one sequence), so the epoch's
    sums are each rank's share: reduced, the printed count is the whole epoch's 64 draws, as the
    single process prints. Control: without the reduction rank 0 counts its 32."""
    want, script, text = _single_and_migrated(tmp_path, WEIGHTED, SEEN, backend)
    assert "ShareSampler(" in text and len(REDUCTIONS.findall(text)) == 1, "DST206 did not reduce the shared loader's sums"
    if not reduced:
        script.write_text(REDUCTIONS.sub("", text))
    got = SEEN.findall(launcher(backend)(script, ["--batch-size", "8"], nproc=2, cwd=tmp_path).stdout)
    assert want == ["64", "64"], want
    assert got == (want if reduced else ["32", "32"]), got


OWN_LOSS = REPO_ROOT / "fixtures" / "DST206" / "loss_from_own_function.in.py"
EPOCH = re.compile(r"^epoch \d+ loss (\S+) val-accuracy (\S+)$", re.M)


@with_control("loss_from_own_function")
def test_a_loss_from_the_scripts_own_function_is_averaged(tmp_path, backend, reduced):
    """fixtures/DST206/loss_from_own_function: the batch loss is what `compute_loss(model, batch,
    criterion)` returns (a mean loss, followed through the function's return), added up over the
    epoch: 2 ranks at batch 8 print the single process's figures at batch 16. Control: without that
    reduction rank 0 prints its own shard's figure."""
    reduction = re.compile(r"^ *epoch_loss = runtime\.reduce_mean\(epoch_loss\)\n", re.M)
    want, found = _two_ranks(tmp_path, OWN_LOSS, EPOCH, backend, reduction, reduced)
    assert len(found) == len(want) == 3, found
    close = all(abs(float(a) - float(b)) <= 2e-6 for got, exp in zip(found, want) for a, b in zip(got, exp))
    assert close == reduced, f"2 ranks printed {found}, the single process {want}"


PHASES = REPO_ROOT / "fixtures" / "DST206" / "phase_loop.in.py"
PHASE_LINE = re.compile(r"^epoch \d+ (?:train|val) loss \S+ acc \S+$", re.M)
PHASE_SUM = re.compile(r"^ *if phase == \"train\":\n *running_loss, running_corrects = runtime\.all_reduce_sum\(.*\)\n", re.M)


@with_control("phase_loop")
def test_the_phase_loop_reports_the_whole_training_set(tmp_path, backend, reduced):
    """fixtures/DST206/phase_loop (the fine-tuning tutorial): one batch loop over `dataloaders[phase]`
    for "train" (sharded) and "val" (whole on every rank). 2 ranks at batch 8 train the single
    process's weights at batch 16, so every printed line, train and val, must be the single
    process's. Control: without the reduction the training lines read rank 0's half of the sums over
    the whole set's size (half the loss). Before the fix DST206 skipped a loop a whole loader also
    feeds, which is that control's output."""
    want, got = _two_ranks(tmp_path, PHASES, PHASE_LINE, backend, PHASE_SUM, reduced)
    assert len(want) == 6, want
    numbers = lambda lines: [[float(x) for x in re.findall(r"\d+\.\d+", line)] for line in lines]
    close = len(got) == 6 and all(
        abs(a - b) <= 2e-5 for g, w in zip(numbers(got), numbers(want)) for a, b in zip(g, w)
    )
    if reduced:
        assert close, f"2 ranks printed {got}, the single process {want}"
    else:
        assert not close and all(
            abs(2 * g[0] - w[0]) <= 0.05 for g, w in zip(numbers(got)[::2], numbers(want)[::2])
        ), f"control: rank 0's own training sums are half the whole set's: {got} vs {want}"


TENSORS = REPO_ROOT / "fixtures" / "DST206" / "tensor_counters.in.py"
TENSOR_LINE = re.compile(r"^epoch \d+ loss \S+ accuracy \S+ batch-loss \S+$", re.M)


@with_control("tensor_counters")
def test_counters_kept_in_tensors_cover_every_rank(tmp_path, backend, reduced):
    """fixtures/DST206/tensor_counters: the epoch's loss, hits and batch losses are added up in
    tensors started as ``torch.zeros((), device=device)``, ``torch.zeros(1, ...)`` and
    ``torch.tensor(0.0).to(device)``, read with ``.item()`` after the loop. 2 ranks at batch 8 must
    print the single process's lines at batch 16. Before the fix DST206 took only counters started
    from a number literal: the control's output, rank 0's half (an accuracy about half the real one)."""
    want, script, text = _single_and_migrated(tmp_path, TENSORS, TENSOR_LINE, backend)
    assert len(REDUCTIONS.findall(text)) == 2, "DST206 did not reduce the tensor counters"
    if not reduced:
        script.write_text(REDUCTIONS.sub("", text))
    got = TENSOR_LINE.findall(launcher(backend)(script, ["--batch-size", "8"], nproc=2, cwd=tmp_path).stdout)
    assert len(want) == 3, want
    close = len(got) == 3 and all(
        abs(a - b) <= 2e-6 for g, w in zip(_numbers(got), _numbers(want)) for a, b in zip(g, w)
    )
    assert close == reduced, f"2 ranks printed {got}, the single process {want} (reduced: {reduced})"


ENTRIES = REPO_ROOT / "fixtures" / "DST206" / "dict_counters.in.py"
ENTRY_LINE = re.compile(r"^epoch \d+ loss (\S+) accuracy (\S+) seen (\d+) steps (\d+)$", re.M)
ENTRY_SUM = re.compile(r"^ *\w+\[\"\w+\"\](, \w+\[\"\w+\"\])* = runtime\.all_reduce_sum\(.*\)\n", re.M)


@with_control("dict_counters")
def test_a_dict_of_counters_covers_every_rank(tmp_path, backend, reduced):
    """fixtures/DST206/dict_counters: the epoch's loss (a tensor entry), correct count and samples
    seen are entries of one dict started each epoch, printed after the loop, with a count of steps
    beside them. 2 ranks at batch 8 must print the single process's lines at batch 16: every one of
    the 64 samples seen, 4 steps on each rank as in the single process. Control: without the one
    reduction of the three entries rank 0 counts its 32."""
    want, got = _two_ranks(tmp_path, ENTRIES, ENTRY_LINE, backend, ENTRY_SUM, reduced)
    assert len(want) == 3 and all(w[2:] == ("64", "4") for w in want), want
    assert len(got) == 3, got
    if reduced:
        assert all(g[2:] == w[2:] and abs(float(g[0]) - float(w[0])) <= 2e-6 and g[1] == w[1]
                   for g, w in zip(got, want)), f"2 ranks printed {got}, the single process {want}"
    else:
        assert all(g[2:] == ("32", "4") for g in got), f"control: rank 0 alone counts its half: {got}"
