"""Shared pytest fixtures (keep this file small)."""

from __future__ import annotations

import re
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from e2e_support import clean_env  # noqa: E402  (one definition of a launcher-free environment)


def launcher_free_environ() -> dict:
    """A copy of os.environ without launcher variables, with one OpenMP thread per process."""
    return clean_env()


# --- Horovod -------------------------------------------------------------------------------
# Every test that needs Horovod carries ``@pytest.mark.horovod`` (or a ``horovod`` param mark) and
# nothing else: where ``horovod.torch`` cannot be imported (a fresh machine; Horovod is not in the
# test extras, see README) the hook below skips it with one reason, shown once by ``pytest -rs``.
# ``.ci/run`` sets DISTIFY_REQUIRE_HOROVOD=1 for its main environment, which has Horovod: there a
# missing Horovod fails the tests instead, so CI cannot pass by skipping them.
_horovod_problem: list = []


def horovod_problem() -> "str | None":
    """Why ``horovod.torch`` cannot be used here (its import's last error line), or None.

    Imported in a child process, once per session: importing it here would put an uninitialised
    ``horovod.torch`` into the test process's ``sys.modules``, which the runtime looks at."""
    if not _horovod_problem:
        import importlib.util

        if importlib.util.find_spec("horovod") is None:
            problem = "No module named 'horovod'"
        else:
            proc = subprocess.run([sys.executable, "-c", "import horovod.torch"], env=launcher_free_environ(),
                                  capture_output=True, text=True, timeout=120)
            problem = None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]
        _horovod_problem.append(problem)
    return _horovod_problem[0]


# --- the quick run and the full matrix ----------------------------------------------------------
# `python -m pytest -q` (the README's test command) runs every unit test -- every rule's fixtures and
# goldens, the audit, lint, the CLI, the runtime -- and, of the end-to-end tests (marked `e2e`: they
# launch real training processes), one representative case per backend plus the launcher contract.
# Of an exhaustive sweep over every fixture (the metamorphic spelling checks, the fuzz, the
# fast-path equivalences) it runs a deterministic sample: the cases outside the sample carry the
# `sweep` mark and, like the end-to-end matrix, run only with `--full`, which adds the whole
# end-to-end matrix too: every scenario, corpus script and golden launched, under torchrun, FSDP and
# horovodrun. CI runs both (.ci/run; tests/test_ci_selection.py checks that its two steps together
# run every test `--full` collects).
QUICK_E2E = (
    "tests/test_e2e_ddp.py::test_ddp_two_ranks_match_big_batch[examples_style]",
    "tests/test_e2e_ddp.py::test_ddp_side_effects_happen_once[examples_style]",
    "tests/test_e2e_fsdp.py::test_fsdp_two_ranks_match_big_batch[examples_style]",
    "tests/test_e2e_horovod.py::test_horovod_two_ranks_match_big_batch[examples_style]",
    "tests/test_warm_launcher.py::",  # the warm launcher against real torchrun/horovodrun launches
    "tests/test_e2e_projects.py::test_loop_in_module[torchrun-ddp]",  # a training loop in another module
)


def pytest_addoption(parser) -> None:
    parser.addoption("--full", action="store_true", default=False,
                     help="run the full end-to-end matrix and every sweep case too (CI); without it, one "
                          "end-to-end case per backend and a sample of each sweep")


def _quick(nodeid: str) -> bool:
    return any(nodeid == wanted or (wanted.endswith("::") and nodeid.startswith(wanted)) for wanted in QUICK_E2E)


# Test modules whose module-scoped fixture runs one batch for all their cases (every golden at once;
# the six benchmarks side by side): under pytest-xdist (-n, see pyproject.toml) their cases go to one
# worker, or each worker would run the whole batch again.
ONE_WORKER_MODULES = ("tests/test_goldens_run.py", "tests/test_bench_smoke.py")


