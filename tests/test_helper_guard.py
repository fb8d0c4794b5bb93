"""A call of a project helper that does nothing but write files or print runs on the main process
only (DST301 / DST302 guard the call where the script makes it): exact because the helper changes
nothing the other ranks read afterwards. A helper that does more (changes its argument, draws a
random number, calls code distify does not know) keeps running on every rank and the audit says so
(DST955 / DST956). Which helper qualifies comes from the program model and the library table, never
from a name."""
from __future__ import annotations

from pathlib import Path

import pytest

from distify.engine import migrate_source
from distify.options import Options

from test_helper_effects import HELPERS, SCRIPT  # keep() saves, show() prints, nested_keep() appends to a log


def _migrate(tmp_path: Path, helpers: str = HELPERS, backend: str = "ddp"):
    (tmp_path / "helpers.py").write_text(helpers)
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return migrate_source(SCRIPT.encode(), Options(backend=backend), path=str(path))


GUARD = {"ddp": "if runtime.is_main_process():", "horovod": "if hvd.rank() == 0:"}


@pytest.mark.parametrize("backend", ["ddp", "horovod"])
def test_a_helper_that_only_writes_or_prints_runs_on_the_main_process(tmp_path, backend):
    result = _migrate(tmp_path, backend=backend)
    out = result.output.decode()
    assert f'        {GUARD[backend]}\n            keep({{"m": ' in out, out
    assert '"ck.pt")\n            show(epoch)\n' in out, out  # the neighbouring guards merged into one
    assert "        quiet(epoch)\n" in out  # writes and prints nothing: left to every rank
    codes = {(f.line, f.code) for f in result.findings}
    assert {(15, "DST301"), (16, "DST302")} <= codes
    if backend == "horovod":  # through with_log(): appends to a file
        assert f"        {GUARD[backend]}\n            nested_keep(" in out and (18, "DST301") in codes
        assert not {c for _, c in codes} & {"DST955", "DST956"}
    else:  # handed the DDP wrapper itself, whose state it reads: not guarded, and said
        assert "        nested_keep(model)\n" in out and (18, "DST955") in codes
        assert not {c for l, c in codes if l != 18} & {"DST955", "DST956"}


@pytest.mark.parametrize("change", [
    ("    torch.save(state, path)\n", "    torch.save(state, path)\n    state[\"saved\"] = True\n"),  # the caller's dict
    ("    torch.save(state, path)\n", "    torch.save(state, path)\n    torch.manual_seed(0)\n"),  # the RNG of one rank only
    ("    torch.save(state, path)\n", "    global LAST\n    LAST = path\n    torch.save(state, path)\n"),
])
def test_a_helper_that_does_more_than_write_is_left_to_the_audit(tmp_path, change):
    result = _migrate(tmp_path, helpers=HELPERS.replace(*change))
    assert HELPERS.replace(*change) != HELPERS
    out = result.output.decode()
    assert '        keep({"m": ' in out and "            keep(" not in out  # not guarded
    assert [f.code for f in result.findings if f.line == 15 and f.code == "DST955"], result.findings


def test_a_helper_handed_the_wrapped_model_is_not_guarded(tmp_path):
    """`keep(model, path)` saving `model.state_dict()` inside the helper would write the DDP
    wrapper's keys (`module.`) from rank 0: the call is left to every rank and DST955 says so."""
    helpers = HELPERS.replace("def keep(state, path):\n    torch.save(state, path)\n",
                              "def keep(net, path):\n    torch.save(net.state_dict(), path)\n")
    script_uses = SCRIPT.replace('keep({"m": model.state_dict()}, "ck.pt")', 'keep(model, "ck.pt")')
    (tmp_path / "helpers.py").write_text(helpers)
    (tmp_path / "train.py").write_text(script_uses)
    result = migrate_source(script_uses.encode(), Options(backend="ddp"), path=str(tmp_path / "train.py"))
    assert '        keep(model, "ck.pt")\n' in result.output.decode()
    assert (15, "DST955") in {(f.line, f.code) for f in result.findings}


def test_fsdp_refuses_a_helper_writing_the_sharded_state(tmp_path):
    result = _migrate(tmp_path, backend="fsdp")
    assert result.refused and result.output == result.source
    said = [f for f in result.findings if f.code == "DST301"]
    assert said and said[0].line == 15 and "keep() (helpers.py:3)" in said[0].message
