"""DST308 under FSDP: a checkpoint load under a test that may answer differently on another host
(``os.path.isfile``) takes rank 0's answer, so every rank runs ``set_model_state_dict`` for its
shards or none does (tests/test_e2e_fsdp_resume.py runs it). Control: a load under a test that is
the same on every rank is left as it is."""
from __future__ import annotations

from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.rules.base import Options

SOURCE = (Path(__file__).resolve().parent.parent / "fixtures" / "DST308" / "resume_args_epoch.in.py").read_text()
HOST = "        if os.path.isfile(args.resume):\n"


def _fsdp(source: str) -> str:
    return migrate_source(source.encode(), Options(backend="fsdp")).output.decode()


def test_a_host_dependent_load_takes_rank_0s_answer():
    out = _fsdp(SOURCE)
    assert "        if runtime.broadcast_object(os.path.isfile(args.resume)):\n" in out
    assert _fsdp(out) == out  # a second run adds nothing


def test_a_load_under_a_test_every_rank_shares_is_left_alone():
    # control: the same load under a comparison of an argument, the same on every rank
    out = _fsdp(SOURCE.replace(HOST, "        if args.start_epoch == 0:\n"))
    assert "set_model_state_dict(" in out and "runtime.broadcast_object(" not in out


def test_a_resume_that_binds_no_value_is_broadcast_once_in_two_runs():
    """DDP: when the load binds no value read later (no `start_epoch = broadcast_object(...)` line
    after it), the last statement distify adds is the optimizer's own broadcast,
    `optimizer.load_state_dict(runtime.broadcast_object(...))`, which a second run took for a load
    still to follow and broadcast again (found by the fuzz sweep with the epoch lines deleted).
    Control: without `resume.broadcasts` skipping it, the second run adds the block again."""
    source = SOURCE
    for line in ('            args.start_epoch = checkpoint["epoch"]\n', '            best_acc1 = checkpoint["best_acc1"]\n',
                 "        best_acc1 = max(acc1, best_acc1)\n"):
        assert line in source
        source = source.replace(line, "")
    once = migrate_source(source.encode(), Options(backend="ddp")).output.decode()
    assert once.count("runtime.broadcast_object(optimizer.state_dict())") == 1, once
    assert migrate_source(once.encode(), Options(backend="ddp")).output.decode() == once


# A load the script runs on rank 0 only (`if rank == 0 and args.resume:`): every rank must end with
# what it loaded (the single process is rank 0). Controls: the same load under a test every rank
# shares (`if args.resume:`), which every rank runs.
RANK0 = (Path(__file__).resolve().parent.parent / "fixtures" / "DST308" / "rank0_load_after_wrap.in.py").read_text()
BEFORE_SHARD = (Path(__file__).resolve().parent.parent / "fixtures" / "DST308" / "rank0_load_before_shard.in.py").read_text()
SHARED = {"if rank == 0 and args.resume:": "if args.resume:",
          'if rank == 0 and os.path.exists("pretrained.pt"):': "if True:"}


def _shared(source: str) -> str:
    for old, new in SHARED.items():
        source = source.replace(old, new)
    return source


def _run(source: str, backend: str):
    return migrate_source(source.encode(), Options(backend=backend))


def test_fsdp_refuses_a_load_on_rank0_only_after_the_shard():
    result = _run(RANK0, "fsdp")
    assert result.refused and any(f.code == "DST308" for f in result.findings)
    control = _run(_shared(RANK0), "fsdp")
    assert not control.refused and "set_model_state_dict(model, " in control.output.decode()


def test_fsdp_broadcasts_a_load_on_rank0_only_before_the_shard():
    """Before the shard the load is a plain load_state_dict on rank 0; rank 0's weights are then
    broadcast, right above fully_shard (tests/test_e2e_fsdp_rank0_load.py runs it). Control: the
    same load on every rank gets no broadcast."""
    out = _run(BEFORE_SHARD, "fsdp").output.decode()
    assert "runtime.broadcast_module(model)\nfully_shard(model)\n" in out, out
    control = _run(_shared(BEFORE_SHARD), "fsdp").output.decode()
    assert "model.load_state_dict(" in control and "runtime.broadcast_module(" not in control


STATE = "optimizer.load_state_dict(runtime.broadcast_object(optimizer.state_dict()))\n"


def test_ddp_and_horovod_hand_rank0s_load_to_every_rank():
    out = _run(RANK0, "ddp").output.decode()
    assert "\nruntime.broadcast_module(model)\n" in out and "start_epoch = runtime.broadcast_object(start_epoch)" in out
    assert "runtime.broadcast_module(" not in _run(_shared(RANK0), "ddp").output.decode()  # control
    out = _run(RANK0, "horovod").output.decode()
    assert f"\n{STATE}" in out, out
    control = _run(_shared(RANK0), "horovod").output.decode()
    assert f"if args.resume:\n    {STATE}" in control, control


# DST112 broadcasts rank 0's optimizer state dict under the load's own tests when the load surely ran
# wherever they hold (distify.resume.sure_under), and otherwise always (a fresh state dict loaded
# changes nothing; Horovod's broadcast_optimizer_state, which would give an empty optimizer a
# zero-gradient step, is not used), before the parameters.
LOADS = '''\
import os
import argparse
import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--resume", default="")
parser.add_argument("--optim", action="store_true")
args = parser.parse_args()


def restore(path, model, optimizer):
    ckpt = torch.load(path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])


model = nn.Linear(4, 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
{load}
for epoch in range(2):
    for x in torch.randn(8, 4).split(2):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
'''
ASKED = "\n" + STATE  # unconditional: rank 0's state, loaded or fresh
LOAD = 'ckpt = torch.load(args.resume)\n    model.load_state_dict(ckpt["model"])\n    optimizer.load_state_dict(ckpt["optimizer"])'


@pytest.mark.parametrize("load,expected", [
    # under a test that may differ between hosts, nested in one every rank shares
    (f"if args.resume:\n    if os.path.isfile(args.resume):\n        {LOAD.replace(chr(10), chr(10) + '    ')}", ASKED),
    # in a try (the load may fail on every rank), in the script's own function (its tests unread)
    (f"try:\n    {LOAD}\nexcept FileNotFoundError:\n    pass", ASKED),
    ("if args.resume:\n    restore(args.resume, model, optimizer)", ASKED),
    # controls: tests every rank shares, the load on every path under them
    (f"if args.resume:\n    {LOAD}", "if args.resume:\n    " + STATE),
    (f"if args.resume:\n    if args.optim:\n        {LOAD.replace(chr(10), chr(10) + '    ')}",
     "if args.resume and args.optim:\n    " + STATE),
], ids=["nested-isfile", "try", "helper", "control-shared-test", "control-two-shared-tests"])
def test_horovod_broadcasts_a_loaded_optimizer_state_only_when_rank0_loaded_one(load, expected):
    out = _run(LOADS.replace("{load}", load), "horovod").output.decode()
    assert expected + "hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n" in out, out
