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
