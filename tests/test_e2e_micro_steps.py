"""Executed: gradient accumulation as an inner loop of micro-steps (nanoGPT's train.py), 2 ranks, gloo.

Two shapes (fixtures/DST402): ``micro_step_loop`` (module level, batches from get_batch's
torch.randint, GradScaler, clipping, ``while True:`` around the micro-step loop) and
``micro_step_iterator`` (in main(), batches from next(iter(loader))). DST402 reduces the gradients
on the last micro-step only (DDP: ``model.no_sync()`` on the others; FSDP2:
``set_requires_gradient_sync(micro_step == n - 1)``).

- one reduction per optimizer step: a counting DDP comm hook (tests/scripts/count_allreduce.py)
  or a count of FSDP2's reduce-scatters (tests/scripts/count_reduce_scatter.py) in the real launch;
  control: the same migration with the switch taken out (every micro-step reduces) fails that check;
- averaging stays right: the iterator shape's weights equal the original's at twice the batch
  (DDP, FSDP, and Horovod, whose DST111 averages once before the step); the get_batch shape, whose
  ranks draw their own batches, ends with the weights of the migration without the switch; control:
  no_sync on every micro-step, the last one too, ends elsewhere;
- compiled (``--compile-backend aot_eager``, DDP): no_sync on the wrapper of the compiled module
  still reduces once per step;
- DST204's re-seed goes before the ``while True:`` around the micro-step loop, not inside it: rank 0
  draws new batches at every step (control: the line inside the loop, main's output before this
  change, re-seeds rank 0 with the same seed every step, and its draws repeat).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    REPO_ROOT,
    assert_same_weights,
    executed,
    load_state,
    migrate,
    run_horovodrun,
    run_python,
    run_torchrun,
    sitecustomize_env,
)

pytestmark = pytest.mark.e2e

NPROC = 2
SCRIPTS = Path(__file__).resolve().parent / "scripts"
COUNTERS = {"ddp": (SCRIPTS / "count_allreduce.py", "allreduce"), "fsdp": (SCRIPTS / "count_reduce_scatter.py", "reduce_scatter")}
LOOP = REPO_ROOT / "fixtures" / "DST402" / "micro_step_loop.in.py"
ITERATOR = REPO_ROOT / "fixtures" / "DST402" / "micro_step_iterator.in.py"
ITERS, ACCUM = {"loop": 6, "iterator": 4}, {"loop": 4, "iterator": 3}
SOURCES = {"loop": LOOP, "iterator": ITERATOR}


def _args(shape: str, batch: int = 4, extra=()):
    if shape == "loop":
        return ["--max_iters", ITERS[shape], "--batch_size", batch, "--gradient_accumulation_steps", ACCUM[shape],
                "--out", "final.pt", *extra]
    return ["--batch-size", batch, "--accum", ACCUM[shape], "--iters", ITERS[shape], "--out", "final.pt", *extra]


def _without_switch(text: str, backend: str) -> str:
    """The migration with DST402's switch taken out: every micro-step reduces (the no-skip run)."""
    lines = text.splitlines(keepends=True)
    if backend == "fsdp":
        kept = [line for line in lines if ".set_requires_gradient_sync(" not in line]
        assert len(kept) == len(lines) - 1, "no sync switch to take out"
        return "".join(kept)
    at = next(i for i, line in enumerate(lines) if "with model.no_sync() if " in line)
    indent = len(lines[at]) - len(lines[at].lstrip())
    out = lines[:at]
    i = at + 1
    while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
        out.append(lines[i][4:] if lines[i].strip() else lines[i])
        i += 1
    out += lines[i:]
    control = "".join(out)
    compile(control, "control.py", "exec")
    return control


@pytest.fixture
def migrated(tmp_path):
    """migrated(shape, backend): the fixture migrated with the real CLI, in this test's folder (every test
    that declares a run migrates its case itself)."""

    def get(shape: str, backend: str) -> Path:
        target = tmp_path / f"{shape}-{backend}" / "train.py"
        target.parent.mkdir(exist_ok=True)
        if not target.exists():
            migrate(SOURCES[shape], target, backend=backend)
        text = target.read_text()
        if backend == "ddp":
            assert "with model.no_sync() if " in text
        elif backend == "fsdp":
            assert ".set_requires_gradient_sync(" in text
        return target

    return get


def _counted(backend: str, script: Path, args, workdir: Path):
    counter, _ = COUNTERS[backend]
    out = workdir / "counts"
    out.mkdir()
    run_torchrun(counter, [out, script, *args], nproc=NPROC, cwd=workdir, timeout=400)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(NPROC)]


def _one_reduction_per_step(backend: str, counts, steps: int) -> None:
    _, key = COUNTERS[backend]
    for c in counts:
        assert c["steps"] == steps, c
        assert c[key] == c["steps"], f"expected one gradient reduction per optimizer step, got {c}"
        if backend == "ddp":
            assert c["bytes"] == c["steps"] * c["param_bytes"], c


@pytest.mark.parametrize(
    "shape,backend",
    [executed("DST402/micro_step_loop", b, "loop", b, id=f"loop-{b}") for b in ("ddp", "fsdp")]
    + [executed("DST402/micro_step_iterator", b, "iterator", b, id=f"iterator-{b}") for b in ("ddp", "fsdp")],
)
def test_one_reduction_per_optimizer_step(migrated, tmp_path, shape, backend):
    counts = _counted(backend, migrated(shape, backend), _args(shape), tmp_path)
    _one_reduction_per_step(backend, counts, ITERS[shape])


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
def test_control_without_the_switch_reduces_every_micro_step(migrated, tmp_path, backend):
    control = tmp_path / "control.py"
    control.write_text(_without_switch(migrated("loop", backend).read_text(), backend))
    counts = _counted(backend, control, _args("loop"), tmp_path)
    _, key = COUNTERS[backend]
    assert all(c[key] == c["steps"] * ACCUM["loop"] for c in counts), counts
    with pytest.raises(AssertionError, match="one gradient reduction per optimizer step"):
        _one_reduction_per_step(backend, counts, ITERS["loop"])