def _select_quick_run(config, items) -> None:
    if config.getoption("--full"):
        return
    keep, drop = [], []
    for item in items:
        full_only = item.get_closest_marker("sweep") is not None or (
            item.get_closest_marker("e2e") is not None and not _quick(item.nodeid))
        (drop if full_only else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    # A representative case renamed away would silently leave its backend untested.
    collected_files = {item.nodeid.split("::")[0] for item in keep + drop}
    for wanted in QUICK_E2E:
        if wanted.split("::")[0] in collected_files and not any(_quick(i.nodeid) and i.nodeid.startswith(
                wanted.rstrip(":")) for i in keep):
            raise pytest.UsageError(f"conftest.QUICK_E2E names {wanted}, which no longer exists")


_imports_torch: dict = {}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``torch`` every test of a module that imports torch anywhere (at the top or inside a
    test): the tests whose outcome can depend on the torch version. CI's second environment
    (torch 2.13.0) reruns those, after its first ran everything against the newest torch."""
    _select_quick_run(config, items)
    for item in items:
        module = item.nodeid.split("::")[0]
        if module in ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(module))
        path = str(item.fspath)
        if path not in _imports_torch:
            try:
                source = open(path, encoding="utf-8").read()
            except OSError:
                source = ""
            _imports_torch[path] = bool(re.search(r"^\s*(import torch\b|from torch\b)", source, re.M))
        if _imports_torch[path]:
            item.add_marker(pytest.mark.torch)


def declared_runs(item) -> set:
    """The (case, backend) pairs an end-to-end test declares with ``runs`` marks."""
    return {(mark.args[0], backend) for mark in item.iter_markers("runs") for backend in mark.args[1:]}


def undeclared_runs(declared: set, migrated) -> set:
    """What a test declares it executes but never migrated (e2e_support.MIGRATED)."""
    return declared - set(migrated)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A ``runs`` mark is a claim tests/test_executed_matrix.py counts: a test that passes without
    migrating (and so launching) a case it declares fails here, so no declaration outlives its test."""
    import e2e_support

    declared = declared_runs(item)
    e2e_support.MIGRATED.clear()
    result = yield
    missing = undeclared_runs(declared, e2e_support.MIGRATED)
    if missing:
        raise AssertionError(f"marked runs{sorted(missing)} but never migrated them (tests/e2e_support.migrate)")
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    if item.get_closest_marker("horovod") is None:
        return
    problem = horovod_problem()
    if problem is None:
        return
    message = f"horovod.torch cannot be imported ({problem}); install it with .ci/install-horovod.sh"
    if os.environ.get("DISTIFY_REQUIRE_HOROVOD") == "1":
        pytest.fail(f"DISTIFY_REQUIRE_HOROVOD=1 but {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(autouse=True)
def _horovod_stays_out_of_the_test_process():
    """distify.runtime takes Horovod's paths when ``horovod.torch`` is in ``sys.modules``: a test
    that imports it here (``pytest.importorskip("horovod.torch")``) changes every later test of
    its worker. Mark such a test ``horovod`` instead (its check runs in a child process)."""
    had = "horovod.torch" in sys.modules
    yield
    if not had and "horovod.torch" in sys.modules:
        pytest.fail("this test imported horovod.torch into the test process; mark it `horovod` instead",
                    pytrace=False)


@pytest.fixture
def launcher_free_env() -> dict:
    """Environment for subprocesses that must look like a plain ``python train.py`` run."""
    return launcher_free_environ()


# --- devices: torch.accelerator faked, or absent -------------------------------------------
# The runtime and the --standalone class pick the device through torch.accelerator (torch >= 2.6)
# and fall back to CUDA-or-CPU without it; these stand in for either on a CPU-only machine.

@pytest.fixture
def no_accelerator_api(monkeypatch):
    """torch as it was before torch.accelerator (torch < 2.6): the runtime's fallback path."""
    import torch

    monkeypatch.delattr(torch, "accelerator", raising=False)


class FakeAccelerator:
    """Stands in for ``torch.accelerator`` on a machine with ``count`` devices of type ``kind``."""

    def __init__(self, kind, count, old_spelling=False):
        self.kind, self.count, self.current = kind, count, None
        if old_spelling:  # torch 2.6 named it set_device_idx
            self.set_device_idx = self._set
        else:
            self.set_device_index = self._set

    def is_available(self):
        return self.count > 0

    def current_accelerator(self, check_available=False):
        return SimpleNamespace(type=self.kind) if self.count else None

    def device_count(self):
        return self.count

    def _set(self, index):
        self.current = index


@pytest.fixture
def fake_accelerator(monkeypatch):
    """``fake_accelerator(kind, count)`` installs a FakeAccelerator and returns it; CUDA's own
    functions fail the test if the accelerator path calls them."""

    import torch

    def install(kind, count, old_spelling=False):
        fake = FakeAccelerator(kind, count, old_spelling)
        monkeypatch.setattr(torch, "accelerator", fake)
        monkeypatch.setattr(torch.cuda, "set_device", lambda i: pytest.fail("torch.cuda.set_device called"))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("torch.cuda.is_available called"))
        return fake

    return install


# --- CLI / IO tests -------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory, monkeypatch):
    """Each test gets an empty distify cache of its own (inherited by the subprocesses it starts):
    runs within a test use the cache, as a user's do; nothing leaks between tests or into ~/.cache."""
    monkeypatch.setenv("DISTIFY_CACHE_DIR", str(tmp_path_factory.mktemp("distify-cache")))


SCENARIOS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "scenarios")


@pytest.fixture
def train_py(tmp_path):
    """A copy of a training script that changes under ddp: ``tmp_path/train.py``."""
    import shutil

    return shutil.copyfile(os.path.join(SCENARIOS, "module_level.in.py"), tmp_path / "train.py")


@pytest.fixture
def infer_py(tmp_path):
    """A copy of a torch script without training (comes out unchanged): ``tmp_path/infer.py``."""
    import shutil

    return shutil.copyfile(os.path.join(SCENARIOS, "inference_only.in.py"), tmp_path / "infer.py")


@pytest.fixture
def cli():
    """Run ``distify ARGS`` in-process; returns click's Result (``.exit_code``, ``.stdout_bytes``,
    ``.stderr``). Fails the test on an uncaught exception, which CliRunner would report as exit 1."""
    from typer.testing import CliRunner

    from distify.cli import app

    def invoke(*args, input=None):
        result = CliRunner().invoke(app, [str(a) for a in args], input=input)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result

    return invoke
