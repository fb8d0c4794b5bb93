"""DST308 under FSDP: a checkpoint load under a test that may answer differently on another host
(``os.path.isfile``) takes rank 0's answer, so every rank runs ``set_model_state_dict`` for its
shards or none does (tests/test_e2e_fsdp_resume.py runs it). Control: a load under a test that is
the same on every rank is left as it is."""
from __future__ import annotations

from pathlib import Path

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
