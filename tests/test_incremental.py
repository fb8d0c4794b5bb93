"""Incremental migration: distify's own output gains only what a later edit is missing, and a
hand-written distributed script is never touched."""
from __future__ import annotations

import difflib
from pathlib import Path

from distify.engine import migrate_source
from distify.options import Options

SCENARIOS = Path(__file__).resolve().parent.parent / "fixtures" / "scenarios"

ADDED = '''
finetune_loader = DataLoader(dataset, batch_size=8, shuffle=True)
for epoch in range(1):
    for x, y in finetune_loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
torch.save(model.state_dict(), "finetuned.pt")
'''


def _changed_lines(before: str, after: str):
    return [l for l in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if l[:1] in "+-" and not l.startswith(("+++", "---"))]


def test_new_loader_and_save_get_only_the_missing_pieces():
    migrated = (SCENARIOS / "module_level.ddp.py").read_text()
    edited = migrated + ADDED
    out = migrate_source(edited.encode(), Options(backend="ddp")).output.decode()
    changed = _changed_lines(edited, out)
    assert changed, "the new loader and save were left as they are"
    # everything above the user's addition is untouched
    assert out.startswith(migrated)
    tail = out[len(migrated):]
    assert "finetune_sampler = DistributedSampler(dataset, shuffle=True)" in tail
    assert "sampler=finetune_sampler" in tail and "shuffle=True)\nfor" not in tail
    assert "finetune_sampler.set_epoch(epoch)" in tail
    assert "if runtime.is_main_process():\n    torch.save(model.module.state_dict(), \"finetuned.pt\")" in tail
    assert tail.count("init_process_group") == 0 and out.count("init_process_group(") == 1
    # and once more: nothing left to do
    assert migrate_source(out.encode(), Options(backend="ddp")).output.decode() == out


def test_hand_written_ddp_script_is_left_alone_even_with_unguarded_prints():
    source = (SCENARIOS / "already_ddp.in.py").read_bytes() + b'\nprint("done")\n'
    assert migrate_source(source, Options(backend="ddp")).output == source


def test_fsdp_output_gets_only_the_missing_pieces():
    """distify's FSDP2 output is recognised as such (flavour "fsdp", not "ddp" for its
    init_process_group): a later loader and save get the sampler, set_epoch and a gathered full
    state saved on rank 0; nothing is converted or wrapped in DDP."""
    migrated = (SCENARIOS / "module_level.fsdp.py").read_text()
    edited = migrated + ADDED
    out = migrate_source(edited.encode(), Options(backend="fsdp")).output.decode()
    assert out.startswith(migrated)
    tail = out[len(migrated):]
    assert "sampler=finetune_sampler" in tail and "finetune_sampler.set_epoch(epoch)" in tail
    assert "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))" in tail
    assert "DDP(" not in out and out.count("fully_shard(model)") == 1
    assert migrate_source(out.encode(), Options(backend="fsdp")).output.decode() == out


def test_hand_written_fsdp_script_is_left_alone():
    source = (SCENARIOS.parent / "DST003" / "hand_fsdp.in.py").read_bytes() + b'\nprint("done")\n'
    result = migrate_source(source, Options(backend="fsdp"))
    assert result.output == source and "already distributed" in result.note
