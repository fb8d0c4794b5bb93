"""distify.runtime: environment discovery, errors, backend choice, init kwargs, helpers.

Discovery is tested in-process with plain dicts; anything that initialises a real process group
runs in a subprocess with a launcher-free environment so the pytest process stays clean.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distify import runtime
from distify.runtime import DistifyEnvError, Environment, discover, expand_nodelist, first_host

E = Environment

# ------------------------------------------------------------------------------- discover()

TORCHRUN = {
    "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "node0", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "abc",
    "GROUP_RANK": "1",
}
KUBEFLOW = {
    "RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
}
SRUN = {  # task 5 of an 8-task srun step on 5 nodes
    "SLURM_JOB_ID": "123456", "SLURM_PROCID": "5", "SLURM_NTASKS": "8",
    "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
    "SLURM_JOB_NODELIST": "gpu[01-04,07],cpu5", "SLURM_NODELIST": "gpu[01-04,07],cpu5",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
}
HOROVOD_GLOO = {  # what `horovodrun --gloo -np 2 -H localhost:2` exports (checked on this machine)
    "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1",
    "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
    "HOROVOD_HOSTNAME": "localhost", "HOROVOD_CONTROLLER": "gloo",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "40000",
}
MPICH = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}


@pytest.mark.parametrize(
    "environ, expected",
    [
        pytest.param({}, E(0, 1, 0, None, None, "none"), id="none"),
        pytest.param(TORCHRUN, E(3, 4, 1, "node0", 29400, "torchrun"), id="torchrun"),
        pytest.param(
            {**TORCHRUN, "TORCHELASTIC_RUN_ID": "", "LOCAL_WORLD_SIZE": ""},
            E(3, 4, 1, "node0", 29400, "torchrun"),
            id="launch-use-env-style",
        ),
        pytest.param(KUBEFLOW, E(2, 3, 0, "job-master-0", 23456, "kubeflow"), id="kubeflow"),
        pytest.param(
            {"RANK": "0", "WORLD_SIZE": "1"}, E(0, 1, 0, "127.0.0.1", 29500, "kubeflow"),
            id="env-world-of-one",
        ),
        # port: 10000 + 123456 % 20000
        pytest.param(SRUN, E(5, 8, 1, "gpu01", 13456, "slurm"), id="slurm-srun"),
        pytest.param(
            {**SRUN, "SLURM_STEP_NUM_TASKS": "", "SLURM_STEP_ID": "", "SLURM_STEPID": "3"},
            E(5, 8, 1, "gpu01", 13456, "slurm"),
            id="slurm-old-stepid-spelling",
        ),
        pytest.param(  # a step on part of the allocation: the step's own task count and nodes
            {**SRUN, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
             "SLURM_STEP_NODELIST": "node[003-004]"},
            E(1, 2, 1, "node003", 13456, "slurm"),
            id="slurm-step-subset",
        ),
        pytest.param(
            {**SRUN, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"},
            E(0, 1, 1, "127.0.0.1", 13456, "slurm"),
            id="slurm-single-task",
        ),
        pytest.param(OPENMPI, E(6, 8, 2, None, 29500, "mpi"), id="openmpi-multinode"),
        pytest.param(
            {**OPENMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, E(6, 8, 2, "127.0.0.1", 29500, "mpi"),
            id="openmpi-one-node",
        ),
        pytest.param(HOROVOD_GLOO, E(1, 2, 1, "127.0.0.1", 29500, "horovod"), id="horovod"),
        pytest.param(MPICH, E(3, 4, 1, None, 29500, "mpi"), id="mpich-pmi"),
    ],
)
def test_discover_flavours(environ, expected):
    assert discover(environ) == expected


@pytest.mark.parametrize(
    "step",
    [None, "", "batch", "extern", "4294967291", "4294967292", "4294967290", "4294967294"],
)
def test_sbatch_batch_step_is_one_process(step):
    """`python train.py` in an sbatch script sees the allocation's SLURM_NTASKS but is ONE
    process; reading it as rank 0 of 4 would wait forever for three peers."""
    environ = {
        "SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "node[1-4]",
    }
    if step is not None:
        environ["SLURM_STEP_ID"] = step
    assert discover(environ) == E(0, 1, 0, None, None, "none")


@pytest.mark.parametrize(
    "extra, field, value",
    [
        ({"LOCAL_RANK": "3"}, "local_rank", 3),
        ({"MASTER_ADDR": "10.1.2.3"}, "master_addr", "10.1.2.3"),
        ({"MASTER_PORT": "1234"}, "master_port", 1234),
    ],
)
def test_explicit_variables_beat_slurm_inference(extra, field, value):
    assert getattr(discover({**SRUN, **extra}), field) == value
    assert discover({**SRUN, **extra}).source == "slurm"


def test_explicit_rank_beats_every_launcher():
    """torchrun started by srun / mpirun: its RANK/WORLD_SIZE describe the real process."""
    environ = {**SRUN, **OPENMPI, **HOROVOD_GLOO, **MPICH, **TORCHRUN}
    assert discover(environ) == E(3, 4, 1, "node0", 29400, "torchrun")


def test_launcher_precedence_between_schedulers():
    # horovodrun over MPI exports both; Horovod's view wins
    assert discover({**OPENMPI, **HOROVOD_GLOO}).source == "horovod"
    # mpirun inside an allocation starts its daemons with srun: SLURM_PROCID is the daemon's
    assert discover({**SRUN, **OPENMPI}) == E(6, 8, 2, None, 29500, "mpi")
    assert discover({**SRUN, **OPENMPI, "MASTER_ADDR": "gpu01"}).master_addr == "gpu01"
    # srun --mpi=pmi2 sets PMI_* consistent with Slurm: Slurm's reading knows the master host
    agree = {**SRUN, "PMI_RANK": "5", "PMI_SIZE": "8"}
    assert discover(agree).source == "slurm" and discover(agree).master_addr == "gpu01"
    # Intel MPI/hydra proxies started by srun: Slurm values describe proxies, PMI wins
    disagree = {**SRUN, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", **MPICH}
    assert discover(disagree) == E(3, 4, 1, None, 29500, "mpi")


def test_empty_values_count_as_unset():
    assert discover({"RANK": "", "WORLD_SIZE": " ", "MASTER_PORT": ""}).source == "none"


def test_explicit_local_rank_without_launcher_is_honoured():
    assert discover({"LOCAL_RANK": "1"}) == E(0, 1, 1, None, None, "none")


def test_discover_reads_os_environ_by_default_and_is_pure(monkeypatch):
    monkeypatch.setattr(os, "environ", dict(KUBEFLOW))
    before = dict(os.environ)
    environ = dict(SRUN)
    assert discover() == E(2, 3, 0, "job-master-0", 23456, "kubeflow")
    discover(environ)
    assert dict(os.environ) == before and environ == SRUN


def test_environment_is_frozen():
    env = discover({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.rank = 1  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(Environment)] == [
        "rank", "world_size", "local_rank", "master_addr", "master_port", "source",
    ]


# --------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is missing"),
        ({"RANK": "0"}, "RANK is set but WORLD_SIZE is missing"),
        ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' is not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 is not a positive integer"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 is not a non-negative integer"),
        ({**KUBEFLOW, "MASTER_PORT": "abc"}, "MASTER_PORT='abc' is not a port number"),
        ({**KUBEFLOW, "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a port number"),
        ({**KUBEFLOW, "MASTER_PORT": "0"}, "MASTER_PORT='0' is not a port number"),
        ({**SRUN, "MASTER_PORT": "-5"}, "MASTER_PORT='-5' is not a port number"),
        ({**TORCHRUN, "LOCAL_RANK": "2"}, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
        ({**TORCHRUN, "LOCAL_RANK": "x"}, "LOCAL_RANK='x' is not an integer"),
        ({**SRUN, "SLURM_PROCID": "8"}, "SLURM_PROCID=8 is not below SLURM_STEP_NUM_TASKS=8"),
        ({**SRUN, "SLURM_LOCALID": "-1"}, "SLURM_LOCALID=-1 is not a non-negative integer"),
        (
            {**SRUN, "SLURM_JOB_NODELIST": "gpu[01-", "SLURM_NODELIST": ""},
            "SLURM_JOB_NODELIST='gpu[01-' is not a valid Slurm node list",
        ),
        (
            {**OPENMPI, "OMPI_COMM_WORLD_RANK": "8"},
            "OMPI_COMM_WORLD_RANK=8 is not below OMPI_COMM_WORLD_SIZE=8",
        ),
        (
            {**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "4"},
            "OMPI_COMM_WORLD_LOCAL_RANK=4 is not below OMPI_COMM_WORLD_LOCAL_SIZE=4",
        ),
        ({"HOROVOD_SIZE": "2"}, "HOROVOD_SIZE is set but HOROVOD_RANK is missing"),
        ({"PMI_RANK": "0"}, "PMI_RANK is set but PMI_SIZE is missing"),
    ],
)
def test_error_sentences(environ, message):
    with pytest.raises(DistifyEnvError) as info:
        discover(environ)
    assert str(info.value) == message
    assert isinstance(info.value, RuntimeError)


def test_multinode_without_master_addr_exits_with_one_line(monkeypatch):
    monkeypatch.setattr(os, "environ", dict(OPENMPI))
    with pytest.raises(SystemExit) as info:
        runtime.init_kwargs()
    assert info.value.code == (
        "distify: MASTER_ADDR is not set and cannot be inferred for this mpi launch across "
        "several hosts (world size 8)"
    )


# ------------------------------------------------------------------------- Slurm node lists


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("gpu[01-04,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu5"]),
        ("node[001-003]", ["node001", "node002", "node003"]),
        ("single-host.example.org", ["single-host.example.org"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[7]", ["n7"]),
        ("a,b[2-3],c", ["a", "b2", "b3", "c"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("x[3-4]y", ["x3y", "x4y"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert list(expand_nodelist(nodelist)) == hosts
    assert first_host(nodelist) == hosts[0]


@pytest.mark.parametrize(
    "bad", ["", "gpu[01-", "gpu[]", "gpu[3-1]", "gpu]1[", "a,,b", "gpu[a-b]", "g[[1]]", "g[1-]",
            "g[-1]", "a b", "g[1,]", ","],
)
def test_bad_nodelists_name_the_variable(bad):
    with pytest.raises(DistifyEnvError) as info:
        list(expand_nodelist(bad, "SLURM_NODELIST"))
    assert str(info.value) == f"SLURM_NODELIST={bad!r} is not a valid Slurm node list"


def test_malformed_tail_is_reported_before_any_host():
    with pytest.raises(DistifyEnvError):
        first_host("good[1-2],bad[")


def test_first_host_of_a_huge_list_is_lazy():
    assert first_host("n[1-100000000]") == "n1"


@settings(max_examples=60, deadline=None)
@given(
    prefix=st.from_regex(r"[a-z][a-z0-9-]{0,6}", fullmatch=True),
    width=st.integers(1, 4),
    ranges=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 4)), min_size=1, max_size=4),
)
def test_expand_nodelist_roundtrip(prefix, width, ranges):
    parts, expected = [], []
    for start, length in ranges:
        stop = start + length
        parts.append(f"{start:0{width}d}" + (f"-{stop:0{width}d}" if length else ""))
        expected += [f"{prefix}{n:0{width}d}" for n in range(start, stop + 1)]
    assert list(expand_nodelist(f"{prefix}[{','.join(parts)}]")) == expected


# --------------------------------------------------------------------------- choose_backend
# Two paths pick the device and backend: torch.accelerator (torch >= 2.6), tested with a fake
# accelerator module in its place, and the CUDA-or-CPU fallback of older torch, tested with
# torch.accelerator removed.


@pytest.mark.parametrize("kind, backend", [("cuda", "nccl"), ("xpu", "xccl"), ("npu", "hccl")])
def test_choose_backend_asks_torch_for_the_accelerators_backend(monkeypatch, fake_accelerator, kind, backend):
    if kind == "npu":  # what importing torch_npu does: "npu" becomes a device type, with hccl
        real = torch.distributed.get_default_backend_for_device
        monkeypatch.setattr(torch.distributed, "get_default_backend_for_device",
                            lambda device: "hccl" if str(device) == "npu" else real(device))
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    fake_accelerator(kind, 2)
    assert runtime.choose_backend({}) == backend
    assert runtime.choose_backend({"DISTIFY_BACKEND": "gloo"}) == "gloo"


def test_accelerators_without_a_backend_of_their_own_train_on_the_cpu(monkeypatch, fake_accelerator):
    fake_accelerator("mps", 1)  # torch maps mps to gloo, which cannot reduce mps tensors
    assert runtime.choose_backend({}) == "gloo" and runtime._accelerator() is None
    fake_accelerator("hpu", 1)  # no backend registered for it at all
    monkeypatch.setattr(torch.distributed, "get_default_backend_for_device", _no_backend_for("hpu"))
    assert runtime._accelerator() is None
    fake_accelerator("cuda", 0)  # a CUDA build on a machine without a GPU
    assert runtime._accelerator() is None
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    fake_accelerator("cuda", 1)  # CUDA without NCCL (Windows): gloo reduces CUDA tensors
    assert runtime._accelerator() == ("cuda", "gloo")


def _no_backend_for(kind, answer=None):
    """get_default_backend_for_device as torch has it with no backend registered for ``kind``
    (answer None: it raises), or with ``answer`` registered for it."""
    real = torch.distributed.get_default_backend_for_device

    def lookup(device):
        if str(device) != kind:
            return real(device)
        if answer is None:
            raise ValueError(f"Default backend not registered for device : {kind}")
        return answer

    return lookup


def test_the_fake_test_backend_is_never_trained_on(monkeypatch, fake_accelerator):
    """torch 2.14 registers its no-communication "fake" backend as hpu's default once
    torch.distributed.fsdp is imported: choosing it would train without a single reduction."""
    fake_accelerator("hpu", 1)
    monkeypatch.setattr(torch.distributed, "get_default_backend_for_device", _no_backend_for("hpu", "fake"))
    assert runtime._accelerator() is None and runtime.choose_backend({}) == "gloo"
    monkeypatch.setattr(torch.distributed, "get_default_backend_for_device", _no_backend_for("hpu", "hccl"))
    assert runtime._accelerator() == ("hpu", "hccl")  # a real backend for it (Habana's) is used


def test_choose_backend_follows_cuda(monkeypatch, no_accelerator_api):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.choose_backend({}) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert runtime.choose_backend({}) == "nccl"
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    assert runtime.choose_backend({}) == "gloo"


@pytest.mark.parametrize("value, backend", [("gloo", "gloo"), ("NCCL", "nccl"), (" ucc ", "ucc"),
                                             ("mpi", "mpi"), ("XCCL", "xccl"), ("hccl", "hccl"), ("", "gloo")])
def test_choose_backend_override(monkeypatch, value, backend):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.choose_backend({"DISTIFY_BACKEND": value}) == backend


def test_choose_backend_rejects_unknown(monkeypatch):
    with pytest.raises(DistifyEnvError) as info:
        runtime.choose_backend({"DISTIFY_BACKEND": "nvlink"})
    assert str(info.value) == "DISTIFY_BACKEND='nvlink' is not one of nccl, gloo, mpi, ucc, xccl, hccl"
    monkeypatch.setattr(os, "environ", {"DISTIFY_BACKEND": "nvlink"})
    with pytest.raises(SystemExit, match="^distify: DISTIFY_BACKEND='nvlink'"):
        runtime.init_kwargs()


# ------------------------------------------------------------------- init_kwargs in-process
# os.environ is swapped for a plain dict so that what init_kwargs exports is thrown away.


def test_init_kwargs_on_an_accelerator_pass_its_device(monkeypatch, fake_accelerator):
    fake = fake_accelerator("xpu", 2)
    monkeypatch.setattr(os, "environ", dict(TORCHRUN))  # local rank 1
    kwargs = runtime.init_kwargs()
    assert kwargs["backend"] == "cpu:gloo,xpu:xccl"  # CPU tensors still reduce, on gloo
    assert kwargs["device_id"] == torch.device("xpu", 1) and fake.current == 1
    monkeypatch.setattr(os, "environ", {})  # plain python: the group of one gets it too
    assert runtime.init_kwargs()["device_id"] == torch.device("xpu", 0)
    monkeypatch.setattr(os, "environ", {"DISTIFY_BACKEND": "gloo"})  # not the accelerator's backend
    assert "device_id" not in runtime.init_kwargs()
    monkeypatch.setattr(os, "environ", {"DISTIFY_BACKEND": "xccl"})
    assert runtime.init_kwargs()["backend"] == "xccl"


def test_init_kwargs_never_pass_a_cpu_device_id(monkeypatch, fake_accelerator):
    fake_accelerator("cuda", 0)
    monkeypatch.setattr(os, "environ", dict(TORCHRUN))
    kwargs = runtime.init_kwargs()
    assert kwargs["backend"] == "gloo" and "device_id" not in kwargs


def test_init_kwargs_with_more_ranks_than_devices_exit_with_one_line(monkeypatch, fake_accelerator):
    fake = fake_accelerator("xpu", 1)
    monkeypatch.setattr(os, "environ", dict(TORCHRUN))
    with pytest.raises(SystemExit) as info:
        runtime.init_kwargs()
    assert info.value.code == "distify: LOCAL_RANK=1 but only 1 XPU device is visible"
    assert fake.current is None


def test_init_kwargs_without_the_accelerator_api_pass_no_device_id(monkeypatch, no_accelerator_api):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(os, "environ", dict(TORCHRUN))
    kwargs = runtime.init_kwargs()
    assert kwargs["backend"] == "cpu:gloo,cuda:nccl" and "device_id" not in kwargs


def test_init_kwargs_torchrun_uses_env_init(monkeypatch):
    monkeypatch.setattr(os, "environ", dict(TORCHRUN))
    kwargs = runtime.init_kwargs()
    assert kwargs == {
        "backend": runtime.choose_backend(), "init_method": "env://", "rank": 3,
        "world_size": 4, "timeout": datetime.timedelta(seconds=1800),
    }


def test_init_kwargs_torchrun_world_of_one_still_uses_agent_store(monkeypatch):
    monkeypatch.setattr(os, "environ", {**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1",
                                        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    assert runtime.init_kwargs()["init_method"] == "env://"


def test_init_kwargs_exports_slurm_values_for_env_init(monkeypatch):
    environ = {**SRUN, "MASTER_ADDR": "keep-me"}
    monkeypatch.setattr(os, "environ", environ)
    kwargs = runtime.init_kwargs(timeout=12)
    assert (kwargs["init_method"], kwargs["rank"], kwargs["world_size"]) == ("env://", 5, 8)
    assert kwargs["timeout"] == datetime.timedelta(seconds=12)
    assert {k: environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                    "LOCAL_RANK")} == {
        "MASTER_ADDR": "keep-me", "MASTER_PORT": "13456", "RANK": "5", "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
    }


def test_init_kwargs_without_launcher_is_a_local_one_process_group(monkeypatch):
    environ: dict = {}
    monkeypatch.setattr(os, "environ", environ)
    kwargs = runtime.init_kwargs()
    assert isinstance(kwargs.pop("store"), torch.distributed.HashStore)
    assert kwargs == {"backend": runtime.choose_backend(), "rank": 0, "world_size": 1,
                      "timeout": datetime.timedelta(seconds=1800)}
    assert "RANK" not in environ and "MASTER_PORT" not in environ
    assert environ.get("GLOO_SOCKET_IFNAME") == runtime._loopback_ifname()


def test_init_kwargs_keeps_a_user_interface_choice(monkeypatch):
    monkeypatch.setattr(os, "environ", {"GLOO_SOCKET_IFNAME": "eth7"})
    runtime.init_kwargs()
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"


def test_init_kwargs_single_task_srun_needs_no_port(monkeypatch):
    monkeypatch.setattr(os, "environ", {**SRUN, "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
                                        "SLURM_STEP_NUM_TASKS": "1"})
    assert "store" in runtime.init_kwargs()


@pytest.mark.parametrize(
    "value, seconds", [("30", 30), ("0.5", 0.5), (" 7200 ", 7200)]
)
def test_init_timeout_from_env(monkeypatch, value, seconds):
    monkeypatch.setattr(os, "environ", {"DISTIFY_INIT_TIMEOUT": value})
    assert runtime.init_kwargs()["timeout"] == datetime.timedelta(seconds=seconds)
    assert runtime.init_kwargs(timeout=3)["timeout"] == datetime.timedelta(seconds=3)


@pytest.mark.parametrize("value", ["soon", "0", "-3", "inf", "nan"])
def test_bad_init_timeout(monkeypatch, value):
    monkeypatch.setattr(os, "environ", {"DISTIFY_INIT_TIMEOUT": value})
    with pytest.raises(SystemExit) as info:
        runtime.init_kwargs()
    assert info.value.code == (
        f"distify: DISTIFY_INIT_TIMEOUT={value!r} is not a positive number of seconds"
    )


def test_init_kwargs_turns_env_errors_into_one_line_exit(monkeypatch):
    monkeypatch.setattr(os, "environ", {"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(SystemExit) as info:
        runtime.init_kwargs()
    assert info.value.code == "distify: RANK=2 is not below WORLD_SIZE=2"
    assert info.value.__cause__ is None and info.value.__suppress_context__


# ----------------------------------------------------------------------- device / helpers


@pytest.fixture
def fresh_device_cache(monkeypatch):
    monkeypatch.setattr(runtime, "_device_cache", {})


def test_device_on_cpu(monkeypatch, fresh_device_cache, no_accelerator_api):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.device() == torch.device("cpu")
    assert runtime.device_ids() is None


def test_device_on_cpu_with_the_accelerator_api(monkeypatch, fresh_device_cache, fake_accelerator):
    fake_accelerator("cuda", 0)
    assert runtime.device() == torch.device("cpu")
    assert runtime.device_ids() is None


@pytest.mark.parametrize("kind", ["cuda", "xpu"])
@pytest.mark.parametrize("old_spelling", [False, True])
def test_device_picks_the_local_ranks_accelerator(monkeypatch, fresh_device_cache, fake_accelerator, kind, old_spelling):
    fake = fake_accelerator(kind, 2, old_spelling)
    monkeypatch.setattr(os, "environ", dict(TORCHRUN))
    assert runtime.device() == torch.device(kind, 1)
    assert fake.current == 1
    assert runtime.device_ids() == [1]
    assert runtime.device(enabled=False) == torch.device("cpu")
    assert runtime.device_ids() is None  # follows the device picked last


def test_device_with_too_few_accelerators(monkeypatch, fresh_device_cache, fake_accelerator):
    fake = fake_accelerator("xpu", 2)
    monkeypatch.setattr(os, "environ", {**TORCHRUN, "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"})
    with pytest.raises(SystemExit) as info:
        runtime.device()
    assert info.value.code == "distify: LOCAL_RANK=3 but only 2 XPU devices are visible"
    assert fake.current is None


def test_horovod_scripts_stay_on_cuda(monkeypatch, fresh_device_cache, fake_accelerator):
    """Horovod reduces CPU and CUDA tensors only: a script that imported horovod.torch never gets
    another accelerator's device."""
    fake_accelerator("xpu", 2)
    monkeypatch.setitem(sys.modules, "horovod.torch", types.SimpleNamespace(is_initialized=lambda: False))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.device() == torch.device("cpu")