@pytest.fixture(scope="module")
def original_iterator(tmp_path_factory):
    work = tmp_path_factory.mktemp("micro-original")
    run_python(ITERATOR, _args("iterator", batch=NPROC * 4), cwd=work)
    return load_state(work / "final.pt")


@pytest.mark.parametrize(
    "backend",
    [executed("DST402/micro_step_iterator", b, b, id=b) for b in ("ddp", "fsdp", "horovod")],
)
def test_iterator_weights_equal_the_original_at_twice_the_batch(migrated, original_iterator, tmp_path, backend):
    script = tmp_path / "train.py"
    if backend == "horovod":
        migrate(ITERATOR, script, backend="horovod")
        assert "hvd.grouped_allreduce_(" in script.read_text()  # DST111: once, before the step
        run_horovodrun(script, _args("iterator"), nproc=NPROC, cwd=tmp_path, timeout=400)
    else:
        script = migrated("iterator", backend)
        run_torchrun(script, _args("iterator"), nproc=NPROC, cwd=tmp_path, timeout=400)
    assert_same_weights(original_iterator, load_state(tmp_path / "final.pt"), atol=1e-5, label=f"iterator-{backend}")


def test_control_weights_differ_when_no_micro_step_reduces(migrated, original_iterator, tmp_path):
    """The weight check can fail: with no_sync on every micro-step (the last one too) each rank steps
    on its own gradients and rank 0's weights are not the original's."""
    text = migrated("iterator", "ddp").read_text()
    switch = "with model.no_sync() if k != args.accum - 1 else contextlib.nullcontext():"
    assert switch in text
    script = tmp_path / "never.py"
    script.write_text(text.replace(switch, "with model.no_sync():"))
    run_torchrun(script, _args("iterator"), nproc=NPROC, cwd=tmp_path, timeout=400)
    with pytest.raises(AssertionError):
        assert_same_weights(original_iterator, load_state(tmp_path / "final.pt"), atol=1e-5, label="never")


@pytest.mark.parametrize("backend", [executed("DST402/micro_step_loop", b, b, id=b) for b in ("ddp", "fsdp")])
def test_loop_weights_equal_the_migration_without_the_switch(migrated, tmp_path, backend):
    script = migrated("loop", backend)
    skip = tmp_path / "skip"
    skip.mkdir()
    run_torchrun(script, _args("loop"), nproc=NPROC, cwd=skip, timeout=400)
    every = tmp_path / "every"
    every.mkdir()
    control = every / "control.py"
    control.write_text(_without_switch(script.read_text(), backend))
    run_torchrun(control, _args("loop"), nproc=NPROC, cwd=every, timeout=400)
    assert_same_weights(load_state(every / "final.pt"), load_state(skip / "final.pt"), atol=1e-6, label=f"loop-{backend}")


def test_compiled_model_reduces_once_per_step(migrated, tmp_path):
    counts = _counted("ddp", migrated("loop", "ddp"), _args("loop", extra=["--compile-backend", "aot_eager"]), tmp_path)
    _one_reduction_per_step("ddp", counts, ITERS["loop"])


RESEED = "torch.manual_seed(torch.initial_seed() + dist.get_rank())\n"
_RANDINT_SPY = '''
import os

_DRAWS = os.environ.get("DISTIFY_E2E_RANDINT_DIR")

if _DRAWS:
    import atexit
    import json

    drawn = []

    def _patch(torch):
        real = torch.randint

        def randint(*args, **kwargs):
            out = real(*args, **kwargs)
            if kwargs.get("generator") is None:
                drawn.append(out.flatten().tolist())
            return out

        torch.randint = randint

    _after_torch_import(_patch)

    def _dump():
        with open(os.path.join(_DRAWS, "draws%s.json" % os.environ.get("RANK", "single")), "w") as f:
            json.dump(drawn, f)

    atexit.register(_dump)
'''


@pytest.mark.parametrize("reseed_inside", [False, True], ids=["reseed-before-the-loop", "control-reseed-inside"])
def test_rank_zero_draws_new_batches_at_every_step(migrated, tmp_path, reseed_inside):
    text = migrated("loop", "ddp").read_text()
    assert text.count(RESEED) == 1 and text.index(RESEED) < text.index("while True:\n"), "re-seed not before the loop"
    script = tmp_path / "train.py"
    if reseed_inside:  # main's output before DST204 looked past the `while`: the re-seed ran at every step
        text = text.replace(RESEED, "").replace("while True:\n", "while True:\n    " + RESEED, 1)
    script.write_text(text)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    env = sitecustomize_env(tmp_path / "spy", _RANDINT_SPY, {"DISTIFY_E2E_RANDINT_DIR": str(dumps)})
    run_torchrun(script, _args("loop"), nproc=NPROC, env=env, cwd=tmp_path, timeout=400)
    draws = [json.loads((dumps / f"draws{r}.json").read_text()) for r in range(NPROC)]
    n = ACCUM["loop"]
    steps = [[d[i * n:(i + 1) * n] for i in range(ITERS["loop"])] for d in draws]
    assert all(len(s[-1]) == n for s in steps), "the spy recorded fewer draws than micro-steps"
    assert steps[0] != steps[1], "both ranks drew the same batches"
    repeated = steps[0][0] == steps[0][1]
    assert repeated is reseed_inside, "rank 0's batches repeat at every step" if repeated else "control: they did not repeat"
