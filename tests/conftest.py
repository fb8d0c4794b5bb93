"""Shared pytest fixtures (keep this file small)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from e2e_support import clean_env  # noqa: E402  (one definition of a launcher-free environment)


def launcher_free_environ() -> dict:
    """A copy of os.environ without launcher variables, with one OpenMP thread per process."""
    return clean_env()


@pytest.fixture
def launcher_free_env() -> dict:
    """Environment for subprocesses that must look like a plain ``python train.py`` run."""
    return launcher_free_environ()


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
