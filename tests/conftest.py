"""Shared pytest fixtures (keep this file small)."""

from __future__ import annotations

import os

import pytest

# Variables through which a launcher (torchrun, Kubeflow, Slurm, MPI, Horovod) or the user tells a
# process where it sits in a job, plus distify's own knobs. A test that starts "plain python" must
# not inherit any of them from the shell that runs pytest (e.g. pytest itself inside an srun step).
_LAUNCHER_PREFIXES = (
    "SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "HOROVOD_", "TORCHELASTIC_", "DISTIFY_",
)
_LAUNCHER_NAMES = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
}


def launcher_free_environ() -> dict:
    """A copy of os.environ without launcher variables, with one OpenMP thread per process."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCHER_NAMES and not k.startswith(_LAUNCHER_PREFIXES)
    }
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def launcher_free_env() -> dict:
    """Environment for subprocesses that must look like a plain ``python train.py`` run."""
    return launcher_free_environ()
