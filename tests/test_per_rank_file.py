"""One notion of "a per-rank file" (distify.writes.per_rank_file): the rules that put writes on rank 0
(DST301, DST304) and the audit that reports writes every rank makes (DST955) ask the same fact, so a
write the migration leaves on every rank is one the audit accepts, and the other way round. Where a
write goes decides it (its path), not what it writes: ``torch.save({"rank": rank}, "shared.pt")`` is
every rank writing one file. A tracker's log directory is a file too (DST305, DST956)."""

from __future__ import annotations

from distify.engine import migrate_source
from distify.lint import lint_source
from distify.rules.base import Options

SCRIPT = '''\
import os
import torch

local_rank = int(os.environ.get("LOCAL_RANK", 0))
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(1, 2)).sum().backward()
opt.step()
torch.save(model.state_dict(), f"rank{local_rank}.pt")
torch.save({"rank": local_rank}, "shared.pt")
with open(f"log{local_rank}.txt", "w") as fh:
    fh.write("done")
with open("shared.txt", "w") as fh:
    fh.write(str(local_rank))
'''


def _agree(source: str, kept, guarded, taken_out) -> None:
    """Migrated, `source` keeps the lines `kept` as they are and has the lines `guarded`; the audit
    accepts it; with each (guarded text -> plain text) of `taken_out` undone, the audit reports
    exactly the lines that were guarded (whose first 20 characters `taken_out` gives last)."""
    out = migrate_source(source.encode(), Options(backend="ddp")).output.decode()
    for line in (*kept, *guarded):
        assert line in out, line
    assert [f for f in lint_source(out.encode()) if f.code in ("DST955", "DST956")] == []
    unguarded = out
    for guard, plain, _ in taken_out:
        unguarded = unguarded.replace(guard, plain)
    assert unguarded != out
    lines = unguarded.splitlines()
    found = [f for f in lint_source(unguarded.encode()) if f.code in ("DST955", "DST956")]
    assert [lines[f.line - 1].lstrip()[:20] for f in found] == [start for _, _, start in taken_out]


def test_the_migration_and_the_audit_agree_on_which_files_are_per_rank():
    _agree(
        SCRIPT,
        kept=['torch.save(model.module.state_dict(), f"rank{local_rank}.pt")\n',
              'with open(f"log{local_rank}.txt", "w") as fh:\n'],
        guarded=['if runtime.is_main_process():\n    torch.save({"rank": local_rank}, "shared.pt")\n',
                 'with open("shared.txt" if runtime.is_main_process() else os.devnull, "w") as fh:\n'],
        taken_out=[('if runtime.is_main_process():\n    torch.save({"rank": local_rank}, "shared.pt")\n',
                    'torch.save({"rank": local_rank}, "shared.pt")\n', 'torch.save({"rank": '),
                   ('"shared.txt" if runtime.is_main_process() else os.devnull', '"shared.txt"', 'with open("shared.tx')],
    )


TRACKERS = '''\
import os
import torch
from torch.utils.tensorboard import SummaryWriter

local_rank = int(os.environ.get("LOCAL_RANK", 0))
own = SummaryWriter(f"runs/rank{local_rank}")
shared = SummaryWriter("runs/shared")
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(1, 2)).sum().backward()
opt.step()
own.add_scalar("loss", 1.0, 0)
shared.add_scalar("loss", 1.0, 0)
'''



def test_a_tracker_of_each_rank_s_own_directory_stays_on_every_rank():
    _agree(
        TRACKERS,
        kept=['own = SummaryWriter(f"runs/rank{local_rank}")\n', '\nown.add_scalar("loss", 1.0, 0)\n'],
        guarded=['shared = SummaryWriter("runs/shared") if runtime.is_main_process() else None\n',
                 'if runtime.is_main_process():\n    shared.add_scalar("loss", 1.0, 0)\n'],
        taken_out=[('SummaryWriter("runs/shared") if runtime.is_main_process() else None', 'SummaryWriter("runs/shared")',
                    'shared = SummaryWrit')],
    )
