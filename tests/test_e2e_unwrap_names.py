"""Executed: what a script reads off the model by name, or through its own unwrap idiom, after the
wrap or the shard.

- fixtures/DST307/unwrap_alias_save: ``model_to_save = model.module if hasattr(model, "module")
  else model`` and ``getattr(model, "module", model)`` before a save. Under DDP the alias is the
  plain module; under FSDP, which shards in place, it is the sharded model, whose full state DST307
  now gathers. Both files must load strictly into the bare model in a fresh process with the
  original's weights at twice the batch (torchrun for ddp and fsdp, horovodrun for horovod).
  Control (fsdp): the old output (the aliases' own state_dict(), DTensor shards) does not load.
- fixtures/DST102/named_parameters_save: ``{name: p.detach().clone() for name, p in
  model.named_parameters() if p.requires_grad}`` saved. On the DDP wrapper every name gains
  ``module.``: the file must hold the original's names and weights. Control (ddp): the old output
  (the wrapper's named_parameters) writes ``module.`` names. FSDP refuses the file (DST922: the
  values are DTensor shards), checked in the fixtures.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import REPO_ROOT, assert_same_weights, executed, load_state, migrate, same_on_every_rank  # noqa: E402
from test_e2e_instance_attribute import _bare_loads, _checked, _original, _ranks  # noqa: E402

pytestmark = pytest.mark.e2e

ALIAS = REPO_ROOT / "fixtures" / "DST307" / "unwrap_alias_save.in.py"
NAMED = REPO_ROOT / "fixtures" / "DST102" / "named_parameters_save.in.py"
FILES = ["final.pt", "raw.pt"]


@pytest.mark.parametrize("backend", [executed("DST307/unwrap_alias_save", b, b, id=b) for b in ("ddp", "fsdp", "horovod")])
def test_a_wrapper_agnostic_unwrap_saves_the_whole_model(backend, tmp_path):
    script = tmp_path / "script" / "train.py"
    migrate(ALIAS, script, backend=backend)
    text = script.read_text()
    original = _original(tmp_path, ALIAS, [])
    _, ranks = _ranks(script, tmp_path / "run", backend, ALIAS, [])
    assert same_on_every_rank(ranks), "the ranks ended with different parameters"
    _checked(ALIAS, FILES, original, tmp_path / "run")
    if backend != "fsdp":
        return
    old = text
    for new, was in (("torch.save(model_to_save_state, ", "torch.save(model_to_save.state_dict(), "),
                     ("torch.save(raw_state, ", "torch.save(raw.state_dict(), ")):
        assert new in old, text
        old = old.replace(new, was)
    control = tmp_path / "script" / "old.py"
    control.write_text(old)
    _ranks(control, tmp_path / "control", backend, ALIAS, [])
    loads = _bare_loads(ALIAS, tmp_path / "control", FILES)
    assert not any(loads[f]["loaded"] for f in FILES), f"control: the shards' files load: {loads}"


@pytest.mark.parametrize("backend", [executed("DST102/named_parameters_save", b, b, id=b) for b in ("ddp", "horovod")])
def test_parameters_saved_by_name_keep_the_original_names(backend, tmp_path):
    script = tmp_path / "script" / "train.py"
    migrate(NAMED, script, backend=backend)
    text = script.read_text()
    original = _original(tmp_path, NAMED, [])["head.pt"]
    assert sorted(original) == ["head.bias", "head.weight"]
    _, ranks = _ranks(script, tmp_path / "run", backend, NAMED, [])
    assert same_on_every_rank(ranks), "the ranks ended with different parameters"
    saved = load_state(tmp_path / "run" / "head.pt")
    assert sorted(saved) == sorted(original), sorted(saved)
    assert_same_weights(original, saved, atol=1e-5, label=f"{backend}: head.pt, 2 ranks x 8 vs batch 16")
    if backend != "ddp":
        return
    control = tmp_path / "script" / "old.py"
    assert "model.module.named_parameters()" in text
    control.write_text(text.replace("model.module.named_parameters()", "model.named_parameters()"))
    _ranks(control, tmp_path / "control", backend, NAMED, [])
    assert sorted(load_state(tmp_path / "control" / "head.pt")) == ["module.head.bias", "module.head.weight"]