def test_device_picks_local_rank_gpu(monkeypatch, fresh_device_cache, no_accelerator_api):
    calls = []
    monkeypatch.setattr(os, "environ", dict(TORCHRUN))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    assert runtime.device() == torch.device("cuda", 1)
    assert runtime.device_ids() == [1]
    assert runtime.device() is runtime.device()  # cached
    assert calls == [1]
    assert runtime.device(enabled=False) == torch.device("cpu")


def test_device_with_too_few_gpus(monkeypatch, fresh_device_cache, no_accelerator_api):
    monkeypatch.setattr(os, "environ", {**TORCHRUN, "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: pytest.fail("must not set a device"))
    with pytest.raises(SystemExit) as info:
        runtime.device()
    assert info.value.code == "distify: LOCAL_RANK=3 but only 2 CUDA devices are visible"


def test_rank_helpers_without_group_read_the_environment(monkeypatch):
    monkeypatch.setattr(os, "environ", dict(KUBEFLOW))
    assert (runtime.rank(), runtime.world_size(), runtime.local_rank()) == (2, 3, 0)
    assert runtime.is_main_process() is False
    monkeypatch.setattr(os, "environ", {})
    assert (runtime.rank(), runtime.world_size(), runtime.is_main_process()) == (0, 1, True)
    runtime.barrier()  # no group, no horovod: a no-op


def test_all_reduce_single_process_keeps_kinds():
    assert not torch.distributed.is_initialized()
    assert runtime.all_reduce(3) == 3 and type(runtime.all_reduce(3)) is int
    assert runtime.all_reduce(3, "max") == 3 and type(runtime.all_reduce(3, "min")) is int
    assert runtime.all_reduce(3, "mean") == 3.0 and type(runtime.all_reduce(3, "mean")) is float
    assert type(runtime.reduce_mean(2.5)) is float and runtime.reduce_mean(2.5) == 2.5
    src = torch.tensor([1.0, 2.0], requires_grad=True)
    out = runtime.all_reduce(src)
    assert out is not src and torch.equal(out, src.detach()) and not out.requires_grad
    out.add_(1)
    assert src.tolist() == [1.0, 2.0]
    assert runtime.reduce_mean(torch.tensor([1, 2])).dtype == torch.float64
    with pytest.raises(ValueError):
        runtime.all_reduce(1, "avg")
    with pytest.raises(TypeError):
        runtime.all_reduce("1")


class _FakeHorovod(types.ModuleType):
    """Stands in for an initialised ``horovod.torch`` of rank 1 in a world of 4 identical ranks."""

    Sum, Max, Min = "Sum", "Max", "Min"

    def __init__(self, initialised=True):
        super().__init__("horovod.torch")
        self.initialised, self.calls = initialised, []

    def is_initialized(self):
        return self.initialised

    def rank(self):
        return 1

    def size(self):
        return 4

    def local_rank(self):
        return 1

    def barrier(self):
        self.calls.append("barrier")

    def allreduce(self, tensor, op):
        self.calls.append(op)
        return tensor * 4 if op == self.Sum else tensor.clone()


def test_horovod_is_used_only_when_initialised(monkeypatch):
    monkeypatch.setattr(os, "environ", {})
    hvd = _FakeHorovod(initialised=False)
    monkeypatch.setitem(sys.modules, "horovod.torch", hvd)
    assert (runtime.rank(), runtime.world_size(), runtime.all_reduce(2)) == (0, 1, 2)
    hvd.initialised = True
    assert (runtime.rank(), runtime.world_size(), runtime.local_rank()) == (1, 4, 1)
    assert runtime.is_main_process() is False
    assert runtime.all_reduce(2) == 8 and type(runtime.all_reduce(2)) is int
    assert runtime.all_reduce(3, "mean") == 3.0
    assert runtime.all_reduce(1.5, "max") == 1.5
    src = torch.tensor([1.0])
    assert runtime.all_reduce(src).tolist() == [4.0] and src.tolist() == [1.0]
    runtime.barrier()
    assert hvd.calls[-1] == "barrier" and "Max" in hvd.calls


def test_unwrap_in_process():
    class OptimizedModule(torch.nn.Module):  # what torch.compile returns, by name and attribute
        def __init__(self, inner):
            super().__init__()
            self._orig_mod = inner

    inner = torch.nn.Linear(2, 2)
    assert runtime.unwrap(inner) is inner
    assert runtime.unwrap(torch.nn.DataParallel(inner)) is inner
    assert runtime.unwrap(OptimizedModule(torch.nn.DataParallel(inner))) is inner
    assert runtime.unwrap(42) == 42


def test_cleanup_without_group_is_a_noop():
    runtime.cleanup()
    runtime.cleanup()


# ------------------------------------------------------ a real gloo group in a subprocess

_CHILD = textwrap.dedent(
    """
    import atexit, ipaddress, json, os, sys
    import psutil, torch
    import torch.distributed as dist

    report = {}
    # registered before init_kwargs registers cleanup, so it runs AFTER it (atexit is LIFO)
    atexit.register(lambda: print("AFTER-CLEANUP initialized=%s" % dist.is_initialized(), flush=True))

    from distify import runtime
    dist.init_process_group(**runtime.init_kwargs())
    report["backend"] = dist.get_backend()
    report["listening"] = sorted(
        c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    )
    report["non_loopback"] = [ip for ip in report["listening"]
                              if not ipaddress.ip_address(ip).is_loopback]
    report["gloo_ifname"] = os.environ.get("GLOO_SOCKET_IFNAME")
    report["rank"], report["world"] = runtime.rank(), runtime.world_size()
    report["local"], report["main"] = runtime.local_rank(), runtime.is_main_process()
    report["sum"] = runtime.all_reduce(5)
    report["mean"] = runtime.reduce_mean(3)
    report["max"] = runtime.all_reduce(2.5, "max")
    t = torch.tensor([1.0, 2.0])
    out = runtime.all_reduce(t)
    report["tensor"], report["same_object"] = out.tolist(), out is t
    report["device"], report["device_ids"] = str(runtime.device()), runtime.device_ids()
    lin = torch.nn.Linear(2, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(lin, device_ids=runtime.device_ids())
    report["unwrap_ddp"] = runtime.unwrap(ddp) is lin
    report["unwrap_compiled_ddp"] = runtime.unwrap(torch.compile(ddp)) is lin
    runtime.barrier()
    report["horovod_imported"] = any(m.startswith("horovod") for m in sys.modules)
    print("REPORT " + json.dumps(report), flush=True)
    # no destroy_process_group: the atexit cleanup must do it and exit promptly
    """
)


def _run_child(env, code=_CHILD, timeout=120):
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_fallback_group_really_works_and_binds_loopback_only(launcher_free_env):
    proc = _run_child(launcher_free_env)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT "))
    report = json.loads(line[len("REPORT "):])
    assert report["backend"] == "gloo"
    assert report["non_loopback"] == [], report["listening"]
    assert report["gloo_ifname"] == runtime._loopback_ifname()
    assert (report["rank"], report["world"], report["local"], report["main"]) == (0, 1, 0, True)
    assert (report["sum"], report["mean"], report["max"]) == (5, 3.0, 2.5)
    assert report["tensor"] == [1.0, 2.0] and report["same_object"] is False
    assert (report["device"], report["device_ids"]) == ("cpu", None)
    assert report["unwrap_ddp"] and report["unwrap_compiled_ddp"]
    assert report["horovod_imported"] is False
    assert "AFTER-CLEANUP initialized=False" in proc.stdout, proc.stdout


def test_env_error_is_one_line_for_the_user(launcher_free_env):
    env = {**launcher_free_env, "RANK": "2", "WORLD_SIZE": "2"}
    code = ("import torch.distributed as dist\nfrom distify import runtime\n"
            "dist.init_process_group(**runtime.init_kwargs())\n")
    proc = _run_child(env, code, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == "distify: RANK=2 is not below WORLD_SIZE=2\n"


def test_cleanup_never_hangs_the_exit(launcher_free_env):
    """A wedged destroy_process_group (dead peer, stuck NCCL) must not keep a finished script
    alive: cleanup joins its daemon thread for a bounded time, and a second call returns at once."""
    code = textwrap.dedent(
        """
        import time, torch.distributed as dist
        from distify import runtime
        dist.init_process_group(**runtime.init_kwargs())
        dist.destroy_process_group = lambda *a, **k: time.sleep(600)
        runtime.CLEANUP_JOIN_S = 0.5
        t0 = time.monotonic(); runtime.cleanup(); first = time.monotonic() - t0
        t0 = time.monotonic(); runtime.cleanup(); second = time.monotonic() - t0
        print("TIMES %.2f %.2f" % (first, second), flush=True)
        """
    )
    proc = _run_child(launcher_free_env, code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, second = map(float, proc.stdout.split("TIMES ")[1].split())
    assert 0.4 <= first < 5 and second < 0.2


def test_one_process_exit_skips_the_object_scan(launcher_free_env):
    """A plain `python train.py` run (a group of one) destroys its group at exit without scanning
    every live object or forcing a collection (~0.2 s once an optimizer has loaded torch._dynamo):
    only ranks with peers need DDP wrappers released first. The exit is still clean with a DDP
    model alive at module level, and the group is gone before later atexit handlers run."""
    code = textwrap.dedent(
        """
        import atexit, gc, torch
        import torch.distributed as dist
        calls = []
        # registered before init_kwargs registers cleanup, so they run AFTER it (atexit is LIFO)
        atexit.register(lambda: print("GC-CALLS %s" % ",".join(calls), flush=True))
        atexit.register(lambda: print("AFTER-CLEANUP initialized=%s" % dist.is_initialized(), flush=True))
        from distify import runtime
        dist.init_process_group(**runtime.init_kwargs())
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        model(torch.ones(2, 4)).sum().backward()
        real_get_objects, real_collect = gc.get_objects, gc.collect
        gc.get_objects = lambda *a, **k: calls.append("get_objects") or real_get_objects(*a, **k)
        gc.collect = lambda *a, **k: calls.append("collect") or real_collect(*a, **k)
        """
    )
    proc = _run_child(launcher_free_env, code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "terminate called" not in proc.stderr
    assert "GC-CALLS \n" in proc.stdout, proc.stdout
    assert "AFTER-CLEANUP initialized=False" in proc.stdout, proc.stdout


# ---------------------------------------------------------------- import purity and cost


def test_import_is_torch_only_and_cheap(launcher_free_env):
    probe = ("import sys, distify.runtime\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & "
             "{'libcst', 'typer', 'rich', 'click', 'horovod'}))")
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", probe],
                          env=launcher_free_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "distify.runtime" in imported and "torch" in imported
    assert not {m for m in imported if m.split(".")[0] in {"libcst", "typer", "rich"}}

    # the cost on top of torch: cumulative time of the top-level distify.runtime import
    # (torch imported first). Goal 50 ms (measured in bench/); generous here for noisy CI.
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import torch; import distify.runtime"],
        env=launcher_free_env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    overhead_us = None
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s*\d+ \|\s*(\d+) \| distify(\.runtime)?$", line)
        if m:
            overhead_us = (overhead_us or 0) + int(m.group(1))
    assert overhead_us is not None, proc.stderr[-2000:]
    print(f"distify.runtime import overhead over torch: {overhead_us / 1000:.1f} ms")
    assert overhead_us < 300_000


# --- shard_loader: a loader built elsewhere, re-sharded where the script binds it ----------------


def _indices(loader):
    out = []
    for batch in loader:
        values = batch[0] if isinstance(batch, (list, tuple)) else batch
        out += [int(v) for v in values.reshape(-1)]
    return out


def test_shard_loader_keeps_every_argument_and_splits_the_data():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from distify import runtime

    ds = TensorDataset(torch.arange(12))
    g = torch.Generator()
    g.manual_seed(5)

    def collate(batch):
        return torch.utils.data.default_collate(batch)

    def init_worker(worker_id):
        pass

    original = DataLoader(ds, batch_size=2, shuffle=True, drop_last=True, collate_fn=collate,
                          worker_init_fn=init_worker, generator=g, timeout=0, pin_memory=False)
    shards = [runtime.shard_loader(original, num_replicas=2, rank=r) for r in (0, 1)]
    for s in shards:
        assert type(s.sampler).__name__ == "DistributedSampler" and s.sampler.shuffle and s.sampler.seed == 5
        assert (s.batch_size, s.drop_last, s.collate_fn, s.worker_init_fn, s.generator) == (
            2, True, collate, init_worker, g)
    a, b = (_indices(s) for s in shards)
    assert len(a) == len(b) == 6 and sorted(a + b) == list(range(12))  # 3 batches of 2 each, disjoint
    shards[0].sampler.set_epoch(1)
    assert _indices(shards[0]) != a  # a new epoch, a new order
    assert runtime.shard_loader(shards[0]) is shards[0]  # already sharded: unchanged


def test_shard_loader_in_one_process_reads_what_the_original_reads():
    """Plain `python`: a world of one; a loader that did not shuffle reads the same batches."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from distify import runtime

    ds = TensorDataset(torch.arange(7))
    original = DataLoader(ds, batch_size=3)
    one = runtime.shard_loader(original)
    assert [b[0].tolist() for b in one] == [b[0].tolist() for b in original]
    unbatched = DataLoader(ds, batch_size=None)
    assert [int(x[0]) for x in runtime.shard_loader(unbatched)] == list(range(7))


def _wrap_loader_init(monkeypatch):
    """DataLoader.__init__ replaced by a plain (*args, **kwargs) wrapper, as a profiler or a test
    spy does: its signature names no argument."""
    from torch.utils.data import DataLoader

    real = DataLoader.__init__

    def __init__(self, *args, **kwargs):
        real(self, *args, **kwargs)

    monkeypatch.setattr(DataLoader, "__init__", __init__)


def test_shard_loader_keeps_the_batch_size_when_dataloader_init_is_wrapped(monkeypatch):
    """Found by the e2e loader spy: the wrapped signature made shard_loader drop batch_size, so each
    rank trained one sample at a time. Control: with the wrapper, the old signature filter keeps
    nothing (the assertion on the filter below)."""
    import inspect

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from distify import runtime

    _wrap_loader_init(monkeypatch)
    assert "batch_size" not in inspect.signature(DataLoader.__init__).parameters  # the control's premise
    original = DataLoader(TensorDataset(torch.arange(12)), batch_size=3, shuffle=True, drop_last=True)
    shard = runtime.shard_loader(original, num_replicas=2, rank=0)
    assert (shard.batch_size, shard.drop_last, len(shard)) == (3, True, 2)


def test_shard_loader_refuses_what_a_sampler_cannot_split():
    import torch
    from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler, TensorDataset

    from distify import runtime

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    class MyLoader(DataLoader):
        pass

    ds = TensorDataset(torch.arange(8))
    cases = {
        "expected a torch DataLoader": [1, 2, 3],
        "IterableDataset": DataLoader(Stream()),
        "DataLoader subclass": MyLoader(ds),
        "custom sampler": DataLoader(ds, sampler=[3, 2, 1]),
        "custom batch_sampler": DataLoader(ds, batch_sampler=[[0, 1], [2, 3]]),
        "replacement": DataLoader(ds, sampler=RandomSampler(ds, replacement=True)),
    }
    for message, loader in cases.items():
        with pytest.raises((TypeError, ValueError), match=message):
            runtime.shard_loader(loader, num_replicas=2, rank=0)
    # a BatchSampler over a sequential sampler passed explicitly is the default batching: accepted
    plain = DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 4, False))
    assert _indices(runtime.shard_loader(plain, num_replicas=2, rank=1)) == [1, 3, 5, 7]
