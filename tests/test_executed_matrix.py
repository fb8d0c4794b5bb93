"""The executed matrix of issue 22: every shape it lists is launched on 2 ranks under each backend it has
a golden for (torchrun for ddp and fsdp, horovodrun --gloo for horovod).

An end-to-end test declares what it executes with a ``runs(case, backend)`` mark (on the test, or on
a parameter: ``e2e_support.executed``); tests/conftest.py fails a passing test that never migrated a
case it declares, so a declaration cannot outlive what its test does. This module reads the
declarations of every tests/test_e2e_*.py without running them and checks, for each shape below,
that every backend with a golden output (``<case>.<backend>.py``) is declared, or is listed in
NOT_EXECUTED with the reason. A new golden of a listed shape without an executed run, or a shape
whose test lost its parameter, fails here, in the quick run. Controls: the same check over the
declarations with one taken away, and over a fixture folder with one more golden, reports it.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS.parent / "fixtures"
BACKENDS = ("ddp", "horovod", "fsdp")

# The shapes of issue 22 (fixtures/<case>.in.py): early stops, rank-0-only and conditional loads,
# callable training and loaders built in place, an optimizer without a name, modules pickled in a
# checkpoint dict, the model's last change before the wrap, the compile order, the training sums,
# console writes.
SHAPES = (
    "DST207/early_stopping_object", "DST207/last_loss_stop", "DST207/patience", "DST207/solved_threshold",
    "DST207/stop_in_function", "DST207/while_not_done",
    "DST308/rank0_load_after_wrap", "DST308/rank0_load_before_shard", "DST308/resume_args_epoch",
    "DST112/load_in_function", "DST112/resume_epoch",
    "scenarios/annotated_transformer", "DST201/loader_in_place",
    "DST111/optimizer_in_schedule",
    "DST102/save_state_by_name", "DST111/pickled_optimizer",
    "DST101/init_after_build", "DST101/init_under_other_names", "DST101/init_through_instance_containers",
    "DST907/compile_after_optimizer",
    "DST206/epoch_loss", "DST206/accuracy_on_train_set", "DST206/loss_list_scheduler",
    "DST206/weighted_sampler_epoch", "DST206/loss_from_own_function", "DST206/tensor_counters",
    "DST206/dict_counters",
    "DST302/console_writes",
    "DST104/early_return_forward",
    "DST131/sparse_autoencoder", "DST131/trainer_sum_criterion",
    "DST307/instance_attribute_outside", "DST102/instance_attribute_outside", "DST307/model_handed_to_class",
    "DST307/getter_in_place", "DST102/getter_in_place", "DST201/loader_in_constructor",
    "DST308/rank0_load_plain_sgd", "DST102/fit_method_on_model", "DST102/submodules_in_training",
    "DST307/unwrap_alias_save", "DST102/named_parameters_save", "DST304/atomic_save_rotation",
    "DST308/scheduler_loaded_in_function", "DST306/numpy_feature_cache",
    "DST304/torchscript_export", "DST101/lazy_modules_dry_run",
)

# (case, backend) with a golden that no end-to-end test runs, and why
NOT_EXECUTED: dict = {}


def goldens(case: str, fixtures: Path = FIXTURES) -> set:
    """The backends whose migration of fixtures/<case>.in.py has an expected output (a refusal has
    only <case>.<backend>.warnings, an unchanged file nothing: neither is launched)."""
    return {backend for backend in BACKENDS if (fixtures / f"{case}.{backend}.py").is_file()}


def _marks(obj) -> list:
    marks = getattr(obj, "pytestmark", [])
    return [getattr(m, "mark", m) for m in (marks if isinstance(marks, list) else [marks])]


def _runs(marks) -> set:
    return {(m.args[0], backend) for m in marks if m.name == "runs" for backend in m.args[1:]}


def declared_in(module) -> dict:
    """(case, backend) -> the tests of `module` that declare it: ``runs`` marks on the module, a
    test function or class, or a parameter of its ``parametrize``."""
    found: dict = {}
    module_marks = _marks(module)
    tests = [(name, obj) for name, obj in vars(module).items() if name.startswith("test") and callable(obj)]
    for cls_name, cls in [(n, o) for n, o in vars(module).items() if n.startswith("Test") and isinstance(o, type)]:
        tests += [(f"{cls_name}.{n}", o) for n, o in vars(cls).items() if n.startswith("test") and callable(o)]
    for name, test in tests:
        marks = module_marks + _marks(test)
        runs = _runs(marks)
        for mark in marks:
            if mark.name == "parametrize":
                for value in mark.args[1]:
                    runs |= _runs(getattr(value, "marks", ()))
        for pair in runs:
            found.setdefault(pair, []).append(f"{module.__name__}::{name}")
    return found


def declared() -> dict:
    """Every ``runs`` declaration of tests/test_e2e_*.py."""
    sys.path.insert(0, str(TESTS))
    found: dict = {}
    for path in sorted(TESTS.glob("test_e2e_*.py")):
        for pair, tests in declared_in(importlib.import_module(path.stem)).items():
            found.setdefault(pair, []).extend(tests)
    return found


def gaps(shapes, runs: dict, fixtures: Path = FIXTURES, excused: dict = NOT_EXECUTED) -> list:
    """The (case, backend) of `shapes` with a golden, neither declared in `runs` nor excused."""
    return [(case, backend) for case in shapes for backend in sorted(goldens(case, fixtures))
            if (case, backend) not in runs and (case, backend) not in excused]


@pytest.fixture(scope="module")
def runs() -> dict:
    return declared()


def test_every_listed_shape_has_its_fixture():
    assert all((FIXTURES / f"{case}.in.py").is_file() for case in SHAPES), [
        case for case in SHAPES if not (FIXTURES / f"{case}.in.py").is_file()]


def test_every_golden_of_the_shapes_is_executed(runs):
    missing = gaps(SHAPES, runs)
    assert not missing, (
        "goldens no end-to-end test launches (add the backend to the shape's test with "
        f"e2e_support.executed(case, backend, ...), or say why in NOT_EXECUTED): {missing}")


def test_every_declaration_runs_a_golden(runs):
    """A declared (case, backend) without a golden output would claim a launch of a migration that
    is refused or leaves the file unchanged; an excuse for a pair that runs is stale."""
    assert not [pair for pair in runs if pair[1] not in goldens(pair[0])], sorted(runs)
    assert not [pair for pair in NOT_EXECUTED if pair in runs or pair[1] not in goldens(pair[0])]


def test_control_a_lost_parameter_is_reported(runs):
    pair = ("DST207/patience", "horovod")
    assert pair in runs and pair not in gaps(SHAPES, runs)
    assert set(gaps(SHAPES, {p: t for p, t in runs.items() if p != pair})) - set(gaps(SHAPES, runs)) == {pair}


def test_control_a_new_golden_is_reported(runs, tmp_path):
    import shutil

    shapes = ("DST102/save_state_by_name", "DST207/patience")  # the first refused under FSDP (DST925)
    for case in shapes:
        (tmp_path / case).parent.mkdir(parents=True, exist_ok=True)
        for backend in goldens(case):
            shutil.copyfile(FIXTURES / f"{case}.{backend}.py", tmp_path / f"{case}.{backend}.py")
    assert gaps(shapes, runs, tmp_path) == []
    (tmp_path / "DST102" / "save_state_by_name.fsdp.py").write_text("# FSDP now migrates it\n")
    assert gaps(shapes, runs, tmp_path) == [("DST102/save_state_by_name", "fsdp")]


def test_control_marks_on_parameters_and_tests_are_read():
    """declared_in reads a test's own mark, a module's, and a parameter's (a module built here)."""
    import types

    module = types.ModuleType("fake_e2e")
    module.pytestmark = [pytest.mark.e2e, pytest.mark.runs("A/module", "ddp")]

    @pytest.mark.runs("A/test", "fsdp", "ddp")
    def test_one():
        pass

    @pytest.mark.parametrize("backend", [pytest.param("horovod", marks=pytest.mark.runs("A/param", "horovod")), "x"])
    def test_two(backend):
        pass

    module.test_one, module.test_two = test_one, test_two
    found = declared_in(module)
    assert set(found) == {("A/module", "ddp"), ("A/test", "fsdp"), ("A/test", "ddp"), ("A/param", "horovod")}
    assert found["A/module", "ddp"] == ["fake_e2e::test_one", "fake_e2e::test_two"]


def test_a_declaration_its_test_never_migrates_fails_it():
    """conftest's pytest_runtest_call: a passing test whose ``runs`` case was never migrated fails;
    control: the same test having migrated it passes."""
    import conftest
    import e2e_support

    class Item:
        def iter_markers(self, name):
            return [pytest.mark.runs("DST207/patience", "horovod").mark] if name == "runs" else []

    def call(migrated):
        hook = conftest.pytest_runtest_call(Item())
        next(hook)
        e2e_support.MIGRATED.extend(migrated)
        with pytest.raises(StopIteration):
            hook.send(None)

    with pytest.raises(AssertionError, match="never migrated"):
        call([("DST207/patience", "ddp")])
    call([("DST207/patience", "horovod")])
    e2e_support.MIGRATED.clear()
